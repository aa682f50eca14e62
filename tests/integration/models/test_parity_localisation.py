"""Parity localisation on the real artifacts: a planted weight error is traced to the node that reads it."""
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.conftest import DATA_CSV as DATA
from tests.conftest import SAVED_MODEL
from tests.conftest import SCORER_ONNX as SCORER
from s2t.gate import parity
from s2t.models import dataset
from s2t.gate.divergence import first_divergence

ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("built_artifacts")


def hidden_matmul_and_kernel(model: onnx.ModelProto) -> tuple[onnx.NodeProto, onnx.TensorProto]:
    initializers = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "MatMul" and "hidden" in node.name:
            kernel = next(name for name in node.input if name in initializers)
            return node, initializers[kernel]
    raise AssertionError("the scorer has no hidden-layer MatMul")


def test_parity_failure_names_the_matmul_whose_weight_was_perturbed(tmp_path):
    model = onnx.load(str(SCORER))
    matmul, kernel = hidden_matmul_and_kernel(model)
    readers = [n.name for n in model.graph.node if kernel.name in n.input]
    # tf2onnx shares identical constants between nodes; a shared kernel would make "the" reader ambiguous.
    assert readers == [matmul.name]
    kernel.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(kernel) + np.float32(0.1), kernel.name))
    perturbed = tmp_path / "perturbed.onnx"
    onnx.save(model, str(perturbed))

    report = parity.run(SAVED_MODEL, perturbed, DATA, atol=ATOL)

    assert not report.passed
    assert report.divergence["node"] == matmul.name
    assert report.divergence["op"] == "MatMul"
    assert report.divergence["max_abs"] > ATOL
    assert report.divergence["compared_tensors"] > 1


def test_first_divergence_finds_nothing_when_the_scorer_matches_the_legacy_model():
    data = dataset.load(DATA)

    assert first_divergence(SAVED_MODEL, SCORER, data, row=0, atol=ATOL) is None
