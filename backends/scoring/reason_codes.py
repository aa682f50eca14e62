"""Reason codes: which attributes of a record push its risk up, exactly, from the linear model's own weights.

`risk_scorer_lite` is a logistic regression over the encoded attributes (one-hot categories, standardised
numbers): logit = bias + sum over attributes of w_a . x_a. Each attribute's term is read from the ONNX graph
itself (the last MatMul's weights, and the encoded attribute the Concat before it holds), so nothing is
re-derived or approximated: the terms plus the bias give the model's logit to float32 precision.

An attribute's *points* are its term measured from a reference: for a category, the lowest-risk category of that
attribute (the scorecard convention for adverse-action reasons: the points lost against the best answer); for a
number, the training mean (its standardised value 0). Reason codes are the attributes with the most points,
highest first, ties broken by name: deterministic for a given model file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from s2t.backends.records.feature_spec import CATEGORICAL_INPUT, METADATA_KEY, NUMERIC_INPUT, FeatureSpec


class ReasonModelError(ValueError):
    """The ONNX file is not a linear model this module can read."""


@dataclass(frozen=True)
class Reason:
    feature: str
    points: float

    def code(self) -> str:
        return f"{self.feature}:{self.points:+.3f}"


@dataclass(frozen=True)
class Explanation:
    logit: float
    probability: float
    reasons: tuple[Reason, ...]


def _feature_of(name: str, producers: dict, features: Sequence[str], depth: int = 4) -> str | None:
    pattern = re.compile(r"(?:^|/)(" + "|".join(map(re.escape, sorted(features, key=len, reverse=True)))
                         + r")_(?:lookup|norm)(?:_\d+)?/")
    frontier = [name]
    for _ in range(depth):
        for tensor in frontier:
            match = pattern.search(tensor)
            if match:
                return match.group(1)
        frontier = [i for t in frontier if t in producers for i in producers[t].input]
    return None


class LinearReasons:
    def __init__(self, onnx_path: Path, top: int = 3):
        model = onnx.load(str(onnx_path))
        props = {p.key: p.value for p in model.metadata_props}
        if METADATA_KEY not in props:
            raise ReasonModelError(f"{onnx_path}: no {METADATA_KEY} metadata (convert it with `s2t convert`)")
        self.spec = FeatureSpec.from_json(props[METADATA_KEY])
        self.top = top
        graph = model.graph
        initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        producers = {out: node for node in graph.node for out in node.output}
        matmuls = [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in initializers
                   and initializers[n.input[1]].ndim == 2 and initializers[n.input[1]].shape[1] == 1]
        if len(matmuls) != 1:
            raise ReasonModelError(f"{onnx_path}: expected one linear layer (MatMul to one output), "
                                   f"found {len(matmuls)}: not a linear model")
        matmul = matmuls[0]
        concat = producers.get(matmul.input[0])
        if concat is None or concat.op_type != "Concat":
            raise ReasonModelError(f"{onnx_path}: the linear layer does not read a Concat of encoded attributes")
        adds = [n for n in graph.node if n.op_type == "Add" and matmul.output[0] in n.input]
        bias_names = [i for n in adds for i in n.input if i in initializers]
        self.bias = float(initializers[bias_names[0]].ravel()[0]) if bias_names else 0.0
        self.weights = initializers[matmul.input[1]].ravel().astype(np.float64)
        self.parts = list(concat.input)
        self.features = []
        for part in self.parts:
            feature = _feature_of(part, producers, self.spec.names)
            if feature is None:
                raise ReasonModelError(f"{onnx_path}: cannot tell which attribute {part} encodes")
            self.features.append(feature)
        exposed = onnx.ModelProto()
        exposed.CopyFrom(model)
        exposed.graph.output.extend(helper.make_tensor_value_info(p, onnx.TensorProto.FLOAT, None)
                                    for p in self.parts)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(exposed.SerializeToString(), options,
                                             providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        widths = [v.shape[-1] for v in self._encoded(np.zeros((1, len(self.spec.categorical)), np.int64),
                                                     np.zeros((1, len(self.spec.numeric)), np.float32))]
        if sum(widths) != len(self.weights):
            raise ReasonModelError(f"{onnx_path}: encoded width {sum(widths)} != {len(self.weights)} weights")
        bounds = np.cumsum([0] + widths)
        self._slices = [slice(int(a), int(b)) for a, b in zip(bounds, bounds[1:])]
        # A category's reference is its lowest-risk one-hot slot; a number's is 0 (the training mean).
        self._references = np.array([float(self.weights[s].min()) if s.stop - s.start > 1 else 0.0
                                     for s in self._slices])

    def _encoded(self, categorical: np.ndarray, numeric: np.ndarray) -> list[np.ndarray]:
        values = self._session.run(None, {CATEGORICAL_INPUT: categorical, NUMERIC_INPUT: numeric})
        by_name = dict(zip(self._outputs, values))
        return [np.asarray(by_name[p], dtype=np.float64).reshape(categorical.shape[0], -1) for p in self.parts]

    def explain(self, categorical: np.ndarray, numeric: np.ndarray) -> list[Explanation]:
        """One Explanation per row of the scorer's inputs (categorical INT64 [n, 13], numeric FP32 [n, 7])."""
        encoded = self._encoded(np.asarray(categorical, np.int64).reshape(-1, len(self.spec.categorical)),
                                np.asarray(numeric, np.float32).reshape(-1, len(self.spec.numeric)))
        terms = np.stack([e @ self.weights[s] for e, s in zip(encoded, self._slices)], axis=1)
        points = terms - self._references
        result = []
        for row_terms, row_points in zip(terms, points):
            logit = self.bias + float(row_terms.sum())
            ranked = sorted(((round(float(p), 6), f) for f, p in zip(self.features, row_points) if p > 1e-9),
                            key=lambda item: (-item[0], item[1]))
            result.append(Explanation(logit, float(1.0 / (1.0 + np.exp(-logit))),
                                      tuple(Reason(f, p) for p, f in ranked[:self.top])))
        return result
