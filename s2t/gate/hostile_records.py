"""Hostile legacy records, each with the field its error must name: the input of the hostile-input suite.

Every kind below is something a client can send today; each record is made from a valid feature map with one
thing wrong, so that an answer for it would be a bug and its error must name exactly that thing. Records that
look odd but are valid (an unknown category, a lone surrogate in a category, an extra attribute) are not here:
they are scored.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from s2t.backends.records.record_decoder import DEFAULT_MAX_RECORD_BYTES, MAX_FEATURES, MAX_ID_CHARS, SEQUENCE_ID_MAX
from s2t.backends.routing.routing_policy import MAX_ROUTE_CHARS
from s2t.clients.legacy_record import encode


@dataclass(frozen=True)
class Hostile:
    kind: str
    payload: bytes
    field: str  # the error names it: starts with "<field>:" (or "<field>." for "features"); "a|b": either


Features = Mapping[str, object]


def _json(features: Features, **envelope) -> bytes:
    return json.dumps({**envelope, "features": dict(features)}).encode()


def _splice(payload: bytes, text: bytes) -> bytes:
    """`text` added as the record's last member, as raw JSON (for numbers json.dumps cannot write)."""
    return payload[:-1] + b', "pad": ' + text + b"}"


def _numeric(features: Features, rng: random.Random) -> str:
    return rng.choice(sorted(k for k, v in features.items() if isinstance(v, (int, float))))


def _categorical(features: Features, rng: random.Random) -> str:
    return rng.choice(sorted(k for k, v in features.items() if isinstance(v, str)))


def _replace(features: Features, name: str, value: object) -> dict:
    return {**features, name: value}


def _without(features: Features, rng: random.Random, form: str = "json") -> tuple[bytes, str]:
    name = rng.choice(sorted(features))
    return encode({"features": {k: v for k, v in features.items() if k != name}}, form), f"features.{name}"


