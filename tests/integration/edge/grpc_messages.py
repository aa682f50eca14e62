"""ModelInferRequest messages built with Triton's generated classes from the plain fields the request generators
make (s2t/gate/hostile_requests.py), and their bytes as sent: serialized, then damaged as the request says."""
from __future__ import annotations

import json
import math

from tritonclient.grpc import service_pb2

from s2t.gate.hostile_requests import INT_RANGES, GrpcRequest, damaged

CONTENTS_RANGES = {"int_contents": INT_RANGES["INT32"], "int64_contents": INT_RANGES["INT64"],
                   "uint_contents": INT_RANGES["UINT32"], "uint64_contents": INT_RANGES["UINT64"]}


def text(value: str) -> str:
    """A string protobuf can hold: a lone surrogate (valid in JSON, not in UTF-8) replaced. The wire damage sends
    strings that are not UTF-8."""
    return value.encode("utf-8", "replace").decode("utf-8")


def set_parameter(parameter: service_pb2.InferParameter, value) -> None:
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int) and -2**63 <= value < 2**63:
        parameter.int64_param = value
    elif isinstance(value, int) and 0 <= value < 2**64:
        parameter.uint64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = text(value if isinstance(value, str) else json.dumps(value))


def content(field: str, value):
    """`value` as the contents field `field` holds it (a typed-contents edge may name another datatype's field)."""
    if field == "bytes_contents":
        return value if isinstance(value, bytes) else str(value).encode()
    if field == "bool_contents":
        return bool(value) if not isinstance(value, bytes) else bool(len(value))
    number = len(value) if isinstance(value, bytes) else value
    if field in CONTENTS_RANGES:
        low, high = CONTENTS_RANGES[field]
        return min(high, max(low, int(number))) if math.isfinite(number) else 0
    return float(number)


def message(fields: dict) -> service_pb2.ModelInferRequest:
    """The ModelInferRequest `fields` (hostile_requests.grpc_fields) describe, built with Triton's generated
    classes."""
    request = service_pb2.ModelInferRequest(model_name=text(fields["model_name"]),
                                            model_version=text(fields["model_version"]), id=text(fields["id"]))
    for key, value in fields["parameters"].items():
        set_parameter(request.parameters[text(key)], value)
    for tensor in fields["inputs"]:
        entry = request.inputs.add(name=text(tensor["name"]), datatype=text(tensor["datatype"]),
                                   shape=tensor["shape"])
        for key, value in tensor["parameters"].items():
            set_parameter(entry.parameters[text(key)], value)
        for field, values in tensor.get("contents", {}).items():
            getattr(entry.contents, field).extend(content(field, v) for v in values)
    for output in fields["outputs"]:
        entry = request.outputs.add(name=text(output["name"]))
        for key, value in output["parameters"].items():
            set_parameter(entry.parameters[text(key)], value)
    request.raw_input_contents.extend(fields["raw_input_contents"])
    return request


def wire(request: GrpcRequest) -> bytes:
    data = message(request.spec).SerializeToString(deterministic=True)
    return damaged(data, request.damage, request.damage_seed) if request.damage else data
