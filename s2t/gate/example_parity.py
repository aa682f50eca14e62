"""Parity for a model whose signature takes serialized tf.Example: the same Examples, built from a CSV, scored by the
SavedModel, by the converted model behind the adapter's decoding, and by the live server, row by row.

Each CSV row becomes one Example: a column named as a feature becomes that feature, a float where the feature spec
has a number and text where it has a category; an empty cell leaves the feature out (the parse default applies, or
the record is refused for it). A row whose cell cannot take its feature's type is not sent anywhere and gets an error
line; a row that a side refuses gets that side's reason. Rows refused by every side agree; a row scored by one side
and refused by another is a mismatch and fails parity.
"""
from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from s2t.backends.scoring.decision_policy import Thresholds
from s2t.backends.records.feature_spec import INTEGER, FeatureSpec, sparse_columns, value_column
from s2t.backends.records.record_decoder import RecordDecoder
from s2t.gate.parity_report import LIVE_BATCH, Comparison, ParityReport, compare
from s2t.on_progress import OnProgress, no_progress
from s2t.wire.names import PAYLOAD, PROBABILITY

# A score, or the reason the side refused the row.
Outcome = float | str
MAX_REASON_CHARS = 200
# A cell holding a sparse feature's empty list (an empty cell leaves the feature out).
EMPTY_LIST_CELL = "[]"


class RowError(ValueError):
    """A CSV cell that cannot become its feature."""


@dataclass(frozen=True)
class ExampleRow:
    number: int  # 0-based data row of the CSV, as parity reports rows
    example: bytes | None
    error: str | None = None


def example_input(onnx_model) -> str | None:
    """The name of the SavedModel input that takes serialized Examples; None for a model converted from any other
    signature."""
    from s2t.models.example_signature import EXAMPLE_INPUT_KEY
    return {p.key: p.value for p in onnx_model.metadata_props}.get(EXAMPLE_INPUT_KEY)


def example_features(cells: Mapping[str, str | None], spec: FeatureSpec) -> dict[str, object]:
    """The features of one CSV row; columns that are no feature are left out, and so are empty cells. A feature of
    several values per record is one cell holding them separated by spaces; so is a sparse feature's list, which
    `[]` leaves empty."""
    parsers = {f.name: _integer_cell if f.kind == INTEGER else _text_cell for f in spec.categorical}
    parsers.update({name: _number_cell for name in spec.numeric})
    features: dict[str, object] = {}
    for key in spec.keys:
        cell = cells.get(key)
        if not cell:
            continue
        if key in spec.sparse:
            parse = parsers[sparse_columns(key, spec.sparse[key])[0]]
            features[key] = [] if cell.strip() == EMPTY_LIST_CELL else [parse(key, part) for part in cell.split()]
            continue
        count = spec.values.get(key, 1)
        if count == 1:
            features[key] = parsers[key](key, cell)
            continue
        parts = cell.split()
        if len(parts) != count:
            raise RowError(f"column {key}: {len(parts)} values where the feature has {count} (separated by spaces)")
        features[key] = [parsers[value_column(key, i)](key, part) for i, part in enumerate(parts)]
    return features


def _text_cell(column: str, cell: str) -> str:
    return cell


def _integer_cell(column: str, cell: str) -> int:
    try:
        return int(cell)
    except ValueError:
        raise RowError(f"column {column}: {cell[:40]!r} is not an integer") from None


def _number_cell(column: str, cell: str) -> float:
    try:
        number = float(cell)
    except ValueError:
        raise RowError(f"column {column}: {cell[:40]!r} is not a number") from None
    if not math.isfinite(number) or abs(number) > float(np.finfo(np.float32).max):
        raise RowError(f"column {column}: {cell[:40]!r} is not a finite float32 number")
    return number


def serialize_example(features: Mapping[str, object]) -> bytes:
    """A tf.Example of the features, as TensorFlow serializes it: text as bytes_list, a Python int as int64_list,
    a float as float_list; a list as all its values."""
    from s2t.wire.tf_example_pb2 import Example
    example = Example()
    for name, value in features.items():
        feature = example.features.feature[name]
        for one in value if isinstance(value, list) else [value]:
            if isinstance(one, str):
                feature.bytes_list.value.append(one.encode("utf-8"))
            elif isinstance(one, int) and not isinstance(one, bool):
                feature.int64_list.value.append(one)
            else:
                feature.float_list.value.append(one)
    return example.SerializeToString(deterministic=True)


