"""The whole pipeline in one process: legacy records -> probability and decision, one ONNX Runtime run per batch.

Every step of the ensemble (decode, score, decide) is cheap next to what moving its tensors between processes
costs, so the hot path does all three here over the whole dynamic batch: one parse per record, one engine call
and one comparison per batch. Which scorer runs is configuration (`scorer_model`, `scorer_version`), so that a
publish, a promotion or a rollback changes the served version by rewriting the config; the feature spec is read
from the ONNX file itself and so always belongs to the version that is scored.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnxruntime as ort

from backends.decision_policy import Thresholds, decide
from backends.feature_spec import CATEGORICAL_INPUT, METADATA_KEY, NUMERIC_INPUT, PROBABILITY_OUTPUT, FeatureSpec
from backends.model_parameters import string_parameter
from backends.ort_runner import ModelConfigError, OrtSettings
from backends.record_decoder import DEFAULT_MAX_RECORD_BYTES, RecordDecoder, RecordError

SCORER_FILENAME = "model.onnx"


@dataclass(frozen=True)
class PipelineSettings:
    scorer_model: str
    scorer_version: int | None  # None: the newest version folder that exists
    thresholds: Thresholds
    max_record_bytes: int
    ort: OrtSettings

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Mapping[str, str]]) -> "PipelineSettings":
        scorer_model = string_parameter(parameters, "scorer_model").strip()
        if not scorer_model or "/" in scorer_model or scorer_model.startswith("."):
            raise ModelConfigError(f"parameter scorer_model must name a model folder, got {scorer_model!r}")
        raw_version = string_parameter(parameters, "scorer_version").strip()
        if raw_version and not (raw_version.isdigit() and int(raw_version) > 0):
            raise ModelConfigError(f"parameter scorer_version must be a version number or empty (the newest), "
                                   f"got {raw_version!r}")
        raw_limit = string_parameter(parameters, "max_record_bytes", DEFAULT_MAX_RECORD_BYTES)
        if not raw_limit.isdigit() or int(raw_limit) <= 0:
            raise ModelConfigError(f"parameter max_record_bytes must be a positive integer, got {raw_limit!r}")
        try:
            thresholds = Thresholds.from_parameters(parameters)
        except ValueError as err:
            raise ModelConfigError(str(err)) from None
        return cls(scorer_model, int(raw_version) if raw_version else None, thresholds, int(raw_limit),
                   OrtSettings.from_parameters(parameters))


def scorer_path(repository: Path, settings: PipelineSettings) -> Path:
    """`<repository>/<scorer_model>/<version>/model.onnx`; the version named, or the newest folder there."""
    folder = Path(repository) / settings.scorer_model
    version = settings.scorer_version
    if version is None:
        found = sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()) \
            if folder.is_dir() else []
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
