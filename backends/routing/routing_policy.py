"""Which scorer answers a record: primary, canary candidate, forced route, or the fallback; and what to mirror.

Assignment is sticky: a record's bucket is a hash of its request_id, so a caller retrying the same request
lands on the same model, and raising the canary share only moves new buckets over.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from s2t.backends.runtime.serving_errors import InvalidInput
from s2t.backends.runtime.model_parameters import parameter

BUCKETS = 10_000
# A `route` request parameter longer than this is refused before it is looked at.
MAX_ROUTE_CHARS = 128
# Versions are folder numbers; more digits than this cannot be one (and would not fit Triton's int64).
MAX_VERSION_DIGITS = 18


@dataclass(frozen=True)
class Target:
    """A model and version; version None means the newest version the router can reach."""

    model: str
    version: int | None = None

    @classmethod
    def parse(cls, text: str) -> "Target":
        if not isinstance(text, str):
            raise ValueError(f"target {text!r}: expected text like model or model:version")
        model, _, version = text.strip().partition(":")
        if not model:
            raise ValueError(f"target {text!r}: a model name is required")
        if version and not (version.isascii() and version.isdigit() and len(version) <= MAX_VERSION_DIGITS):
            raise ValueError(f"target {text!r}: the version must be a number of at most {MAX_VERSION_DIGITS} digits")
        return cls(model, int(version) if version else None)

    def __str__(self) -> str:
        return self.model if self.version is None else f"{self.model}:{self.version}"


@dataclass(frozen=True)
class RoutingSettings:
    primary: Target = parameter("primary", parse=Target.parse)
    candidate: Target | None = parameter("candidate", None, parse=Target.parse)
    canary_percent: float = parameter("canary_percent", 0.0)
    shadow_percent: float = parameter("shadow_percent", 0.0)
    fallback: Target | None = parameter("fallback", None, parse=Target.parse)

    def __post_init__(self):
        for name in ("canary_percent", "shadow_percent"):
            value = getattr(self, name)
            if not 0.0 <= value <= 100.0:
                raise ValueError(f"{name} must be within 0..100, got {value}")
        if (self.canary_percent or self.shadow_percent) and self.candidate is None:
            raise ValueError("a canary or shadow share needs a candidate")
        if self.canary_percent and self.shadow_percent:
            raise ValueError("a candidate is either a canary (answers) or a shadow (mirrored), not both")


    @property
    def models(self) -> frozenset[str]:
        """The models this router sends records to: the only ones a `route` may name."""
        return frozenset(t.model for t in (self.primary, self.candidate, self.fallback) if t is not None)

    def describe(self) -> str:
        if self.canary_percent:
            return f"{100 - self.canary_percent:g}% {self.primary}, {self.canary_percent:g}% {self.candidate}"
        if self.shadow_percent:
            return f"100% {self.primary}, {self.shadow_percent:g}% mirrored to {self.candidate}"
        return f"100% {self.primary}"


def _key_bytes(key: str | bytes) -> bytes:
    # A JSON request_id may hold a lone surrogate ("\ud800"): it still hashes, as its own bytes.
    return key.encode("utf-8", "surrogatepass") if isinstance(key, str) else bytes(key)


def bucket(key: str | bytes) -> int:
    """A stable bucket in [0, BUCKETS): the same key always lands in the same bucket, in every process."""
    data = _key_bytes(key)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") % BUCKETS


def _share(key: str | bytes, percent: float, salt: bytes) -> bool:
    return bucket(salt + _key_bytes(key)) < percent * BUCKETS / 100


@dataclass(frozen=True)
class Route:
    target: Target
    mirror: Target | None = None


def route(settings: RoutingSettings, key: str | bytes, override: object = None) -> Route:
    """`override` (a client's `route` request parameter) colours traffic; see `route_override`."""
    if override is not None and override != "":
        return Route(route_override(settings, override))
    if settings.canary_percent and _share(key, settings.canary_percent, b"canary:"):
        return Route(settings.candidate)
    # The shadow sample is drawn independently of the canary so that the two never select the same slice.
    if settings.shadow_percent and _share(key, settings.shadow_percent, b"shadow:"):
        return Route(settings.primary, mirror=settings.candidate)
    return Route(settings.primary)


def route_override(settings: RoutingSettings, override: object) -> Target:
    """"primary", "candidate", or "model[:version]" of a model this router serves; anything else is the caller's
    InvalidInput. Checked against the settings only: client text never reaches the filesystem."""
    if isinstance(override, bool) or not isinstance(override, str):
        kind = "boolean" if isinstance(override, bool) else type(override).__name__
        raise InvalidInput(f"route: expected a string, got {kind}")
    if len(override) > MAX_ROUTE_CHARS:
        raise InvalidInput(f"route: {len(override)} characters is over the limit of {MAX_ROUTE_CHARS}")
    if override == "primary":
        return settings.primary
    if override == "candidate":
        if settings.candidate is None:
            raise InvalidInput("route: candidate, but no candidate is configured")
        return settings.candidate
    try:
        target = Target.parse(override)
    except ValueError as err:
        raise InvalidInput(f"route: {err}") from None
    if target.model not in settings.models:
        raise InvalidInput(f"route: {target.model!r} is not served here "
                           f"(primary, candidate, or one of {', '.join(sorted(settings.models))})")
    return target


def route_parameter(parameters_json: str | None) -> object:
    """The `route` request parameter as the client sent it (any JSON type, None when absent); `route` checks it."""
    try:
        return json.loads(parameters_json or "{}").get("route")
    except (ValueError, AttributeError):
        return None