def examples_from_csv(path: Path, spec: FeatureSpec) -> list[ExampleRow]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        # A feature with a parse default may be left out of the data altogether; one without may not.
        absent = [k for k in spec.keys if k not in (reader.fieldnames or []) and k not in spec.defaults
                  and value_column(k, 0) not in spec.defaults and k not in spec.sparse]
        if absent:
            raise ValueError(f"{path} has no column for features {', '.join(absent)}")
        rows = []
        for number, cells in enumerate(reader):
            try:
                rows.append(ExampleRow(number, serialize_example(example_features(cells, spec))))
            except RowError as err:
                rows.append(ExampleRow(number, None, str(err)))
    return rows


def legacy_outcomes(saved_model: Path, input_name: str, examples: Sequence[bytes]) -> list[Outcome]:
    """The SavedModel on the serialized Examples; a batch it refuses is scored row by row, so each refused row
    carries TensorFlow's own reason."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    signature = tf.saved_model.load(str(saved_model)).signatures["serving_default"]

    def score(batch: Sequence[bytes]) -> list[float]:
        outputs = signature(**{input_name: tf.constant(list(batch), dtype=tf.string)})
        if len(outputs) != 1:
            raise ValueError(f"the SavedModel has {len(outputs)} outputs; a risk model has one")
        return next(iter(outputs.values())).numpy().ravel().astype(float).tolist()

    try:
        return score(examples) if examples else []
    except (tf.errors.InvalidArgumentError, UnicodeDecodeError):
        pass
    outcomes: list[Outcome] = []
    for example in examples:
        try:
            outcomes.append(score([example])[0])
        except tf.errors.InvalidArgumentError as err:
            outcomes.append(tensorflow_reason(err.message))
        except UnicodeDecodeError:
            # TensorFlow quotes the record's bytes in its message and fails to decode them.
            outcomes.append("refused (TensorFlow's message quotes bytes that are not UTF-8)")
    return outcomes


def tensorflow_reason(message: str) -> str:
    """The line of a TensorFlow error that says what is wrong with the input, without the node trace."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    useful = [line for line in lines
              if not line.startswith(("Graph execution error", "Detected at node", "<stack traces", "[["))]
    reason = (useful or lines or ["refused"])[-1]
    reason = reason.split(" [[")[0].strip()
    return reason[:MAX_REASON_CHARS]


def onnx_outcomes(onnx_path: Path, spec: FeatureSpec, examples: Sequence[bytes]) -> list[Outcome]:
    """The adapter's decoding (the same RecordDecoder risk_pipeline runs) and the converted graph on ONNX Runtime."""
    import onnxruntime as ort

    batch = RecordDecoder(spec).decode(list(examples))
    if not examples:
        return []
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feeds = {"categorical": batch.categorical, "numeric": batch.numeric}
    scores = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0].ravel()
    return [str(err) if err is not None else float(s) for s, err in zip(scores, batch.errors)]


def live_outcomes(url: str, model: str, examples: Sequence[bytes], protocol: str = "http",
                  on_progress: OnProgress = no_progress) -> list[Outcome]:
    """The live model on the Examples as `payload` records; a refused batch is sent again row by row, so that each
    bad record gets the server's own error for it. `on_progress` hears the rows answered after every batch."""
    if protocol == "grpc":
        import tritonclient.grpc as client
    else:
        import tritonclient.http as client
    from tritonclient.utils import InferenceServerException

    triton = client.InferenceServerClient(url)

    def score(batch: Sequence[bytes]) -> list[float]:
        payload = client.InferInput(PAYLOAD, [len(batch), 1], "BYTES")
        payload.set_data_from_numpy(np.array(list(batch), dtype=object).reshape(-1, 1))
        # No output filter: Triton 2.51 ensembles fail a request that asks for a subset of their outputs.
        return triton.infer(model, [payload]).as_numpy(PROBABILITY).ravel().astype(float).tolist()

    outcomes: list[Outcome] = []
    label = f"triton {model} ({protocol})"
    on_progress(0, len(examples), label)
    try:
        for start in range(0, len(examples), LIVE_BATCH):
            batch = examples[start:start + LIVE_BATCH]
            try:
                outcomes.extend(score(batch))
            except InferenceServerException:
                for example in batch:
                    try:
                        outcomes.extend(score([example]))
                    except InferenceServerException as err:
                        outcomes.append(str(err.message())[:MAX_REASON_CHARS])
            on_progress(len(outcomes), len(examples), label)
    finally:
        triton.close()
    return outcomes


