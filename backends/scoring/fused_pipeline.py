"""The whole pipeline in one process: legacy records -> probability and decision, one ONNX Runtime run per batch.

Every step of the ensemble (decode, score, decide) is cheap next to what moving its tensors between processes
costs, so the hot path does all three here over the whole dynamic batch: one parse per record, one engine call
and one comparison per batch. Which scorer runs is configuration (`scorer_model`, `scorer_version`), so that a
publish, a promotion or a rollback changes the served version by rewriting the config; the feature spec is read
from the ONNX file itself and so always belongs to the version that is scored.

`standby_scorer_version` (the version a rollback goes back to) is loaded too and kept warm. Which of the two
answers is the live switch: a small file in the repository's control area that the rollout commands write
before they rewrite any config (`s2t/control/rollout.py`). It is read when it changes (one stat per batch), so a
rollback to the standby is in force at the next batch, without waiting for a new stub and a new session.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort

from s2t.backends.scoring.decision_policy import Thresholds, decide
from s2t.backends.records.feature_spec import (CATEGORICAL_INPUT, METADATA_KEY, NUMERIC_INPUT, PROBABILITY_OUTPUT,
                                               FeatureSpec)
from s2t.backends.runtime.model_parameters import parameter, settings_of
from s2t.backends.scoring.ort_runner import ModelConfigError, OrtSettings
from s2t.backends.records.record_decoder import RecordDecoder, RecordError, max_record_bytes_parameter
from s2t.backends.runtime.repository_layout import live_switch_file, version_numbers

SCORER_FILENAME = "model.onnx"


def _model_folder(text: str) -> str:
    if "/" in text or text.startswith("."):
        raise ValueError(f"must name a model folder, got {text!r}")
    return text


def _version_number(text: str) -> int:
    if not (text.isdigit() and int(text) > 0):
        raise ValueError(f"must be a version number or empty (the newest), got {text!r}")
    return int(text)


@dataclass(frozen=True)
class PipelineSettings:
    scorer_model: str = parameter("scorer_model", parse=_model_folder)
    # None: the newest version folder that exists
    scorer_version: int | None = parameter("scorer_version", None, parse=_version_number)
    # None: no standby
    standby_scorer_version: int | None = parameter("standby_scorer_version", None, parse=_version_number)
    thresholds: Thresholds = settings_of(Thresholds)
    max_record_bytes: int = max_record_bytes_parameter()
    ort: OrtSettings = settings_of(OrtSettings)


def scorer_path(repository: Path, settings: PipelineSettings) -> Path:
    """`<repository>/<scorer_model>/<version>/model.onnx`; the version named, or the newest folder there."""
    folder = Path(repository) / settings.scorer_model
    version = settings.scorer_version
    if version is None:
        found = version_numbers(folder)
        if not found:
            raise ModelConfigError(f"scorer {settings.scorer_model!r} has no version folder in {repository}")
        version = found[-1]
    path = folder / str(version) / SCORER_FILENAME
    if not path.is_file():
        raise ModelConfigError(f"scorer {settings.scorer_model!r} version {version}: {path} does not exist")
    return path


@dataclass(frozen=True)
class ScoredBatch:
    probability: np.ndarray  # float32 [records, 1]; a failed record's row is meaningless
    decision: np.ndarray  # object (bytes) [records, 1]
    errors: tuple[RecordError | None, ...]


class FusedPipeline:
    def __init__(self, onnx_path: Path, settings: PipelineSettings):
        self.session = ort.InferenceSession(str(onnx_path), sess_options=settings.ort.session_options(),
                                            providers=["CPUExecutionProvider"])
        metadata = self.session.get_modelmeta().custom_metadata_map
        if METADATA_KEY not in metadata:
            raise ModelConfigError(f"{onnx_path} has no {METADATA_KEY} metadata: convert it with `s2t convert`")
        self.spec = FeatureSpec.from_json(metadata[METADATA_KEY])
        self._check_signature(onnx_path)
        self.thresholds = settings.thresholds
        self._decoder = RecordDecoder(self.spec, settings.max_record_bytes)
        self._outputs = [PROBABILITY_OUTPUT]

    def _check_signature(self, onnx_path: Path) -> None:
        inputs = {i.name: i.type for i in self.session.get_inputs()}
        expected = {CATEGORICAL_INPUT: "tensor(int64)", NUMERIC_INPUT: "tensor(float)"}
        if inputs != expected:
            raise ModelConfigError(f"{onnx_path} takes {inputs}, the pipeline feeds {expected}")
        outputs = {o.name: o.type for o in self.session.get_outputs()}
        if outputs.get(PROBABILITY_OUTPUT) != "tensor(float)":
            raise ModelConfigError(f"{onnx_path} has no float {PROBABILITY_OUTPUT!r} output (it has {outputs})")

    def score(self, payloads: Sequence[bytes]) -> ScoredBatch:
        decoded = self._decoder.decode(payloads)
        # A failed record's row is all zeros (the out-of-vocabulary slots), which the scorer takes like any row:
        # scoring it with the others is cheaper than cutting it out, and its answer is its error.
        probability = self.session.run(self._outputs, {CATEGORICAL_INPUT: decoded.categorical,
                                                       NUMERIC_INPUT: decoded.numeric})[0]
        probability = np.asarray(probability, dtype=np.float32).reshape(len(payloads), 1)
        return ScoredBatch(probability, decide(probability, self.thresholds), decoded.errors)


class LiveSwitch:
    """The scorer version the rollout commands switched to (None: no switch file, or one that cannot be read)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._version: int | None = None

    def version(self) -> int | None:
        try:
            found = os.stat(self.path)
        except OSError:
            self._stamp, self._version = None, None
            return None
        stamp = (found.st_ino, found.st_mtime_ns)  # the file is replaced by a rename: a new inode each time
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._version = int(json.loads(self.path.read_text())["scorer_version"])
            except (OSError, ValueError, KeyError, TypeError):
                self._version = None
        return self._version


class WarmPipeline:
    """The configured scorer and a warm standby in one instance; the live switch picks the one that answers, and
    any version it names that is not warm here leaves the configured one answering."""

    def __init__(self, pipelines: dict[int, FusedPipeline], configured: int, switch: LiveSwitch):
        self.pipelines, self.configured, self.switch = pipelines, configured, switch

    def serving(self) -> int:
        wanted = self.switch.version()
        return wanted if wanted in self.pipelines else self.configured

    def score(self, payloads: Sequence[bytes]) -> ScoredBatch:
        return self.pipelines[self.serving()].score(payloads)


def warm_pipeline(repository: Path, settings: PipelineSettings, model_name: str) -> WarmPipeline:
    """The configured scorer and the standby, each if its folder is there (a config the live server still runs
    may name a version retired since): one of them must be."""
    wanted = [v for v in (settings.scorer_version, settings.standby_scorer_version) if v is not None]
    folder = Path(repository) / settings.scorer_model
    present = [v for v in dict.fromkeys(wanted) if (folder / str(v) / SCORER_FILENAME).is_file()]
    if settings.scorer_version is None or not present:
        present = [int(scorer_path(repository, settings).parent.name)]  # the newest folder, or the error naming it
    pipelines = {v: FusedPipeline(folder / str(v) / SCORER_FILENAME, settings) for v in present}
    return WarmPipeline(pipelines, present[0], LiveSwitch(live_switch_file(repository, model_name)))
