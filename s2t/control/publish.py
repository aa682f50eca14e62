"""Publish an artifact as the next version of a model: validate, gate on parity, move in atomically.

An ONNX file (or TensorRT engine) is checked against the config and gated on parity with the legacy model; a GGUF
file for the language model is checked in a child process (s2t/control/llm_check.py) and lands beside a copy of
the serving version's model.py, with its own settings file when one is given (backends/llm/version_settings.py).

The version folder is built in the staging area beside the repository (same filesystem, see version_store.py)
and moved into the model folder with one rename, so Triton's poller sees either no new version or a complete one.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import onnx

from s2t.backends.llm import version_settings as llm_version
from s2t.backends.records.feature_spec import FeatureSpec
from s2t.control import live_control
from s2t import triton_config
from s2t.gate import model_config, parity
from s2t.models.convert import ConversionError, read_spec
from s2t.control.version_store import VersionStore, durable_rename
from s2t.errors import GATE_REFUSED, S2TError

# The models that decode records with a feature spec of their own, which a new scorer must match.
SPEC_READERS = ("skill_adapter", "risk_router")
SPEC_FILE = Path("1") / "feature_spec.json"
RECORD_NAME = "publish.json"


class PublishError(S2TError):
    """The artifact was refused; the served version is untouched."""


class ArtifactRefused(PublishError):
    """A check the artifact must pass said no: not a valid model, not fitting the config, parity over tolerance."""

    exit_code = GATE_REFUSED


@dataclass(frozen=True)
class ParityGate:
    saved_model: Path
    data_csv: Path
    atol: float = 1e-5


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")) + [path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def is_gguf(artifact: Path) -> bool:
    return Path(artifact).suffix.lower() == ".gguf"


def validate(model_dir: Path, config, artifact: Path, gate: ParityGate | None,
             reference_cache: Path | None = None, settings: Path | None = None) -> dict:
    """Every check an artifact must pass before it may be served; returns the figures for the record."""
    if is_gguf(artifact):
        return _validate_gguf(config, artifact, settings)
    if settings is not None:
        raise PublishError("--settings is for a language model's GGUF file only")
    if config.platform == "tensorrt_plan":
        return _validate_engine(model_dir, config, artifact, gate, reference_cache)
    try:
        model = onnx.load(str(artifact))
        onnx.checker.check_model(model, full_check=True)
    except Exception as err:  # noqa: BLE001 - any load or check failure refuses the artifact
        raise ArtifactRefused(f"{artifact}: not a valid ONNX model ({str(err).strip().splitlines()[0]})") from None
    problems = model_config.check_onnx_against_config(config, artifact)
    if problems:
        raise ArtifactRefused("the artifact does not fit the model's config: " + "; ".join(problems))
    _check_adapter_spec(model_dir, model)
    figures = {}
    if gate is not None:
        report = parity.run(gate.saved_model, artifact, gate.data_csv, atol=gate.atol, reference_cache=reference_cache)
        if not report.passed:
            raise ArtifactRefused("parity gate failed:\n" + report.table())
        comparison = report.comparisons[0]
        figures = {"rows": comparison.rows, "max_abs": comparison.max_abs, "max_rel": comparison.max_rel,
                   "atol": gate.atol, "reference": str(gate.saved_model), "data": str(gate.data_csv)}
    return figures


def _validate_gguf(config, artifact: Path, settings: Path | None) -> dict:
    """The file loads in llama.cpp, renders its chat template and generates; the settings parse."""
    from s2t.control.llm_check import GgufRefused, check_gguf
    if config.backend != "python":
        raise ArtifactRefused(f"{artifact}: a GGUF file serves a python model running llama.cpp; "
                              f"{config.name} runs on {config.backend or config.platform}")
    figures = {}
    if settings is not None:
        try:
            figures["settings"] = llm_version.parse_settings(Path(settings).read_text())
        except OSError as err:
            raise PublishError(f"{settings}: {err.strerror or err}") from None
        except llm_version.VersionSettingsError as err:
            raise ArtifactRefused(f"{settings}: {err}") from None
    try:
        figures["check"] = check_gguf(artifact)
    except GgufRefused as err:
        raise ArtifactRefused(str(err)) from None
    return figures


def _check_adapter_spec(model_dir: Path, model: onnx.ModelProto) -> None:
    try:
        spec = read_spec(model)
    except ConversionError as err:
        raise PublishError(str(err)) from None
    for reader in SPEC_READERS:
        reader_spec = model_dir.parent / reader / SPEC_FILE
        if reader_spec.exists() and FeatureSpec.from_file(reader_spec) != spec:
            raise ArtifactRefused(f"the artifact's feature spec (vocabularies, feature order) differs from {reader_spec}, "
                                  f"which {reader} decodes with; publish a matching {reader} first")


def _validate_engine(model_dir: Path, config, engine: Path, gate: ParityGate | None,
                     reference_cache: Path | None) -> dict:
    """A TensorRT engine: its build report fits the config, its ONNX source is the one named, parity on the GPU."""
    from s2t.models import tensorrt_engine
    report_path = tensorrt_engine.report_path(engine)
    if not report_path.is_file():
        raise PublishError(f"{engine}: no build report {report_path.name} beside it; build with `s2t build-trt`")
    problems = model_config.check_engine_against_config(config, engine)
    if problems:
        raise ArtifactRefused("the engine does not fit the model's config: " + "; ".join(problems))
    report = json.loads(report_path.read_text())
    source = Path(report["onnx"])
    if not source.is_file() or hashlib.sha256(source.read_bytes()).hexdigest() != report["onnx_sha256"]:
        raise PublishError(f"the engine was built from {source}, which is gone or has changed since: the feature "
                           "spec it was built for cannot be checked; rebuild the engine")
    _check_adapter_spec(model_dir, onnx.load(str(source), load_external_data=False))
    figures = {"tensorrt": report["tensorrt"], "gpu": report["gpu"], "precision": report["precision"]}
    if gate is not None:
        try:
            # FP16 engines are gated at parity.FP16_ATOL, FP32 ones at the gate's tolerance.
            result = parity.run(gate.saved_model, source, gate.data_csv, atol=gate.atol,
                                reference_cache=reference_cache, engines=(engine,), localise=False)
        except tensorrt_engine.EngineBuildError as err:
            raise PublishError(f"the parity gate needs the engine's GPU: {err}") from None
        comparison = result.comparisons[-1]
        if not comparison.passed:
            raise ArtifactRefused("parity gate failed:\n" + result.table())
        figures.update({"rows": comparison.rows, "max_abs": comparison.max_abs, "max_rel": comparison.max_rel,
                        "atol": comparison.atol, "reference": str(gate.saved_model)})
    return figures


def publish(model: str, artifact: Path, repository: Path, gate: ParityGate | None, stage: bool = False,
            consumer_repositories: tuple[Path, ...] | None = None, url: str | None = None,
            key: str | None = None, settings: Path | None = None) -> int:
    """Returns the new version number once it is in place (and, with `url`, loaded by the live server).

    Plain: the new version becomes the primary at once (every consumer serves it). `stage`: it is loaded as the
    candidate and gets no primary traffic until `promote`."""
    from s2t.control.rollout import Rollout, RolloutError, default_consumer_repositories, reached
    repository, artifact = Path(repository), Path(artifact)
    if consumer_repositories is None:
        consumer_repositories = default_consumer_repositories(repository)
    rollout = Rollout(model, repository, tuple(consumer_repositories), url, key)
    store = rollout.store
    model_dir = store.model_dir(model)
    if not (model_dir / "config.pbtxt").is_file():
        raise PublishError(f"{model_dir} has no config.pbtxt; create the model's config first")
    if not artifact.is_file():
        raise PublishError(f"{artifact}: no such file")
    config = triton_config.load(model_dir)
    managed = rollout.explicit_primary()
    if stage and not managed:
        raise PublishError(f"{model}: staging needs `version_policy: {{ all: {{}} }}` (or pinned versions) in "
                           "its config (with a `latest` policy Triton serves the newest folder, so a staged version "
                           "would be primary)")
    figures = validate(model_dir, config, artifact, None if is_gguf(artifact) else gate, store.control / "reference",
                       settings)
    try:
        with rollout.step() as state:
            if stage and state.candidate is not None:
                raise PublishError(f"{model} version {state.candidate} is staged already; promote it or roll it "
                                   "back first")
            version = store.next_version(model)
            record = {"action": "stage" if stage else "publish", "model": model, "version": version,
                      "previous": state.primary if managed else max(store.served(model), default=None),
                      "artifact": str(artifact.resolve()),
                      "sha256": hashlib.sha256(artifact.read_bytes()).hexdigest(),
                      ("checks" if is_gguf(artifact) else "parity"): figures}
            rollout.begin(state, record)
            if managed and state.primary is not None:
                # Consumers that still follow "the newest version" are pinned before a newer one appears.
                rollout.point_consumers(state.primary, standby=state.previous)
            if is_gguf(artifact):
                _place_gguf(store, model, artifact, settings, version, record, state.primary)
            else:
                _place(store, model, config, artifact, version, record)
            reached("placed")
            if not managed:
                _archive_unloaded(store, model, config)
                if url:
                    live_control.apply(url, model, version, key=key)
                return version
            rollout.wait_loaded(version)
            if stage:
                state.candidate = version
            else:
                rollout.point_consumers(version, standby=state.primary)
                rollout.make_primary(state, version, clear_candidate=False)  # a staged version stays staged
            rollout.retire_drained(state)
    except RolloutError as err:
        raise PublishError(str(err)) from None
    return version


def _place(store: VersionStore, model: str, config, artifact: Path, version: int, record: dict) -> None:
    """Build the version folder in the staging area, then move it into the model folder with one rename."""
    def fill(staging: Path) -> None:
        filename = triton_config.model_filename(config)
        shutil.copyfile(artifact, staging / filename)
        if config.platform == "tensorrt_plan":
            from s2t.models.tensorrt_engine import report_path
            shutil.copyfile(report_path(artifact), report_path(staging / filename))
        _write_drift_reference(model, version, staging / filename, record)
    _build_and_move(store, model, version, record, fill)


def _place_gguf(store: VersionStore, model: str, artifact: Path, settings: Path | None, version: int,
                record: dict, serving: int | None) -> None:
    """The serving version's code (model.py and anything beside it but its own GGUF and settings), then the new
    GGUF file and settings: the new version differs from the one it replaces by what was validated only."""
    served = store.served(model)
    template = serving if serving in served else max(served, default=None)
    if template is None or not (store.model_dir(model) / str(template) / "model.py").is_file():
        raise PublishError(f"{store.model_dir(model)} has no version with a model.py to serve the GGUF file with")
    source = store.model_dir(model) / str(template)
    skipped = {llm_version.MODEL_FILE, llm_version.SETTINGS_FILE, RECORD_NAME, "__pycache__"}

    def fill(staging: Path) -> None:
        for item in sorted(source.iterdir()):
            if item.name in skipped:
                continue
            if item.is_dir():
                shutil.copytree(item, staging / item.name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(item, staging / item.name)
        shutil.copyfile(artifact, staging / llm_version.MODEL_FILE)
        if settings is not None:
            shutil.copyfile(settings, staging / llm_version.SETTINGS_FILE)
    _build_and_move(store, model, version, record, fill)


def _build_and_move(store: VersionStore, model: str, version: int, record: dict, fill) -> None:
    model_dir = store.model_dir(model)
    staging = store.staging / f"{model}-{version}-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    try:
        staging.mkdir(parents=True)
    except OSError as err:
        raise PublishError(f"cannot create the staging folder {staging} ({err.strerror or err})") from None
    try:
        fill(staging)
        (staging / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")
        _fsync_tree(staging)
        target = model_dir / str(version)
        if target.exists():
            raise PublishError(f"{target} exists already; it was not published by s2t")
        durable_rename(staging, target)
    except OSError as err:
        raise PublishError(f"staging version {version} failed ({err.strerror or err}); nothing reached "
                           f"{model_dir}, the served version is unchanged") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def _archive_unloaded(store: VersionStore, model: str, config) -> list[int]:
    """Move the folders a `latest` version policy no longer loads to the retired area (`rollback --to` restores them).

    With `latest { num_versions: N }` only N folders stay. Otherwise a rollback to the previous version would
    make Triton load the one before it at once, and the rollback would wait for that cold load.
    """
    if config.version_policy.WhichOneof("policy_choice") != "latest":
        return []
    keep = config.version_policy.latest.num_versions
    archived = store.served(model)[:-keep] if keep else []
    for version in archived:
        store.retire(model, version)
    return archived


def _write_drift_reference(model: str, version: int, model_file: Path, record: dict) -> None:
    """risk_router compares this version's live scores with its scores on the data its parity gate ran on
    (s2t/gate/drift.py); written in the staging folder, so the version arrives with it."""
    data = record.get("parity", {}).get("data")
    if data:
        from s2t.gate.drift import write_version_reference
        write_version_reference(model, version, model_file, Path(data))