def compare_outcomes(candidate: str, reference: Sequence[Outcome], outcomes: Sequence[Outcome],
                     rows: Sequence[int], atol: float, thresholds: Thresholds | None = None) -> Comparison:
    """`compare` over the rows some side scored (a refusal is NaN there, so it counts over tolerance), reported
    with the CSV's row numbers; rows that both sides refused agree and are left out."""
    kept = [i for i, (ref, got) in enumerate(zip(reference, outcomes))
            if not (isinstance(ref, str) and isinstance(got, str))]
    as_numbers = [np.array([math.nan if isinstance(side[i], str) else side[i] for i in kept], dtype=np.float64)
                  for side in (reference, outcomes)]
    result = compare(candidate, *as_numbers, atol, thresholds)
    number = [rows[i] for i in kept]
    return replace(result, worst_row=number[result.worst_row] if result.worst_row >= 0 else -1,
                   over_tolerance=[number[i] for i in result.over_tolerance],
                   decisions_changed=None if result.decisions_changed is None else
                   [number[i] for i in result.decisions_changed])


def row_error_lines(rows: Sequence[ExampleRow], sides: Mapping[str, Sequence[Outcome]]) -> list[str]:
    """One line per row that was not built or that some side refused, naming each side's reason."""
    lines = []
    sent = [r for r in rows if r.example is not None]
    for row in rows:
        if row.error is not None:
            lines.append(f"row {row.number}: not sent ({row.error})")
    for index, row in enumerate(sent):
        reasons = [f"{side}: {outcomes[index]}" for side, outcomes in sides.items() if isinstance(outcomes[index], str)]
        if reasons:
            lines.append(f"row {row.number}: refused by {'; '.join(reasons)}")
    return sorted(lines, key=lambda line: int(line.split(":")[0].split()[1]))


def run(saved_model: Path, onnx_path: Path, data_csv: Path, atol: float = 1e-5, url: str | None = None,
        model: str | None = None, protocol: str = "http", thresholds: Thresholds | None = None,
        on_progress: OnProgress = no_progress) -> ParityReport:
    import onnx

    from s2t.models.convert import read_spec
    converted = onnx.load(str(onnx_path), load_external_data=False)
    spec, input_name = read_spec(converted), example_input(converted)
    if input_name is None:
        raise ValueError(f"{onnx_path} was not converted from a tf.Example signature")
    rows = examples_from_csv(Path(data_csv), spec)
    sent = [r for r in rows if r.example is not None]
    examples = [r.example for r in sent]
    numbers = [r.number for r in sent]
    on_progress(0, len(examples), "legacy SavedModel")
    reference = legacy_outcomes(Path(saved_model), input_name, examples)
    on_progress(len(examples), len(examples), "legacy SavedModel")
    if not any(isinstance(score, float) for score in reference):
        raise ValueError(f"the SavedModel scored none of the {len(rows)} rows of {data_csv}: nothing to compare")
    onnx_name = f"onnxruntime {Path(onnx_path).name}"
    on_progress(0, len(examples), onnx_name)
    sides = {"legacy": reference, onnx_name: onnx_outcomes(Path(onnx_path), spec, examples)}
    on_progress(len(examples), len(examples), onnx_name)
    if url:
        sides[f"triton {model or 'risk_pipeline'} ({protocol})"] = live_outcomes(url, model or "risk_pipeline",
                                                                                examples, protocol, on_progress)
    comparisons = [compare_outcomes(name, reference, outcomes, numbers, atol, thresholds)
                   for name, outcomes in sides.items() if name != "legacy"]
    return ParityReport(f"{saved_model} (serialized tf.Example)", atol, len(rows), comparisons,
                        row_errors=row_error_lines(rows, sides))
