"""Hostile KServe v2 inference requests for the serving ports, made by seeded generators from the served models'
signatures: the input of the fuzz suites (tests/integration/edge/) and of the native fuzz target's seed corpus.

A request is plain data: an HTTP method, path, headers and body; or the fields of a gRPC ModelInferRequest (the
caller builds the message with Triton's generated classes) and the damage its serialized bytes take afterwards.
Request `index` of seed `seed` is made from its own generator, so a failing request is made again from those two
numbers alone, and `shrink` makes it small. Each request carries what a correct server must do with it: refuse it
(`refused`), or answer or refuse it as it likes, never with a server error or a dropped connection. Nothing here
imports Triton: the wire helpers read and write protobuf's encoding by hand, because the damage they make (overlong
varints, lengths past the end, a string that is not UTF-8) is what a protobuf library refuses to write.
"""
from __future__ import annotations

import copy
import gzip
import json
import random
import struct
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence
from urllib.parse import quote

# KServe v2's datatypes and the struct format of one element (BF16: the high half of an FP32).
STRUCT_FORMATS = {"BOOL": "?", "UINT8": "B", "INT8": "b", "UINT16": "H", "INT16": "h", "UINT32": "I", "INT32": "i",
                  "UINT64": "Q", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d"}
DATATYPES = (*STRUCT_FORMATS, "BF16", "BYTES")
INT_RANGES = {"UINT8": (0, 2**8 - 1), "INT8": (-2**7, 2**7 - 1), "UINT16": (0, 2**16 - 1), "INT16": (-2**15, 2**15 - 1),
              "UINT32": (0, 2**32 - 1), "INT32": (-2**31, 2**31 - 1), "UINT64": (0, 2**64 - 1),
              "INT64": (-2**63, 2**63 - 1)}
# Dimensions no tensor can have: past int32, past what any buffer holds, int64's extremes, negative.
HUGE_DIMS = (2**31, 2**40, 2**62, 2**63 - 1, -1, -2, -2**63)
PREFERRED_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                      "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
                      "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
                      "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
CONTENTS_FIELDS = tuple(sorted(set(PREFERRED_CONTENTS.values())))


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str  # KServe v2's name (BYTES, FP32, INT64)
    dims: tuple[int, ...]  # without the batch dimension


@dataclass(frozen=True)
class Model:
    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    max_batch_size: int = 0


def kserve_datatype(config_type: str) -> str:
    """A config's data type (TYPE_STRING, TYPE_FP32) by its KServe v2 name (BYTES, FP32)."""
    return "BYTES" if config_type == "TYPE_STRING" else config_type.removeprefix("TYPE_")


@dataclass(frozen=True)
class HttpRequest:
    kind: str
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    refused: bool  # must be refused (4xx); otherwise answered or refused, never a 5xx nor a dropped connection
    triton_defined: bool = True  # False: Triton 2.51 itself is known to crash on it


@dataclass(frozen=True)
class GrpcRequest:
    kind: str
    spec: dict  # ModelInferRequest's fields as plain data (see `grpc_fields`)
    damage: str | None = None  # a WIRE_DAMAGE name, applied to the serialized message with `damage_seed`
    damage_seed: int = 0
    refused: bool = False  # must be refused (a non-OK status other than a dropped call)
    triton_defined: bool = True


@dataclass(frozen=True)
class GrpcStream:
    kind: str
    requests: tuple[GrpcRequest, ...]


@dataclass
class _Made:
    spec: dict
    names: list[str] = field(default_factory=list)
    refused: bool = False
    triton_defined: bool = True


# ---- tensor data

def element_values(datatype: str, count: int, rng: random.Random, payloads: Sequence[bytes]) -> list:
    """`count` elements a tensor of `datatype` can hold (BYTES: drawn from `payloads`)."""
    if datatype == "BYTES":
        return [rng.choice(payloads) for _ in range(count)]
    if datatype == "BOOL":
        return [rng.random() < 0.5 for _ in range(count)]
    if datatype in INT_RANGES:
        low, high = INT_RANGES[datatype]
        return [rng.randint(max(low, -3), min(high, 3)) for _ in range(count)]
    return [round(rng.uniform(-3, 3), 2) for _ in range(count)]


def serialize(values: Sequence, datatype: str) -> bytes:
    """The tensor's bytes as KServe v2 lays them out (BYTES: each element after its 4-byte little-endian length).
    Raises (struct.error, TypeError, OverflowError, KeyError) for values or a datatype it cannot write."""
    if datatype == "BYTES":
        return b"".join(len(v).to_bytes(4, "little") + v for v in values)
    if datatype == "BF16":
        return b"".join(struct.pack("<f", v)[2:] for v in values)
    return struct.pack(f"<{len(values)}{STRUCT_FORMATS[datatype]}", *values)


def json_data(values: Sequence) -> list:
    """A tensor's elements as JSON holds them: BYTES as text, bytes that are not UTF-8 as lone surrogates (which
    json.dumps writes as \\udcXX escapes)."""
    return [v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v for v in values]


def _rows(model: Model, rng: random.Random) -> int:
    return rng.choice((1, 1, 1, 2, 3, 8)) if model.max_batch_size else 1


def _shape(model: Model, tensor: Tensor, rows: int) -> list[int]:
    return ([rows] if model.max_batch_size else []) + list(tensor.dims)


def _row_dims(shape: Sequence[int]) -> list[int]:
    """A shape's dimensions after the batch's, each cut to what a test can fill (an earlier edge may have made one
    huge or negative)."""
    return [d if 0 <= d <= 64 else 1 for d in shape[1:]]


def _count(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def valid_spec(model: Model, rng: random.Random, payloads: Sequence[bytes]) -> dict:
    """A request `model` answers: every input filled, maybe an id, maybe some of its outputs named."""
    rows = _rows(model, rng)
    spec: dict = {"model_name": model.name, "model_version": "", "parameters": {}, "inputs": []}
    if rng.random() < 0.5:
        spec["id"] = f"req-{rng.randrange(10**6)}"
    for tensor in model.inputs:
        shape = _shape(model, tensor, rows)
        spec["inputs"].append({"name": tensor.name, "datatype": tensor.datatype, "shape": shape, "parameters": {},
                               "data": element_values(tensor.datatype, _count(shape), rng, payloads)})
    if rng.random() < 0.4:
        chosen = rng.sample(model.outputs, rng.randint(1, len(model.outputs)))
        spec["outputs"] = [{"name": t.name, "parameters": {}} for t in chosen]
    return spec


# ---- edges of a request's fields, for either port: each changes a valid spec in place

def _pick_input(spec: dict, rng: random.Random) -> dict:
    if not spec["inputs"]:
        spec["inputs"].append({"name": "payload", "datatype": "BYTES", "shape": [1, 1], "parameters": {},
                               "data": [b"{}"]})
    return rng.choice(spec["inputs"])


def _output(spec: dict, model: Model, rng: random.Random, name: str | None = None) -> dict:
    outputs = spec.setdefault("outputs", [])
    entry = {"name": rng.choice(model.outputs).name if name is None else name, "parameters": {}}
    outputs.append(entry)
    return entry


def _wrong_datatype(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    tensor["datatype"] = rng.choice([d for d in DATATYPES if d != tensor["datatype"]])
    tensor["data"] = element_values(tensor["datatype"], len(tensor["data"]), rng, payloads)


def _unknown_datatype(spec, model, rng, payloads):
    _pick_input(spec, rng)["datatype"] = rng.choice(("", "FP33", "bytes", "STRING", "TYPE_FP32", "INT128",
                                                      "FP32\x00", "B" * 300))


def _shape_unfilled(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    shape = tensor["shape"] or [1]
    rows = shape[0] if 0 <= shape[0] <= 256 else 1
    tensor["shape"] = [rows + rng.randint(1, 300), *shape[1:]]


def _shape_overfilled(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    extra = rng.randint(1, 5) * max(1, _count(_row_dims(tensor["shape"])))
    tensor["data"] = tensor["data"] + element_values(tensor["datatype"], extra, rng, payloads)


def _huge_dim(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    shape = list(tensor["shape"]) or [1]
    shape[rng.randrange(len(shape))] = rng.choice(HUGE_DIMS)
    tensor["shape"] = shape


def _zero_dim(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    tensor["shape"] = [0, *tensor["shape"][1:]]
    tensor["data"] = []


def _wrong_rank(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    n = len(tensor["data"])
    tensor["shape"] = rng.choice(([n], [n, 1, 1], [1, n, 1], [], [1] * rng.randint(4, 70)))


def _batch_over_limit(spec, model, rng, payloads):
    rows = (model.max_batch_size or 1) + rng.randint(1, 64)
    for tensor in spec["inputs"]:
        tensor["shape"] = [rows, *_row_dims(tensor["shape"])]
        tensor["data"] = element_values(tensor["datatype"], _count(tensor["shape"]), rng, payloads)


def _missing_input(spec, model, rng, payloads):
    name = rng.choice(model.inputs).name
    # a name with a NUL after it is that name to Triton (a C string)
    spec["inputs"] = [t for t in spec["inputs"] if t["name"].split("\x00")[0] != name]


def _duplicate_input(spec, model, rng, payloads):
    spec["inputs"].append(copy.deepcopy(_pick_input(spec, rng)))


def _unknown_input_name(spec, model, rng, payloads):
    _pick_input(spec, rng)["name"] = rng.choice(("record", "", "PAYLOAD", "payload ", "x" * 5000, "\x00payload"))


def _name_with_nul(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    tensor["name"] += "\x00" + rng.choice(("", "x", "\x00"))


def _extra_input(spec, model, rng, payloads):
    extra = copy.deepcopy(_pick_input(spec, rng))
    extra["name"] = "extra_" + str(rng.randrange(100))
    spec["inputs"].append(extra)


def _input_parameters(spec, model, rng, payloads):
    _pick_input(spec, rng)["parameters"].update(rng.choice(
        ({"unknown": 1}, {"binary_data": True}, {"classification": 2}, {"": ""}, {"x" * 300: "y"})))


def _shared_memory_input(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    tensor["parameters"].update({"shared_memory_region": rng.choice(("nope", "", "../../dev/shm/x")),
                                 "shared_memory_byte_size": rng.choice((0, 8, 2**40, -1)),
                                 "shared_memory_offset": rng.choice((0, 2**63 - 1, -8))})
    tensor["data"] = []


def _bytes_element_past_end(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    tensor["datatype"] = "BYTES"
    claimed = rng.choice((5, 300, 2**31 - 1, 2**32 - 1))
    body = rng.choice(payloads)[: rng.randint(0, 4)]
    tensor["raw"] = serialize(tensor["data"][:-1] if all(isinstance(v, bytes) for v in tensor["data"]) else [],
                              "BYTES") + claimed.to_bytes(4, "little") + body


def _bytes_length_cut(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    tensor["datatype"] = "BYTES"
    tensor["raw"] = serialize([rng.choice(payloads)], "BYTES") + b"\x07\x00"[: rng.randint(1, 2)]


def _raw_size_mismatch(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    try:
        raw = serialize(tensor["data"], tensor["datatype"])
    except (struct.error, TypeError, OverflowError, AttributeError, KeyError):
        raw = b""
    tensor["raw"] = rng.choice((raw[:-1], raw + b"\x00", raw + raw, b"", raw[: len(raw) // 2])) if raw else b"\x00"


def _record_not_a_record(spec, model, rng, payloads):
    for tensor in spec["inputs"]:
        if tensor["datatype"] == "BYTES" and tensor["data"]:
            tensor["data"][rng.randrange(len(tensor["data"]))] = rng.choice(
                (b"", b"{", b"null", b"[]", b"\xff\xfe\x00", b"{\"features\": 1}", b"x" * 70_000, b"\x00" * 64,
                 b"[" * 5000 + b"]" * 5000))


def _values_out_of_domain(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    if tensor["datatype"] in INT_RANGES:
        low, high = INT_RANGES[tensor["datatype"]]
        tensor["data"] = [rng.choice((low, high, -1, 10**6)) for _ in tensor["data"]]
    elif tensor["datatype"] in ("FP32", "FP64", "FP16", "BF16"):
        tensor["data"] = [rng.choice((float("nan"), float("inf"), -float("inf"), 3e38, -0.0)) for _ in tensor["data"]]


def _unknown_output(spec, model, rng, payloads):
    _output(spec, model, rng, rng.choice(("no_such_output", "", "PROBABILITY", "payload", "x" * 3000)))


def _duplicate_output(spec, model, rng, payloads):
    name = rng.choice(model.outputs).name
    _output(spec, model, rng, name)
    _output(spec, model, rng, name)


def _classification_numeric(spec, model, rng, payloads):
    numeric = [t for t in model.outputs if t.datatype != "BYTES"]
    entry = _output(spec, model, rng, rng.choice(numeric).name if numeric else None)
    entry["parameters"]["classification"] = rng.choice((1, 2, 0, -1, -2**31, 2**31, 2**62))


def _classification_bytes(spec, model, rng, payloads):
    words = [t.name for t in model.outputs if t.datatype == "BYTES"]
    entry = _output(spec, model, rng, rng.choice(words) if words else "decision")
    entry["parameters"]["classification"] = rng.choice((1, 5, 0, -1, 2**31))


def _binary_output(spec, model, rng, payloads):
    entry = _output(spec, model, rng)
    entry["parameters"]["binary_data"] = rng.choice((True, False, "yes", 1, 0))


def _output_parameters(spec, model, rng, payloads):
    entry = _output(spec, model, rng)
    entry["parameters"].update(rng.choice(({"unknown": "x"}, {"shared_memory_region": "nope",
                                                              "shared_memory_byte_size": 4},
                                           {"classification": "3"}, {"binary_data": True, "classification": 1})))


def _sequence_parameters(spec, model, rng, payloads):
    spec["parameters"].update(rng.choice((
        {"sequence_id": rng.choice((1, 0, -1, 2**63 - 1))}, {"sequence_id": "corr-1"},
        {"sequence_start": True}, {"sequence_end": True}, {"sequence_start": True, "sequence_end": True,
                                                           "sequence_id": 7}, {"sequence_start": 1})))


def _priority(spec, model, rng, payloads):
    spec["parameters"]["priority"] = rng.choice((0, 1, 2, 3, 100, -1, 2**63 - 1, "high", True, 1.5))


def _timeout(spec, model, rng, payloads):
    spec["parameters"]["timeout"] = rng.choice((0, 1, -1, 10**6, 2**63 - 1, "10", 0.5))


def _unknown_parameters(spec, model, rng, payloads):
    spec["parameters"].update(rng.choice(({"unknown": "x"}, {"": 0}, {"triton_enable_empty_final_response": True},
                                          {"binary_data_output": True}, {"k" * 4000: "v"}, {"headers": "x"})))


def _id_edge(spec, model, rng, payloads):
    spec["id"] = rng.choice(("", "i" * 20_000, "\x00\x01\x02", "\u202e\ufeff", "id\ud800x", "\ud83d\ude00"))


def _version_edge(spec, model, rng, payloads):
    spec["model_version"] = rng.choice(("0", "2", "-1", "99999999999999999999", "abc", "x"))


def _version_spelling(spec, model, rng, payloads):
    # Triton's gRPC front end reads a version with std::stoll: these may name version 1 there
    spec["model_version"] = rng.choice(("1.0", " 1", "1 ", "+1", "01", "1abc"))


def _model_edge(spec, model, rng, payloads):
    spec["model_name"] = rng.choice(("no_such_model", "risk_stream", "RISK_PIPELINE", "risk_pipeline/1",
                                     "../risk_pipeline", "m" * 3000, "\x00" + model.name))


def _model_name_with_nul(spec, model, rng, payloads):
    spec["model_name"] += "\x00" + rng.choice(("", "x"))


# (name, edge, must be refused, Triton 2.51's own answer is defined). The names are the kinds the suites count.
SPEC_EDGES: Sequence[tuple[str, Callable, bool, bool]] = (
    ("wrong datatype", _wrong_datatype, True, True),
    ("unknown datatype", _unknown_datatype, True, True),
    ("shape its data does not fill", _shape_unfilled, True, True),
    ("more data than its shape", _shape_overfilled, True, True),
    ("huge or negative dimension", _huge_dim, True, True),
    ("zero rows", _zero_dim, False, True),
    ("wrong rank", _wrong_rank, True, True),
    ("batch over max_batch_size", _batch_over_limit, True, True),
    ("missing input", _missing_input, True, True),
    ("duplicate input", _duplicate_input, True, True),
    ("unknown input name", _unknown_input_name, True, True),
    ("extra input", _extra_input, True, True),
    ("input name with a NUL after it", _name_with_nul, False, True),
    ("input parameters", _input_parameters, False, True),
    ("shared memory input", _shared_memory_input, True, True),
    ("BYTES element past the end", _bytes_element_past_end, True, True),
    ("BYTES length cut short", _bytes_length_cut, True, True),
    ("raw size mismatch", _raw_size_mismatch, True, True),
    ("payload that is no record", _record_not_a_record, False, True),
    ("values out of domain", _values_out_of_domain, False, True),
    ("unknown output", _unknown_output, True, True),
    ("duplicate output", _duplicate_output, False, True),
    ("classification of a numeric output", _classification_numeric, False, True),
    ("classification of a BYTES output", _classification_bytes, True, False),
    ("binary_data output parameter", _binary_output, False, True),
    ("output parameters", _output_parameters, False, True),
    ("sequence parameters", _sequence_parameters, False, True),
    ("priority", _priority, False, True),
    ("timeout", _timeout, False, True),
    ("unknown request parameters", _unknown_parameters, False, True),
    ("id edge", _id_edge, False, True),
    ("model version edge", _version_edge, True, True),
    ("model version spelled oddly", _version_spelling, False, True),
    ("model name edge", _model_edge, True, True),
    ("model name with a NUL after it", _model_name_with_nul, False, True),
)
SPEC_EDGE_NAMES = tuple(name for name, *_ in SPEC_EDGES)


def _edge_field(name: str) -> str:
    return "model version" if "model version" in name else "model name" if "model name" in name else name


def _made(model: Model, rng: random.Random, payloads: Sequence[bytes]) -> _Made:
    """A valid request with none, one or two edges."""
    made = _Made(valid_spec(model, rng, payloads))
    # distinct edges, each of its own field: one applied twice, or two to one field, can undo each other (a datatype
    # changed back, a bad version replaced by an odd spelling of a good one)
    chosen = rng.sample(SPEC_EDGES, rng.choice((0, 1, 1, 1, 2)))
    if len(chosen) == 2 and _edge_field(chosen[0][0]) == _edge_field(chosen[1][0]):
        chosen = chosen[:1]
    for name, edge, refused, defined in chosen:
        edge(made.spec, model, rng, payloads)
        made.names.append(name)
        made.refused |= refused
        made.triton_defined &= defined
    return made


# ---- HTTP: the JSON body, the binary-data extension, and what damages the bytes or the route

BINARY_HEADER = "Inference-Header-Content-Length"


def http_body(spec: dict, binary_inputs: Sequence[int] = ()) -> tuple[bytes, dict[str, str]]:
    """The infer request's body and headers: inputs at `binary_inputs` (and those holding `raw`) in the binary-data
    extension, the others as JSON `data`."""
    header: dict = {}
    for key in ("id", "parameters"):
        if spec.get(key) or (key == "id" and "id" in spec):
            header[key] = spec[key]
    header["inputs"], tail = [], b""
    for i, tensor in enumerate(spec["inputs"]):
        entry = {"name": tensor["name"], "datatype": tensor["datatype"], "shape": tensor["shape"]}
        parameters = dict(tensor.get("parameters", {}))
        raw = tensor.get("raw")
        if raw is None and i in binary_inputs:
            try:
                raw = serialize(tensor["data"], tensor["datatype"])
            except (struct.error, TypeError, OverflowError, AttributeError, KeyError):
                raw = None
        if raw is not None:
            parameters.setdefault("binary_data_size", len(raw))
            tail += raw
        else:
            entry["data"] = json_data(tensor["data"])
        if parameters:
            entry["parameters"] = parameters
        header["inputs"].append(entry)
    if "outputs" in spec:
        header["outputs"] = [{"name": o["name"], **({"parameters": o["parameters"]} if o["parameters"] else {})}
                             for o in spec["outputs"]]
    text = json.dumps(header).encode()
    headers = {"Content-Type": "application/json"}
    if tail:
        headers = {"Content-Type": "application/octet-stream", BINARY_HEADER: str(len(text))}
    return text + tail, headers


def infer_path(model: str, version: str = "") -> str:
    """The infer route of `model` (and `version`), each percent-encoded: a name with a space or a NUL still names
    the model it names in the request line."""
    path = f"/v2/models/{quote(model, safe='')}"
    return path + (f"/versions/{quote(version, safe='')}" if version else "") + "/infer"


def _json_cut(body: bytes, headers: dict, rng: random.Random) -> bytes:
    end = int(headers.get(BINARY_HEADER, len(body)))
    return body[: rng.randrange(1, max(2, end))]


def _flip_bits(data: bytes, rng: random.Random, flips: int | None = None) -> bytes:
    out = bytearray(data)
    for _ in range(flips or rng.randint(1, 8)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def _chunk_edit(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return b"\x00"
    start = rng.randrange(len(data))
    end = min(len(data), start + rng.randint(1, 64))
    choice = rng.randrange(3)
    if choice == 0:
        return data[:start] + data[end:]
    if choice == 1:
        return data[:end] + data[start:end] + data[end:]
    return data[:start] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + data[start:]


def _deep(rng: random.Random) -> str:
    depth = rng.choice((64, 1000, 100_000))
    return rng.choice(("[" * depth + "1" + "]" * depth, '{"a":' * depth + "1" + "}" * depth, "[" * depth))


def _replace_json_value(body: bytes, headers: dict, key: bytes, new: bytes) -> bytes:
    """The first `"key": value` of the JSON header with `new` as its value (any following value included)."""
    end = int(headers.get(BINARY_HEADER, len(body)))
    text, tail = body[:end], body[end:]
    at = text.find(b'"' + key + b'": ')
    if at < 0:
        return body
    start = at + len(key) + 4
    depth, i = 0, start
    while i < len(text):
        c = text[i:i + 1]
        if c in b"[{":
            depth += 1
        elif c in b"]}":
            if depth == 0:
                break
            depth -= 1
        elif c == b"," and depth == 0:
            break
        elif c == b'"':
            i = text.index(b'"', i + 1)
            while text[i - 1:i] == b"\\":
                i = text.index(b'"', i + 1)
        i += 1
    text = text[:start] + new + text[i:]
    if BINARY_HEADER in headers:
        headers[BINARY_HEADER] = str(len(text))
    return text + tail


# What a server must do with a request after a damage: REFUSE it; answer it as it would the undamaged one (SAME: the
# same request to a reader that follows the protocol); or ANY: it may be any request now (or readers differ on it,
# and only a differential judges it).
REFUSE, SAME, ANY = "refuse", "same", "any"


# HTTP-level edges: (name, edge(body, headers, rng) -> body (headers changed in place), what a server must do).
def _header_length(value: Callable[[bytes, dict, random.Random], str]):
    def edge(body, headers, rng):
        headers[BINARY_HEADER] = value(body, headers, rng)
        return body
    return edge


HTTP_BODY_EDGES: Sequence[tuple[str, Callable, str]] = (
    ("header length past the body", _header_length(lambda b, h, r: str(len(b) + r.randint(1, 10**6))), REFUSE),
    ("header length inside the JSON", _header_length(
        lambda b, h, r: str(r.randrange(1, max(2, int(h.get(BINARY_HEADER, len(b))) - 1)))), REFUSE),
    # Triton reads the length with atoi: 0 (and what atoi reads as 0) means the whole body is JSON.
    ("header length zero", _header_length(lambda b, h, r: "0"), ANY),
    ("header length negative", _header_length(lambda b, h, r: str(-r.randint(1, 2**31 - 1))), REFUSE),
    ("header length not a number", _header_length(
        lambda b, h, r: r.choice(("abc", "", "1e3", "0x10", " 12", "99999999999999999999999"))), ANY),
    ("binary_data_size past the end", lambda b, h, r: _replace_json_value(
        b, h, b"binary_data_size", str(r.randint(len(b), 2**40)).encode()), REFUSE),
    ("binary_data_size negative or wrong", lambda b, h, r: _replace_json_value(
        b, h, b"binary_data_size", r.choice((b"-1", b"-9223372036854775808", b"1.5", b'"8"', b"null", b"[]"))), REFUSE),
    ("truncated JSON", lambda b, h, r: _json_cut(b, h, r), REFUSE),
    ("bit flips", lambda b, h, r: _flip_bits(b, r), ANY),
    ("chunk edit", lambda b, h, r: _chunk_edit(b, r), ANY),
    ("not UTF-8 in a string", lambda b, h, r: b.replace(b'"name": "', b'"name": "\xff\xc3\x28', 1), ANY),
    ("deep nesting in data", lambda b, h, r: _replace_json_value(b, h, b"data", _deep(r).encode()), REFUSE),
    ("deep nesting in parameters", lambda b, h, r: _replace_json_value(
        b, h, b"parameters", b'{"x": ' + _deep(r).encode() + b"}"), ANY),
    ("deep nesting in shape", lambda b, h, r: _replace_json_value(b, h, b"shape", _deep(r).encode()), REFUSE),
    ("shape numbers that fit nothing", lambda b, h, r: _replace_json_value(b, h, b"shape", r.choice((
        b"[1e400, 1]", b"[18446744073709551616, 1]", b"[1.5, 1]", b'["1", 1]', b"[-0, 1]", b"[null]", b"{}",
        b"[true]", b"[" + b"1, " * 10_000 + b"1]"))), REFUSE),
    ("inputs not a list", lambda b, h, r: _replace_json_value(b, h, b"inputs", r.choice(
        (b"{}", b"null", b'"payload"', b"1", b"[1]", b"[[]]", b"[null]"))), REFUSE),
    ("data not a list", lambda b, h, r: _replace_json_value(b, h, b"data", r.choice(
        (b"{}", b"null", b'"x"', b"1", b"[[1], 2]", b"[{}]", b"[null]", b"[true, false]", b"[1e400]"))), REFUSE),
    ("parameters not an object", lambda b, h, r: _replace_json_value(
        b, h, b"parameters", r.choice((b"[]", b"1", b'"x"', b"null", b'{"a": [1, {"b": null}]}'))), ANY),
    ("body not an object", lambda b, h, r: r.choice((b"[]", b"null", b"1", b'"infer"', b"[{}]", b"true")), REFUSE),
    ("empty body", lambda b, h, r: b"", REFUSE),
    ("trailing garbage", lambda b, h, r: b if BINARY_HEADER in h else b + r.choice((b"}", b"]]", b" x", b"\x00")),
     ANY),
    ("duplicate keys", lambda b, h, r: b.replace(b"{", b'{"inputs": [], ', 1), ANY),
    ("byte order mark", lambda b, h, r: b"\xef\xbb\xbf" + b if BINARY_HEADER not in h else b, ANY),
    ("content type", lambda b, h, r: h.update({"Content-Type": r.choice((
        "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "",
        "application/json; charset=latin-1", "application/json\x7f"))}) or b, SAME),
    ("gzip that is not gzip", lambda b, h, r: h.update({"Content-Encoding": r.choice(("gzip", "deflate"))}) or b,
     REFUSE),
    ("gzip body", lambda b, h, r: h.update({"Content-Encoding": "gzip"}) or gzip.compress(b, mtime=0), SAME),
    ("gzip bomb", lambda b, h, r: h.update({"Content-Encoding": "gzip"}) or gzip.compress(
        b"[" * 2_000_000, mtime=0), REFUSE),
    ("unknown content encoding", lambda b, h, r: h.update({"Content-Encoding": r.choice(("br", "zstd", "x"))}) or b,
     REFUSE),
)
HTTP_BODY_EDGE_NAMES = tuple(name for name, *_ in HTTP_BODY_EDGES)

# Routes and methods beside the infer route: (method, path) with {m} the model's name.
ROUTES: Sequence[tuple[str, str]] = (
    ("GET", "/v2/models/{m}/infer"), ("PUT", "/v2/models/{m}/infer"), ("DELETE", "/v2/models/{m}/infer"),
    ("PATCH", "/v2/models/{m}/infer"), ("OPTIONS", "/v2/models/{m}/infer"), ("HEAD", "/v2/models/{m}/infer"),
    ("POST", "/v2/models/{m}/versions/abc/infer"), ("POST", "/v2/models/{m}/versions/-1/infer"),
    ("POST", "/v2/models/{m}/versions/99999999999999999999/infer"), ("POST", "/v2/models/{m}/versions//infer"),
    ("POST", "/v2/models//infer"), ("POST", "/v2/models/{m}%00/infer"), ("POST", "/v2/models/{m}/infer/extra"),
    ("POST", "/v2/models/{m}/infer?x=1&&=&%zz"), ("POST", "/v2/models/%2e%2e/{m}/infer"),
    ("POST", "/v2/models/{m}/generate"), ("POST", "/v2/models/{m}/generate_stream"),
    ("POST", "/v2/models/{m}/ready"), ("POST", "/v2/models/{m}"), ("POST", "/v2/models/{m}/config"),
    ("POST", "/v2/models/{m}/stats"), ("GET", "/v2/models/{m}/versions/0/ready"), ("POST", "/v2"),
    ("POST", "/v2/health/live"), ("GET", "/v2/models/" + "m" * 5000 + "/ready"), ("POST", "/v3/models/{m}/infer"),
    ("GET", "/"), ("GET", "//v2//models//{m}"), ("POST", "/v2/repository/index"), ("GET", "/v2/models/{m}/trace/setting"),
    ("POST", "/v2/models/{m}/infer#frag"),
)


def http_request(models: Sequence[Model], payloads: Sequence[bytes], seed: int, index: int) -> HttpRequest:
    """Request `index` of seed `seed` for the HTTP port."""
    rng = random.Random(seed * 1_000_003 + index)
    model = rng.choice(models)
    made = _made(model, rng, payloads)
    spec = made.spec
    binary = [i for i in range(len(spec["inputs"])) if rng.random() < 0.3]
    body, headers = http_body(spec, binary)
    method, path = "POST", infer_path(spec["model_name"], spec.get("model_version", ""))
    roll = rng.random()
    if roll < 0.25:
        name, edge, claim = rng.choice(HTTP_BODY_EDGES)
        before = (body, dict(headers))
        body = edge(body, headers, rng)
        made.names.append(name)
        # an edge that found nothing to change (binary_data_size in a JSON-only body) changes no claim
        if (body, headers) != before:
            made.refused = claim == REFUSE or (claim == SAME and made.refused)
    elif roll < 0.32:
        method, path = rng.choice(ROUTES)
        path = path.replace("{m}", model.name)
        made.names.append(f"route {method} {path[:60]}")
        made.refused = (method in ("POST", "GET", "PUT", "DELETE", "PATCH") and "infer" in path
                        and "#" not in path and "?" not in path)
    if not made.names:
        made.names.append("valid")
    return HttpRequest(" + ".join(made.names), method, path, tuple(headers.items()), body, made.refused,
                       made.triton_defined)


def http_requests(models: Sequence[Model], payloads: Sequence[bytes], seed: int, count: int) -> Iterator[HttpRequest]:
    return (http_request(models, payloads, seed, i) for i in range(count))


# ---- gRPC: the message's fields, and the wire damage its serialized bytes take

def grpc_fields(spec: dict, typed: bool = False) -> dict:
    """`spec` as ModelInferRequest's fields: inputs holding `raw` (all of them unless `typed`) give
    raw_input_contents; the others typed `contents` (their `contents` key names the field, else their datatype's)."""
    message = {"model_name": spec["model_name"], "model_version": spec.get("model_version", ""),
               "id": spec.get("id", ""), "parameters": dict(spec.get("parameters", {})), "inputs": [],
               "outputs": [{"name": o["name"], "parameters": dict(o["parameters"])} for o in spec.get("outputs", [])],
               "raw_input_contents": []}
    for tensor in spec["inputs"]:
        entry = {"name": tensor["name"], "datatype": tensor["datatype"], "shape": list(tensor["shape"]),
                 "parameters": dict(tensor.get("parameters", {}))}
        raw = tensor.get("raw")
        if raw is None and not typed:
            try:
                raw = serialize(tensor["data"], tensor["datatype"])
            except (struct.error, TypeError, OverflowError, AttributeError, KeyError):
                raw = None
        if raw is not None:
            message["raw_input_contents"].append(raw)
        elif tensor["data"]:
            entry["contents"] = {tensor.get("contents") or PREFERRED_CONTENTS.get(tensor["datatype"],
                                                                                  "fp32_contents"): tensor["data"]}
        message["inputs"].append(entry)
    return message


def _mixed_contents(spec, model, rng, payloads):
    tensor = _pick_input(spec, rng)
    tensor["contents"] = rng.choice(CONTENTS_FIELDS)


GRPC_SPEC_EDGES: Sequence[tuple[str, Callable, bool, bool]] = (
    ("typed contents of another field", _mixed_contents, False, True),
)


# protobuf's encoding, by hand
def varint(value: int, width: int = 0) -> bytes:
    """`value` (taken as a 64-bit two's complement) as a varint, padded with continuation bytes to `width` bytes:
    an overlong varint, which protobuf readers accept up to 10 bytes (some only up to 5)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append(value & 0x7F)
        value >>= 7
        if not value:
            break
    while len(out) < width:
        out.append(0)
    for i in range(len(out) - 1):
        out[i] |= 0x80
    return bytes(out)


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    """(value, the offset after it); ValueError past the end or beyond 10 bytes."""
    value = shift = 0
    for i in range(at, min(len(data), at + 10)):
        value |= (data[i] & 0x7F) << shift
        shift += 7
        if not data[i] & 0x80:
            return value & ((1 << 64) - 1), i + 1
    raise ValueError("varint past the end or longer than 10 bytes")


@dataclass(frozen=True)
class WireField:
    number: int
    wire_type: int
    start: int  # the tag's first byte
    value_start: int  # after the tag (and after the length, for length-delimited fields)
    end: int


def wire_fields(data: bytes) -> list[WireField]:
    """The top-level fields of a protobuf message (varint, fixed and length-delimited only); ValueError if it is
    not one."""
    fields, at = [], 0
    while at < len(data):
        tag, after = read_varint(data, at)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, end = read_varint(data, after)
            value_start = after
        elif wire_type == 1:
            value_start, end = after, after + 8
        elif wire_type == 5:
            value_start, end = after, after + 4
        elif wire_type == 2:
            size, value_start = read_varint(data, after)
            end = value_start + size
        else:
            raise ValueError(f"wire type {wire_type}")
        if end > len(data) or number == 0:
            raise ValueError("a field past the end or numbered 0")
        fields.append(WireField(number, wire_type, at, value_start, end))
        at = end
    return fields


def _retagged(data: bytes, f: WireField, tag: bytes) -> bytes:
    return data[: f.start] + tag + data[f.start + len(varint((f.number << 3) | f.wire_type)):]


def _relength(data: bytes, f: WireField, length: bytes) -> bytes:
    tag_end = f.start + len(varint((f.number << 3) | f.wire_type))
    return data[:tag_end] + length + data[f.value_start:]


def _pick_field(data: bytes, rng: random.Random, length_delimited: bool = False) -> WireField | None:
    try:
        fields = [f for f in wire_fields(data) if f.wire_type == 2 or not length_delimited]
    except ValueError:
        return None
    return rng.choice(fields) if fields else None


def _overlong_tag(low: int, high: int):
    def damage(data: bytes, rng: random.Random) -> bytes:
        f = _pick_field(data, rng)
        return _retagged(data, f, varint((f.number << 3) | f.wire_type, rng.randint(low, high))) if f else data
    return damage


def _overlong_length(low: int, high: int):
    def damage(data: bytes, rng: random.Random) -> bytes:
        f = _pick_field(data, rng, length_delimited=True)
        return _relength(data, f, varint(f.end - f.value_start, rng.randint(low, high))) if f else data
    return damage


def _too_many_continuations(data: bytes, rng: random.Random) -> bytes:
    f = _pick_field(data, rng)
    return _retagged(data, f, b"\x80" * rng.randint(10, 20) + b"\x01") if f else data


def _length_past_end(data: bytes, rng: random.Random) -> bytes:
    f = _pick_field(data, rng, length_delimited=True)
    if not f:
        return data
    size = f.end - f.value_start + rng.choice((1, 2, len(data), 2**31 - 1, 2**32, 2**63, 2**64 - 1))
    return _relength(data, f, varint(size))


def _invalid_wire_type(data: bytes, rng: random.Random) -> bytes:
    f = _pick_field(data, rng)
    return _retagged(data, f, varint((f.number << 3) | rng.choice((3, 4, 6, 7)))) if f else data


def _field_zero(data: bytes, rng: random.Random) -> bytes:
    return data + rng.choice((b"\x00\x00", b"\x02\x00", b"\x80\x00\x00"))


def _unknown_field(data: bytes, rng: random.Random) -> bytes:
    return data + varint((rng.choice((8, 99, 536870911)) << 3) | 0) + varint(rng.randrange(2**64))


def _wrong_wire_type_for_field(data: bytes, rng: random.Random) -> bytes:
    f = _pick_field(data, rng)
    if not f:
        return data
    return data[: f.start] + varint(f.number << 3) + varint(rng.randrange(2**64)) + data[f.end:]


def _not_utf8_string(data: bytes, rng: random.Random) -> bytes:
    try:
        strings = [f for f in wire_fields(data) if f.number in (1, 3) and f.end > f.value_start]
    except ValueError:
        return data
    if not strings:
        return data
    f = rng.choice(strings)
    bad = rng.choice((b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"))
    return data[: f.start] + varint((f.number << 3) | 2) + varint(f.end - f.value_start + len(bad)) + \
        data[f.value_start:f.end] + bad + data[f.end:]


def _nested(damage: Callable[[bytes, random.Random], bytes]):
    """`damage` inside one input or output (fields 5, 6), the outer length kept true to the damaged bytes."""
    def nested(data: bytes, rng: random.Random) -> bytes:
        try:
            inner = [f for f in wire_fields(data) if f.number in (4, 5, 6) and f.wire_type == 2]
        except ValueError:
            return data
        if not inner:
            return data
        f = rng.choice(inner)
        body = damage(data[f.value_start:f.end], rng)
        return data[: f.start] + varint((f.number << 3) | 2) + varint(len(body)) + body + data[f.end:]
    return nested


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))] if data else data


# (name, damage, what a server must do with the damaged message, as for HTTP_BODY_EDGES)
WIRE_DAMAGE: Sequence[tuple[str, Callable[[bytes, random.Random], bytes], str]] = (
    ("truncated", _truncate, ANY),
    ("bit flips", _flip_bits, ANY),
    ("chunk edit", _chunk_edit, ANY),
    ("overlong tag within 5 bytes", _overlong_tag(2, 5), SAME),
    ("overlong tag of 6 to 10 bytes", _overlong_tag(6, 10), ANY),
    ("overlong length within 5 bytes", _overlong_length(2, 5), SAME),
    ("overlong length of 6 to 10 bytes", _overlong_length(6, 10), ANY),
    ("varint past 10 bytes", _too_many_continuations, REFUSE),
    ("length past the end", _length_past_end, REFUSE),
    ("invalid wire type", _invalid_wire_type, REFUSE),
    ("field number 0", _field_zero, REFUSE),
    ("unknown field", _unknown_field, SAME),
    ("varint where a string is", _wrong_wire_type_for_field, ANY),
    ("string that is not UTF-8", _not_utf8_string, REFUSE),
    ("nested overlong tag", _nested(_overlong_tag(6, 10)), ANY),
    ("nested length past the end", _nested(_length_past_end), REFUSE),
    ("nested invalid wire type", _nested(_invalid_wire_type), REFUSE),
    ("nested truncated", _nested(_truncate), ANY),
    ("empty message", lambda d, r: b"", REFUSE),
)
WIRE_DAMAGE_NAMES = tuple(name for name, *_ in WIRE_DAMAGE)
_DAMAGE = {name: damage for name, damage, _ in WIRE_DAMAGE}


def damaged(data: bytes, name: str, seed: int) -> bytes:
    """A serialized message with WIRE_DAMAGE `name`, the same bytes for the same seed."""
    return _DAMAGE[name](data, random.Random(seed))


def grpc_request(models: Sequence[Model], payloads: Sequence[bytes], seed: int, index: int) -> GrpcRequest:
    """Request `index` of seed `seed` for the gRPC port."""
    rng = random.Random(seed * 1_000_003 + index)
    model = rng.choice(models)
    made = _made(model, rng, payloads)
    if rng.random() < 0.1:
        name, edge, refused, defined = rng.choice(GRPC_SPEC_EDGES)
        edge(made.spec, model, rng, payloads)
        made.names.append(name)
        made.refused |= refused
    typed = rng.random() < 0.15
    if typed:
        made.names.append("typed contents")
    damage, damage_seed, refused = None, 0, made.refused
    if rng.random() < 0.35:
        damage, _, claim = rng.choice(WIRE_DAMAGE)
        damage_seed = rng.randrange(2**32)
        made.names.append(damage)
        refused = claim == REFUSE or (claim == SAME and made.refused)
    return GrpcRequest(" + ".join(made.names) or "valid", grpc_fields(made.spec, typed), damage, damage_seed,
                       refused, made.triton_defined)


def grpc_requests(models: Sequence[Model], payloads: Sequence[bytes], seed: int, count: int) -> Iterator[GrpcRequest]:
    return (grpc_request(models, payloads, seed, i) for i in range(count))


def grpc_stream(models: Sequence[Model], payloads: Sequence[bytes], seed: int, index: int) -> GrpcStream:
    """Stream `index` of seed `seed`: 1 to 30 requests, any of them hostile."""
    rng = random.Random(seed * 1_000_003 + index + 7_777_777)
    size = rng.randint(1, 30)
    requests = tuple(grpc_request(models, payloads, seed + 1, index * 31 + i) for i in range(size))
    return GrpcStream(f"stream of {size}", requests)


# ---- shrinking

def _candidates(value) -> Iterator:
    """Smaller variants of a plain value, the smallest first."""
    if isinstance(value, dict):
        for key in list(value):
            yield {k: v for k, v in value.items() if k != key}
        for key, v in value.items():
            for smaller in _candidates(v):
                yield {**value, key: smaller}
    elif isinstance(value, (list, tuple)):
        n = len(value)
        if n:
            yield type(value)()
        if n > 2:
            yield type(value)(value[: n // 2])
            yield type(value)(value[n // 2:])
        for i in range(n if n > 1 else 0):
            yield type(value)([*value[:i], *value[i + 1:]])
        for i, v in enumerate(value):
            for smaller in _candidates(v):
                yield type(value)([*value[:i], smaller, *value[i + 1:]])
    elif isinstance(value, (str, bytes)):
        n = len(value)
        if n:
            yield value[:0]
            yield value[: n // 2]
            yield value[n // 2:]
            if n <= 64:
                for i in range(n):
                    yield value[:i] + value[i + 1:]
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int) and value not in (0, 1):
        yield 0
        yield 1
        step = abs(value) // 2
        while step:  # toward zero in halving steps, as a bisection would
            yield value - step if value > 0 else value + step
            step //= 2
    elif isinstance(value, float) and value not in (0.0, 1.0) and value == value:
        yield 0.0


def size_of(value) -> int:
    if isinstance(value, dict):
        return 1 + sum(size_of(k) + size_of(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 1 + sum(size_of(v) for v in value)
    if isinstance(value, (str, bytes)):
        return 1 + len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return 1 + abs(value)
    return 1


def shrink(value, fails: Callable[[object], bool], max_tries: int = 2000):
    """The smallest variant of `value` found (greedily: dict keys and list items dropped, strings, bytes and
    numbers cut) for which `fails` still holds; `value` itself if none does within `max_tries` calls of `fails`."""
    tries = 0
    improved = True
    while improved and tries < max_tries:
        improved = False
        for candidate in _candidates(value):
            if size_of(candidate) >= size_of(value):
                continue
            tries += 1
            if fails(candidate):
                value, improved = candidate, True
                break
            if tries >= max_tries:
                break
    return value
