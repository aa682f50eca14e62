"""A SavedModel whose signature takes serialized tf.Example (parse_example, a StaticHashTable, a Keras net): converted
with the parsing lifted into the feature spec, scored as the SavedModel scores the same Examples, published and
served by the real tritonserver, and compared row by row from a CSV by `s2t parity`."""
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import MODEL_REPOSITORY, S2T
from s2t.gate import example_parity
from s2t.models.convert import read_spec
from s2t.models.example_signature import EXAMPLE_INPUT_KEY
from tests.integration.servers import triton_server

TF_QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
PURPOSES = ["car", "education", "furniture"]
OUT_OF_VOCABULARY = 3
ATOL = 1e-5


def build_example_saved_model(path: Path) -> None:
    """parse_example of two floats (one with a default) and a string (with a default), the string through a
    StaticHashTable to an index, a small Keras net on top; the signature takes a batch of serialized Examples."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(7)

    class ExampleModel(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(tf.constant(PURPOSES), tf.constant([0, 1, 2], tf.int64)),
                default_value=OUT_OF_VOCABULARY)
            self.net = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                                         keras.layers.Dense(1, activation="sigmoid")])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve(self, examples):
            parsed = tf.io.parse_example(examples, {
                "amount": tf.io.FixedLenFeature([1], tf.float32),
                "age": tf.io.FixedLenFeature([1], tf.float32, default_value=[30.0]),
                "purpose": tf.io.FixedLenFeature([1], tf.string, default_value=["other"]),
            })
            purpose = tf.one_hot(self.table.lookup(parsed["purpose"])[:, 0], OUT_OF_VOCABULARY + 1)
            features = tf.concat([parsed["amount"] / 1000.0 - 2.0, parsed["age"] / 20.0 - 2.0, purpose], axis=1)
            return {"score": self.net(features)}

    model = ExampleModel()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})


def csv_rows(n: int, seed: int = 3) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    return [{"amount": f"{rng.uniform(100, 9000):.2f}", "age": str(int(rng.integers(18, 80))),
             "purpose": str(rng.choice(PURPOSES + ["yacht"])), "creditability": "good"} for _ in range(n)]


def write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    columns = ["amount", "age", "purpose", "creditability"]
    path.write_text("\n".join([",".join(columns)] + [",".join(r.get(c, "") for c in columns) for r in rows]) + "\n")
    return path


@pytest.fixture(scope="module")
def example_model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("example_signature")
    saved_model = tmp / "example_model"
    build_example_saved_model(saved_model)
    converted = tmp / "example_scorer.onnx"
    done = subprocess.run([str(S2T), "convert", str(saved_model), str(converted)], capture_output=True, text=True,
                          env=TF_QUIET, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "parse defaults: age=30.0, purpose='other'" in done.stdout
    return {"saved_model": saved_model, "onnx": converted, "tmp": tmp}


@pytest.fixture(scope="module")
def spec(example_model):
    return read_spec(onnx.load(str(example_model["onnx"])))


def examples(rows, spec):
    return [example_parity.serialize_example(example_parity.example_features(r, spec)) for r in rows]


def test_convert_lifts_the_parsing_and_the_hash_table_into_the_feature_spec(example_model, spec):
    model = onnx.load(str(example_model["onnx"]))
    assert [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input] \
        == [("categorical", ["batch", 1]), ("numeric", ["batch", 2])]
    assert not {n.op_type for n in model.graph.node} & {"ParseExampleV2", "CategoryMapper"}
    assert [(f.name, f.vocabulary, f.default_index) for f in spec.categorical] == \
        [("purpose", {"car": 0, "education": 1, "furniture": 2}, OUT_OF_VOCABULARY)]
    assert sorted(spec.numeric) == ["age", "amount"]
    assert spec.defaults == {"age": 30.0, "purpose": "other"}
    assert {p.key: p.value for p in model.metadata_props}[EXAMPLE_INPUT_KEY] == "examples"


def test_converted_model_and_spec_score_serialized_examples_as_the_saved_model(example_model, spec):
    rows = csv_rows(300) + [
        {"amount": "1500", "age": "44", "purpose": "yacht"},  # out of vocabulary: the table's default
        {"amount": "1500", "age": "44", "purpose": ""},  # missing: the parse default, itself out of vocabulary
        {"amount": "2500", "age": "", "purpose": "car"},  # missing: the parse default 30
    ]
    batch = examples(rows, spec)
    legacy = example_parity.legacy_outcomes(example_model["saved_model"], "examples", batch)
    converted = example_parity.onnx_outcomes(example_model["onnx"], spec, batch)
    assert all(isinstance(s, float) for s in legacy + converted)
    assert np.max(np.abs(np.array(legacy) - np.array(converted))) <= ATOL
    # The defaults matter: a missing age scores as age 30, not as 0.
    with_default = examples([{"amount": "2500", "age": "30", "purpose": "car"}], spec)
    assert abs(example_parity.onnx_outcomes(example_model["onnx"], spec, with_default)[0] - converted[-1]) <= ATOL
    assert len({round(s, 6) for s in converted}) > 100


def test_a_missing_feature_without_a_parse_default_is_refused_by_both_naming_it(example_model, spec):
    batch = examples([{"age": "50", "purpose": "car"}], spec)
    legacy = example_parity.legacy_outcomes(example_model["saved_model"], "examples", batch)
    converted = example_parity.onnx_outcomes(example_model["onnx"], spec, batch)
    assert "amount" in legacy[0] and "required" in legacy[0]
    assert converted == ["features.amount: missing"]


def test_s2t_parity_on_a_csv_gives_a_bad_row_its_own_line_and_compares_the_rest(example_model):
    rows = csv_rows(40)
    rows[5]["amount"] = "lots"
    rows[9]["amount"] = ""
    data = write_csv(example_model["tmp"] / "offline.csv", rows)
    report = example_model["tmp"] / "offline.json"
    done = subprocess.run([str(S2T), "parity", "--saved-model", str(example_model["saved_model"]), "--onnx",
                           str(example_model["onnx"]), "--data", str(data), "--report", str(report)],
                          capture_output=True, text=True, env=TF_QUIET, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(report.read_text())
    assert result["rows"] == 40 and result["passed"]
    assert result["comparisons"][0]["rows"] == 38
    not_sent, refused = result["row_errors"]
    assert not_sent == "row 5: not sent (column amount: 'lots' is not a number)"
    assert refused.startswith("row 9: refused by legacy: Name: <unknown>, Feature: amount (data type: float) is "
                              "required but could not be found.")
    assert refused.endswith("; onnxruntime example_scorer.onnx: features.amount: missing")
    assert "row 5: not sent (column amount: 'lots' is not a number)" in done.stdout


def test_s2t_parity_refuses_a_csv_of_which_the_saved_model_scores_no_row(example_model):
    data = write_csv(example_model["tmp"] / "all_refused.csv", [{"age": "30", "purpose": "car"}] * 3)
    done = subprocess.run([str(S2T), "parity", "--saved-model", str(example_model["saved_model"]), "--onnx",
                           str(example_model["onnx"]), "--data", str(data)],
                          capture_output=True, text=True, env=TF_QUIET, timeout=300)
    assert done.returncode != 0
    assert "scored none of the 3 rows" in done.stderr


@pytest.fixture(scope="module")
def example_triton(example_model, tmp_path_factory):
    """A repository holding risk_pipeline (as served) and risk_scorer sized for the example model, whose version 1
    is published by `s2t publish`, gated on tf.Example parity; the real tritonserver on it."""
    tmp = example_model["tmp"]
    repository = tmp_path_factory.mktemp("example_repository")
    (repository / "risk_scorer").mkdir()
    config = (MODEL_REPOSITORY / "risk_scorer" / "config.pbtxt").read_text()
    (repository / "risk_scorer" / "config.pbtxt").write_text(
        config.replace("dims: [ 13 ]", "dims: [ 1 ]").replace("dims: [ 7 ]", "dims: [ 2 ]"))
    shutil.copytree(MODEL_REPOSITORY / "risk_pipeline", repository / "risk_pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    gate = write_csv(tmp / "gate.csv", csv_rows(50, seed=11))
    done = subprocess.run([str(S2T), "publish", "risk_scorer", str(example_model["onnx"]), "--repository",
                           str(repository), "--saved-model", str(example_model["saved_model"]), "--data", str(gate)],
                          capture_output=True, text=True, env=TF_QUIET, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "1"
    log = tmp / "tritonserver.log"
    server = triton_server([repository], log_path=log, exit_timeout_seconds=10)
    try:
        server.start(timeout=120)
    except Exception:
        print(log.read_text()[-5000:] if log.exists() else "no log")
        raise
    yield server
    server.stop()


def test_published_example_model_passes_s2t_parity_live_with_a_bad_row_on_its_own_line(example_model,
                                                                                      example_triton):
    rows = csv_rows(120, seed=5)
    rows[7]["amount"] = "n/a"  # cannot be built: not sent
    rows[30]["amount"] = ""  # required feature missing: every side refuses it
    rows[31]["purpose"] = ""  # the parse default
    rows[32]["age"] = ""
    data = write_csv(example_model["tmp"] / "live.csv", rows)
    report = example_model["tmp"] / "live.json"
    done = subprocess.run([str(S2T), "parity", "--saved-model", str(example_model["saved_model"]), "--onnx",
                           str(example_model["onnx"]), "--data", str(data), "--grpc-url", example_triton.grpc_url,
                           "--report", str(report)],
                          capture_output=True, text=True, env=TF_QUIET, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(report.read_text())
    live = result["comparisons"][1]
    assert live["candidate"] == "triton risk_pipeline (grpc)"
    assert live["rows"] == 118 and live["max_abs"] <= ATOL and live["passed"]
    assert [line.split(":")[0] for line in result["row_errors"]] == ["row 7", "row 30"]
    assert result["row_errors"][1].endswith("triton risk_pipeline (grpc): features.amount: missing")
    # Progress counts the 119 Examples sent (row 7 could not be built), each side a stage of its own, on stderr.
    ends = [line.split(" after ")[0] for line in done.stderr.splitlines() if "119/119 rows (100%)" in line]
    assert ends == ["parity: legacy SavedModel: 119/119 rows (100%)",
                    "parity: onnxruntime example_scorer.onnx: 119/119 rows (100%)",
                    "parity: triton risk_pipeline (grpc): 119/119 rows (100%)"]


def test_examples_good_and_bad_under_concurrency_each_get_their_own_answer(example_model, example_triton, spec):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    rows = csv_rows(64, seed=9)
    for i in range(0, 64, 4):
        rows[i] = {"age": rows[i]["age"], "purpose": rows[i]["purpose"]}  # no amount, which has no default
    batch = examples(rows, spec)
    legacy = example_parity.legacy_outcomes(example_model["saved_model"], "examples", batch)

    def score(index: int):
        client = grpcclient.InferenceServerClient(example_triton.grpc_url)
        try:
            payload = grpcclient.InferInput("payload", [1, 1], "BYTES")
            payload.set_data_from_numpy(np.array([[batch[index]]], dtype=object))
            return float(client.infer("risk_pipeline", [payload]).as_numpy("probability").ravel()[0])
        except InferenceServerException as err:
            return err.message()
        finally:
            client.close()

    for _ in range(3):
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(score, range(len(batch))))
        for i, (answer, reference) in enumerate(zip(answers, legacy)):
            if i % 4 == 0:
                assert isinstance(reference, str) and "features.amount: missing" in answer, (i, answer)
            else:
                assert isinstance(answer, float) and abs(answer - reference) <= ATOL, (i, answer, reference)
    assert example_triton.process.poll() is None
