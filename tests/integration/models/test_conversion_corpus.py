"""The corpus of legacy constructs (tests/integration/legacy_corpus.py): each SavedModel built once per session,
converted (two by `s2t convert`, the rest by convert_many, the same conversion), parity-gated against TensorFlow
over 500 rows with out-of-vocabulary values and missing features; the main one published and compared live over
HTTP and gRPC, good and bad records side by side; each construct that cannot be served exactly refused in its own
words."""
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest

from s2t.gate import example_parity
from s2t.models.convert import Conversion, ConversionError, convert_many
from s2t.triton_config import decision_thresholds
from tests.conftest import MODEL_REPOSITORY, S2T
from tests.integration import legacy_corpus
from tests.integration.servers import serving, triton_server

TF_QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
ATOL = 1e-5
ROWS = 500
CONVERTED = [c.name for c in legacy_corpus.CORPUS if c.refused_with is None]
REFUSED = [c.name for c in legacy_corpus.CORPUS if c.refused_with is not None]
MAIN = next(c.name for c in legacy_corpus.CORPUS if c.main)


# Converted by the `s2t convert` command itself; the others through convert_many, the same conversion with one
# TensorFlow start for all of them.
BY_THE_COMMAND = (MAIN, REFUSED[0])


@dataclass(frozen=True)
class Outcome:
    converted: bool
    message: str  # what the user reads: the command's stderr, or the ConversionError it would print


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """Every construct's SavedModel and what the conversion made of it."""
    root = tmp_path_factory.mktemp("legacy_corpus")
    # The commands' SavedModels first: their conversions (each its own TensorFlow start) run while the others are
    # built.
    for name in BY_THE_COMMAND:
        legacy_corpus.build(legacy_corpus.BY_NAME[name], root / name)
    commands = {name: subprocess.Popen(
        [str(S2T), "convert", str(root / name), str(root / f"{name}.onnx"), *legacy_corpus.BY_NAME[name].convert_options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=TF_QUIET) for name in BY_THE_COMMAND}
    rest = [c for c in legacy_corpus.CORPUS if c.name not in BY_THE_COMMAND]
    try:
        for construct in rest:
            legacy_corpus.build(construct, root / construct.name)
        results = convert_many([Conversion(saved_model=root / c.name, output=root / f"{c.name}.onnx",
                                           max_values=c.max_values) for c in rest])
        outcomes = {c.name: Outcome(not isinstance(r, ConversionError),
                                    str(r) if isinstance(r, ConversionError) else "") for c, r in zip(rest, results)}
        for name, command in commands.items():
            _, stderr = command.communicate(timeout=900)
            outcomes[name] = Outcome(command.returncode == 0, stderr)
    finally:
        for command in commands.values():
            if command.poll() is None:
                command.kill()
                command.wait()
    return root, outcomes


def _expected_refusals(rows: list[dict[str, str]]) -> list[int]:
    return [i for i, row in enumerate(rows) if not row["age"]]


@pytest.mark.parametrize("name", CONVERTED)
def test_each_construct_converts_and_scores_as_the_saved_model_on_500_rows(corpus, name):
    root, converted = corpus
    assert converted[name].converted, converted[name].message[-3000:]
    construct = legacy_corpus.BY_NAME[name]
    rows = legacy_corpus.rows(construct, ROWS)
    data = legacy_corpus.write_csv(root / f"{name}.csv", rows)
    report = example_parity.run(root / name, root / f"{name}.onnx", data, atol=ATOL,
                                thresholds=decision_thresholds(MODEL_REPOSITORY / "risk_pipeline"))
    offline = report.comparisons[0]
    refused = _expected_refusals(rows)
    assert report.passed, report.table()
    assert offline.rows == ROWS - len(refused) and offline.max_abs <= ATOL and offline.decisions_changed == []
    # Only the rows without `age` (no parse default) are refused, by both sides, naming it.
    assert [int(line.split(":")[0].split()[1]) for line in report.row_errors] == refused
    assert all(line.endswith("features.age: missing") for line in report.row_errors)
    # Rows that leave the construct's feature out took the parse default; out-of-vocabulary rows are in the data.
    assert any(not rows[i][key] for i in range(ROWS) for key in construct.features)
    spec = report_spec(root / f"{name}.onnx")
    scored = [example_parity.serialize_example(example_parity.example_features(r, spec)) for r in rows if r["age"]]
    scores = example_parity.onnx_outcomes(root / f"{name}.onnx", spec, scored[:100])
    assert len({round(s, 6) for s in scores}) > 10, "the construct must change the score"
    # A batch in which no record carries a value of the sparse features (TensorFlow's parse gives them a width of 0
    # too) scores as the SavedModel scores it, empty lists or features left out.
    for cell in ("[]", "") if construct.max_values else ():
        empty = [example_parity.serialize_example(example_parity.example_features(
            {**r, **{key: cell for key in construct.max_values}}, spec)) for r in rows[:12] if r["age"]]
        expected = example_parity.legacy_outcomes(root / name, "examples", empty)
        assert np.allclose(example_parity.onnx_outcomes(root / f"{name}.onnx", spec, empty), expected, atol=ATOL, rtol=0)


def test_hash_buckets_are_tensorflows_bit_for_bit_on_thousands_of_strings(corpus):
    """The decoder's buckets (the spec of each hashed corpus model: FarmHash, and SipHash keyed by the salt) against
    TensorFlow's own ops on random text: empty, ASCII, accents, CJK, emoji, control characters, long strings."""
    import tensorflow as tf

    from s2t.backends.records.feature_spec import HASH
    from s2t.backends.records.string_hash import STRONG

    root, _ = corpus
    hashed = [f for name in ("keras_hashing", "keras_hashing_salted", MAIN)
              for f in report_spec(root / f"{name}.onnx").categorical if f.kind == HASH]
    assert {f.hash for f in hashed} == {"fast", "strong"}
    rng = np.random.default_rng(13)
    alphabet = list("abcXYZ09 ,\"\n\t\x00-é漢字😀\U0010ffff")
    strings = ["", " ", "car", "é", "😀", "a" * 1000] + ["".join(rng.choice(alphabet, size=int(rng.integers(0, 64))))
                                                        for _ in range(3000)]
    for feature, buckets in [(f, b) for f in hashed for b in (f.buckets, 1_000_003, 2 ** 63 - 1)]:
        probe = type(feature)(feature.name, {}, 0, HASH, buckets, feature.hash, feature.key)
        if feature.hash == STRONG:
            expected = tf.strings.to_hash_bucket_strong(strings, buckets, list(feature.key)).numpy()
        else:
            expected = tf.strings.to_hash_bucket_fast(strings, buckets).numpy()
        assert [probe.index_of(s) for s in strings] == expected.tolist(), (feature, buckets)


def report_spec(onnx_path):
    import onnx

    from s2t.models.convert import read_spec
    return read_spec(onnx.load(str(onnx_path)))


@pytest.mark.parametrize("name", REFUSED)
def test_a_construct_that_cannot_be_served_exactly_is_refused_naming_it_and_the_way_out(corpus, name):
    root, converted = corpus
    done = converted[name]
    assert not done.converted
    assert legacy_corpus.BY_NAME[name].refused_with in done.message, done.message[-3000:]
    assert "make_sure" not in done.message and "Traceback" not in done.message
    assert not (root / f"{name}.onnx").exists()


@pytest.fixture(scope="module")
def main_triton(corpus, tmp_path_factory):
    """risk_pipeline and a risk_scorer sized for the main construct model, version 1 published by `s2t publish`
    (gated on tf.Example parity); the real tritonserver on it."""
    root, converted = corpus
    assert converted[MAIN].converted, converted[MAIN].message[-3000:]
    spec = report_spec(root / f"{MAIN}.onnx")
    repository = tmp_path_factory.mktemp("corpus_repository")
    (repository / "risk_scorer").mkdir()
    config = (MODEL_REPOSITORY / "risk_scorer" / "config.pbtxt").read_text()
    (repository / "risk_scorer" / "config.pbtxt").write_text(
        config.replace("dims: [ 13 ]", f"dims: [ {len(spec.categorical)} ]")
        .replace("dims: [ 7 ]", f"dims: [ {len(spec.numeric)} ]"))
    shutil.copytree(MODEL_REPOSITORY / "risk_pipeline", repository / "risk_pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    gate = legacy_corpus.write_csv(root / "gate.csv", legacy_corpus.rows(legacy_corpus.BY_NAME[MAIN], 60, seed=11))
    done = subprocess.run([str(S2T), "publish", "risk_scorer", str(root / f"{MAIN}.onnx"), "--repository",
                           str(repository), "--saved-model", str(root / MAIN), "--data", str(gate)],
                          capture_output=True, text=True, env=TF_QUIET, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    server = triton_server([repository], log_path=root / "tritonserver.log", exit_timeout_seconds=10)
    with serving(server):
        yield server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_main_constructs_served_live_score_as_the_saved_model(corpus, main_triton, protocol):
    root, _ = corpus
    rows = legacy_corpus.rows(legacy_corpus.BY_NAME[MAIN], ROWS, seed=17)
    data = legacy_corpus.write_csv(root / f"live_{protocol}.csv", rows)
    url = main_triton.http_url if protocol == "http" else main_triton.grpc_url
    report = example_parity.run(root / MAIN, root / f"{MAIN}.onnx", data, atol=ATOL, url=url, protocol=protocol,
                                thresholds=decision_thresholds(MODEL_REPOSITORY / "risk_pipeline"))
    live = report.comparisons[1]
    assert live.candidate == f"triton risk_pipeline ({protocol})"
    assert report.passed and live.max_abs <= ATOL and live.decisions_changed == [], report.table()
    assert live.rows == ROWS - len(_expected_refusals(rows))
    assert all(line.endswith(f"triton risk_pipeline ({protocol}): features.age: missing")
               for line in report.row_errors)


BAD_BRANCHES = {  # an int64 (or hashed string) feature sent as something else: that record's error, naming it
    '"branch": 2.5': "features.branch: expected an integer, got number",
    '"branch": "101"': "features.branch: expected an integer, got string",
    '"branch": 9223372036854775808': "features.branch: 9223372036854775808 is outside the int64 range",
    '"branch": true': "features.branch: expected an integer, got boolean",
    '"branch": 7, "merchant": 5': "features.merchant: expected a string, got number",
    '"branch": 7, "merchant": ["a"]': "features.merchant: expected a string, got array",
    '"branch": 7, "merchant": "\\ud800"': "features.merchant: not valid Unicode text (a lone surrogate)",
}


def test_bad_int64_features_are_refused_alone_while_good_records_score_exactly(corpus, main_triton):
    root, _ = corpus
    bad = [f'{{"features": {{"purpose": "car", "amount": 100.0, "age": 40.0, {field}}}}}'.encode()
           for field in BAD_BRANCHES]
    _score_beside_good_records(root, main_triton, list(zip(bad, BAD_BRANCHES.values())))


def test_a_record_over_a_sparse_features_limit_is_refused_alone_in_every_form(corpus, main_triton):
    """The density rule: main_constructs was converted with --max-values tags=4 amounts=3. A record with more values
    (a JSON list or a tf.Example feature) is refused naming the feature and the limit; good records, JSON ones with
    sparse lists and Examples with empty lists among them, score as the SavedModel does."""
    root, _ = corpus
    base = {"purpose": "car", "amount": 100.0, "age": 40.0, "branch": 7}
    over = {"tags": ["car"] * 5, "amounts": [1.0, 2.0, 3.0, 4.0]}
    messages = {"tags": "features.tags: 5 values is over the limit of 4", "amounts":
                "features.amounts: 4 values is over the limit of 3"}
    bad = [(json.dumps({"features": {**base, key: values}}).encode(), messages[key]) for key, values in over.items()]
    bad += [(example_parity.serialize_example({**base, key: values}), messages[key]) for key, values in over.items()]
    bad.append((json.dumps({"features": {**base, "tags": ["car", 1]}}).encode(),
                "features.tags/1: expected a string, got number"))
    _score_beside_good_records(root, main_triton, bad, also_json=True)


def _score_beside_good_records(root, main_triton, bad: list[tuple[bytes, str]], also_json: bool = False):
    """Good records (serialized Examples; with `also_json` their JSON form too) and bad ones, shuffled, each sent
    twice by 12 concurrent gRPC clients: each good record scores as the SavedModel, each bad one gets its error."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    spec = report_spec(root / f"{MAIN}.onnx")
    good = [example_parity.example_features(r, spec)
            for r in legacy_corpus.rows(legacy_corpus.BY_NAME[MAIN], 48, seed=23) if r["age"]]
    examples = [example_parity.serialize_example(f) for f in good]
    legacy = example_parity.legacy_outcomes(root / MAIN, "examples", examples)
    payloads = [(p, float(s)) for p, s in zip(examples, legacy)] + bad
    if also_json:
        payloads += [(json.dumps({"features": f}).encode(), float(s)) for f, s in zip(good, legacy)]
    assert any(f.get("tags") == [] for f in good) and any("tags" not in f for f in good)
    order = np.random.default_rng(5).permutation(len(payloads) * 2) % len(payloads)

    def score(index: int):
        client = grpcclient.InferenceServerClient(main_triton.grpc_url)
        try:
            payload = grpcclient.InferInput("payload", [1, 1], "BYTES")
            payload.set_data_from_numpy(np.array([[payloads[index][0]]], dtype=object))
            return float(client.infer("risk_pipeline", [payload]).as_numpy("probability").ravel()[0])
        except InferenceServerException as err:
            return err.message()
        finally:
            client.close()

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(score, order.tolist()))
    for index, answer in zip(order.tolist(), answers):
        expected = payloads[index][1]
        if isinstance(expected, str):
            assert isinstance(answer, str) and expected in answer, (index, answer)
        else:
            assert isinstance(answer, float) and abs(answer - expected) <= ATOL, (index, answer, expected)
    assert main_triton.process.poll() is None