KINDS: Sequence[tuple[str, Callable[[Features, random.Random], tuple[bytes, str]]]] = [
    ("integer over 4300 digits in a field nobody reads",
     lambda f, r: (_splice(_json(f), b"1" * r.randint(4301, 20_000)), "payload")),
    ("negative integer over 4300 digits",
     lambda f, r: (_splice(_json(f), b"-" + b"9" * r.randint(4301, 9000)), "payload")),
    ("integer over 4300 digits as a numeric attribute",
     lambda f, r: (_json(_replace(f, (n := _numeric(f, r)), 0)).replace(
         f'"{n}": 0'.encode(), f'"{n}": '.encode() + b"7" * 5000), "payload")),
    ("number beyond float32", lambda f, r: (_json(_replace(f, (n := _numeric(f, r)), 10 ** 39)), f"features.{n}")),
    ("number beyond float64", lambda f, r: (_json(_replace(f, (n := _numeric(f, r)), 0)).replace(
        f'"{n}": 0'.encode(), f'"{n}": 1e999'.encode()), f"features.{n}")),
    ("NaN", lambda f, r: (_json(_replace(f, (n := _numeric(f, r)), float("nan"))), f"features.{n}")),
    ("Infinity", lambda f, r: (_json(_replace(f, (n := _numeric(f, r)), float("-inf"))), f"features.{n}")),
    ("string for a number", lambda f, r: (_json(_replace(f, (n := _numeric(f, r)), "12")), f"features.{n}")),
    ("boolean for a number", lambda f, r: (_json(_replace(f, (n := _numeric(f, r)), True)), f"features.{n}")),
    ("number for a category", lambda f, r: (_json(_replace(f, (n := _categorical(f, r)), 3)), f"features.{n}")),
    ("object for a category", lambda f, r: (_json(_replace(f, (n := _categorical(f, r)), {"a": [1]})),
                                            f"features.{n}")),
    ("missing attribute", _without),
    ("null attribute", lambda f, r: (_json(_replace(f, (n := r.choice(sorted(f))), None)), f"features.{n}")),
    ("features not an object", lambda f, r: (json.dumps({"features": r.choice([[1], "x", 3, True])}).encode(),
                                              "features")),
    ("features missing", lambda f, r: (json.dumps({"request_id": "r", "feature": dict(f)}).encode(), "features")),
    ("too many attributes", lambda f, r: (_json({**f, **{f"x{i}": i for i in range(MAX_FEATURES)}}), "features")),
    ("request_id too long", lambda f, r: (_json(f, request_id="r" * (MAX_ID_CHARS + r.randint(1, 5000))),
                                          "request_id")),
    ("request_id not a string", lambda f, r: (_json(f, request_id=r.choice([[1], {"a": 1}, True, 1.5])),
                                              "request_id")),
    ("stream_id not a string", lambda f, r: (_json(f, stream_id=r.choice([[1], {"a": 1}, False])), "stream_id")),
    ("not JSON", lambda f, r: (r.choice([b"<record/>", b"{", b"{'features': {}}", b"nul"]), "payload")),
    ("truncated", lambda f, r: ((p := _json(f))[:r.randrange(1, len(p) - 1)], "payload")),
    ("not UTF-8", lambda f, r: (b'{"features": "\xc3\x28"}', "payload")),
    ("not an object", lambda f, r: (json.dumps(r.choice([[], "record", 3, None])).encode(), "payload")),
    ("empty", lambda f, r: (b"", "payload")),
    ("over the size limit", lambda f, r: (_json(_replace(f, _categorical(f, r), "x" * DEFAULT_MAX_RECORD_BYTES)),
                                          "payload")),
    ("nested too deeply", lambda f, r: (b"[" * 40_000 + b"]" * 40_000, "payload")),
    ("random bytes", lambda f, r: (b"\x00" + bytes(r.randrange(256) for _ in range(r.randint(1, 300))), "payload")),
    ("protobuf with a missing attribute", lambda f, r: _without(f, r, "protobuf")),
    # Cut at a field boundary, a protobuf record is a shorter valid message: then an attribute is missing.
    ("protobuf cut short", lambda f, r: ((p := encode({"features": dict(f)}, "protobuf"))[:r.randrange(2, len(p) - 1)],
                                         "payload|features")),
]

# Valid although odd: each is scored like its plain twin (unknown categories take the out-of-vocabulary slot).
ODD_BUT_VALID: Sequence[tuple[str, Callable[[Features, random.Random], bytes]]] = [
    ("lone surrogate in a category and the request_id", lambda f, r: _json(
        _replace(f, _categorical(f, r), "\ud800"), request_id="\udfff-" + str(r.random()))),
    ("unknown category", lambda f, r: _json(_replace(f, _categorical(f, r), "castle"))),
    ("extra attribute", lambda f, r: _json({**f, "favourite_colour": "blue"})),
]

HOSTILE_SEQUENCE_IDS = (-1, -(2 ** 63), 2 ** 63, SEQUENCE_ID_MAX + 1, 10 ** 400, "7", 1.5, True, None)

# route request parameters risk_router must refuse, naming `route`.
HOSTILE_ROUTES = (1, True, "x" * (MAX_ROUTE_CHARS + 1), "/", "../..", "/etc", "risk_decision", "risk_scorer:-1",
                  "risk_scorer:" + "9" * 19, "candidate")


def hostile_records(features: Sequence[Features], count: int, rng: random.Random) -> list[Hostile]:
    """`count` hostile records, every kind in turn, each made from a random valid feature map."""
    out = []
    for i in range(count):
        kind, make = KINDS[i % len(KINDS)]
        payload, field = make(features[rng.randrange(len(features))], rng)
        out.append(Hostile(kind, payload, field))
    return out


def names_field(message: str, field: str) -> bool:
    """Whether an error message names `field` as `Hostile.field` describes it."""
    return any(message.startswith(f + ":") or (f == "features" and message.startswith("features."))
               for f in field.split("|"))
