"""Triton model configs (config.pbtxt) checked against what they serve (`s2t/triton_config.py` reads them).

`check_repositories` is what `s2t check-config` and the tests run: every config against its model file or
python model, every ensemble's wiring against the models it calls, the scorer a fused pipeline names, and one
decision policy across the models that decide.
"""
from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path
from typing import Iterable

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from s2t.backends.scoring.decision_policy import Thresholds
from s2t.backends.runtime.model_parameters import read_parameters, unknown_parameters
from s2t.backends.scoring.ort_runner import OrtSettings
from s2t.backends.runtime.repository_layout import version_numbers
from s2t.backends.streaming.session import StreamModelSettings, check_sequence_batching
from s2t.models.serving_image import SERVING_IMAGE, release_of, same_release
from s2t.triton_config import (MODEL_PY_BACKENDS, Tensor, backend_parameters, engine_report_path, is_engine, is_onnx, load,
                               model_filename, tensors)

ONNX_TO_CONFIG = {
    1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16", 6: "TYPE_INT32",
    7: "TYPE_INT64", 8: "TYPE_STRING", 9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64", 12: "TYPE_UINT32",
    13: "TYPE_UINT64",
}


def onnx_io(path: Path, batched: bool) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The ONNX file's inputs and outputs as a config would declare them (batch dimension dropped)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}

    def describe(values) -> dict[str, Tensor]:
        out = {}
        for v in values:
            if v.name in initializers:
                continue
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim)
            out[v.name] = Tensor(v.name, ONNX_TO_CONFIG.get(v.type.tensor_type.elem_type, "TYPE_INVALID"),
                                 dims[1:] if batched else dims)
        return out
    return describe(graph.input), describe(graph.output)


def _dims_match(declared: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    return len(declared) == len(actual) and all(a in (-1, d) or d == -1 for d, a in zip(declared, actual))


def check_onnx_against_config(config: mc.ModelConfig, onnx_path: Path) -> list[str]:
    inputs, outputs = onnx_io(onnx_path, config.max_batch_size > 0)
    problems = []
    for kind, declared, actual in (("input", tensors(config.input), inputs),
                                   ("output", tensors(config.output), outputs)):
        for name, tensor in declared.items():
            model_tensor = actual.get(name)
            if model_tensor is None:
                problems.append(f"{config.name}: {kind} {name!r} is not in {onnx_path.name} "
                                f"(it has {', '.join(sorted(actual)) or 'none'})")
            elif model_tensor.data_type != tensor.data_type:
                problems.append(f"{config.name}: {kind} {name!r} is {tensor.data_type} in the config, "
                                f"{model_tensor.data_type} in {onnx_path.name}")
            elif not _dims_match(tensor.dims, model_tensor.dims):
                problems.append(f"{config.name}: {kind} {name!r} has dims {list(tensor.dims)} in the config, "
                                f"{list(model_tensor.dims)} in {onnx_path.name}")
        if kind == "input":
            for name in sorted(set(actual) - set(declared)):
                problems.append(f"{config.name}: the model needs input {name!r}, the config does not declare it")
    return problems


def check_engine_against_config(config: mc.ModelConfig, plan: Path) -> list[str]:
    """A TensorRT engine against its config, from the build report beside it (`s2t build-trt` writes it).

    The engine itself can only be opened by TensorRT on a GPU; the report says what it was built for. The
    repositories are served by SERVING_IMAGE, whose TensorRT refuses an engine of any other release (and a parity
    gate run with another local TensorRT would not notice).
    """
    report_path = engine_report_path(plan)
    if not report_path.is_file():
        return [f"{config.name}: {plan} has no build report {report_path.name} (which TensorRT, GPU and batch "
                "profile built it is unknown)"]
    report = json.loads(report_path.read_text())
    problems = []
    built_with, served_with = str(report.get("tensorrt", "unknown")), release_of(SERVING_IMAGE).tensorrt
    if not same_release(built_with, served_with):
        problems.append(f"{config.name}: the engine was built with TensorRT {built_with}, but {SERVING_IMAGE} runs "
                        f"TensorRT {served_with} and loads only its own engines: rebuild it in .venv-gpu "
                        "(`make gpu-models`)")
    shapes = report.get("shapes", {})
    declared = {t.name: tuple(t.dims) for t in config.input}
    if set(shapes) != set(declared):
        problems.append(f"{config.name}: the engine takes {sorted(shapes)}, the config declares {sorted(declared)}")
    for name, dims in declared.items():
        if name in shapes and tuple(shapes[name][0][1:]) != dims:
            problems.append(f"{config.name}: input {name!r} is declared {list(dims)}, the engine takes "
                            f"{shapes[name][0][1:]}")
    maximum = report.get("profile", {}).get("maximum", 0)
    if maximum < config.max_batch_size:
        problems.append(f"{config.name}: max_batch_size {config.max_batch_size} exceeds the engine's profile "
                        f"(up to {maximum})")
    return problems


def _check_ensemble(config: mc.ModelConfig, configs: dict[str, mc.ModelConfig]) -> list[str]:
    problems = []
    available = tensors(config.input)
    for number, step in enumerate(config.ensemble_scheduling.step):
        where = f"{config.name} step {number} ({step.model_name})"
        member = configs.get(step.model_name)
        if member is None:
            problems.append(f"{where}: no model {step.model_name!r} in the repositories")
            continue
        if member.max_batch_size == 0 and config.max_batch_size > 0:
            problems.append(f"{where}: the ensemble batches but {step.model_name} has max_batch_size 0")
        member_inputs, member_outputs = tensors(member.input), tensors(member.output)
        for model_name, ensemble_name in step.input_map.items():
            if model_name not in member_inputs:
                problems.append(f"{where}: input_map names {model_name!r}, not an input of {step.model_name}")
            elif ensemble_name not in available:
                problems.append(f"{where}: {ensemble_name!r} is not produced before this step")
            else:
                have, want = available[ensemble_name], member_inputs[model_name]
                if (have.data_type, have.dims) != (want.data_type, want.dims):
                    problems.append(f"{where}: {ensemble_name!r} is {have.data_type}{list(have.dims)}, "
                                    f"{step.model_name}.{model_name} wants {want.data_type}{list(want.dims)}")
        for name in sorted(set(member_inputs) - set(step.input_map) - {i.name for i in member.input if i.optional}):
            problems.append(f"{where}: required input {name!r} of {step.model_name} is not mapped")
        for model_name, ensemble_name in step.output_map.items():
            if model_name not in member_outputs:
                problems.append(f"{where}: output_map names {model_name!r}, not an output of {step.model_name}")
            else:
                available[ensemble_name] = Tensor(ensemble_name, member_outputs[model_name].data_type,
                                                  member_outputs[model_name].dims)
    for name, tensor in tensors(config.output).items():
        produced = available.get(name)
        if produced is None:
            problems.append(f"{config.name}: output {name!r} is produced by no step")
        elif (produced.data_type, produced.dims) != (tensor.data_type, tensor.dims):
            problems.append(f"{config.name}: output {name!r} is declared {tensor.data_type}{list(tensor.dims)}, "
                            f"produced {produced.data_type}{list(produced.dims)}")
    return problems


def _check_scorer_reference(config: mc.ModelConfig, model_dir: Path, configs: dict[str, mc.ModelConfig]) -> list[str]:
    """A python model that runs a scorer in its stub (`scorer_model`, `scorer_version`): the scorer must be an ONNX
    model of the same repository, and a version named must exist there."""
    parameters = backend_parameters(config)
    scorer = parameters["scorer_model"]["string_value"]
    version = parameters.get("scorer_version", {}).get("string_value", "").strip()
    scorer_dir = model_dir.parent / scorer
    if scorer not in configs or not (scorer_dir / "config.pbtxt").is_file():
        return [f"{config.name}: scorer_model {scorer!r} is not a model of its repository {model_dir.parent}"]
    if not is_onnx(configs[scorer]):
        return [f"{config.name}: scorer_model {scorer!r} is not an ONNX model"]
    if version and not (scorer_dir / version / model_filename(configs[scorer])).is_file():
        return [f"{config.name}: scorer_version {version} of {scorer} has no {model_filename(configs[scorer])}"]
    return []


def _check_one_decision_policy(configs: dict[str, mc.ModelConfig]) -> list[str]:
    """Every model that decides carries the same thresholds: one policy, whichever path serves the record."""
    policies = {}
    for name, config in configs.items():
        parameters = backend_parameters(config)
        if "review_threshold" in parameters or "decline_threshold" in parameters:
            try:
                policies[name] = read_parameters(Thresholds, parameters)
            except ValueError as err:
                return [f"{name}: {err}"]
    if len(set(policies.values())) > 1:
        return ["the decision thresholds differ between models: " + ", ".join(
            f"{name} review {t.review:g} decline {t.decline:g}" for name, t in sorted(policies.items()))]
    return []


def _model_file_check(config: mc.ModelConfig):
    """The checker of the one model file per version, for ONNX and TensorRT models; None for the others."""
    if is_onnx(config):
        return check_onnx_against_config
    if is_engine(config):
        return check_engine_against_config
    return None


def declared_settings(model_dir: Path) -> tuple[type, ...]:
    """The settings classes a python model reads its `parameters` into, as its newest model.py declares them
    (`SETTINGS = X` or a tuple, read by backends/runtime/triton_glue.py), found without importing the file (it needs
    Triton's stub). A model.py that declares none is not checked."""
    files = [Path(model_dir) / str(v) / "model.py" for v in sorted(version_numbers(Path(model_dir)), reverse=True)]
    model_py = next((f for f in files if f.is_file()), None)
    if model_py is None:
        return ()
    tree = ast.parse(model_py.read_text(), str(model_py))
    imported = {alias.asname or alias.name: (node.module, alias.name) for node in tree.body
                if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
    names = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SETTINGS" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            names = [v.id for v in values if isinstance(v, ast.Name)]
    return tuple(getattr(importlib.import_module(imported[n][0]), imported[n][1])
                 for n in dict.fromkeys(names) if n in imported)


def check_parameters(name: str, config: mc.ModelConfig, model_dir: Path) -> list[str]:
    """Every parameter a python model's config sets is one its settings read, and each value parses: a typo would
    otherwise keep a default silently, and a bad value would only show when Triton refuses the model. ONNX models
    are checked for the values our ONNX Runtime backend reads (the native backend takes more keys)."""
    parameters = {key: {"string_value": value.string_value} for key, value in config.parameters.items()}
    if is_onnx(config):
        classes, strict = (OrtSettings,), False
    elif config.backend in MODEL_PY_BACKENDS and (classes := declared_settings(model_dir)):
        strict = True
    else:
        return []
    problems = []
    if strict:
        unknown = set(parameters)
        for cls in classes:
            unknown &= set(unknown_parameters(cls, parameters))
        problems += [f"{name}: parameter {key} is not one the model reads" for key in sorted(unknown)]
    for cls in classes:
        try:
            settings = read_parameters(cls, parameters)
            if cls is StreamModelSettings:
                # The model refuses to load on this too; said here before any server is started.
                check_sequence_batching(settings, json_format.MessageToDict(config.sequence_batching,
                                                                            preserving_proto_field_name=True))
        except ValueError as err:
            problems.append(f"{name}: {err}")
    return problems


def check_repositories(repositories: Iterable[Path]) -> list[str]:
    """Every problem found, as one line each; an empty list means every config fits what it serves."""
    configs, dirs, problems = {}, {}, []
    for repo in repositories:
        for model_dir in sorted(p for p in Path(repo).iterdir() if (p / "config.pbtxt").is_file()):
            try:
                config = load(model_dir)
            except ValueError as err:
                problems.append(str(err))
                continue
            if config.name and config.name != model_dir.name:
                problems.append(f"{model_dir}: config name {config.name!r} differs from the folder name")
            config.name = config.name or model_dir.name
            if config.name in configs:
                problems.append(f"{model_dir}: model {config.name!r} is defined twice")
            configs[config.name], dirs[config.name] = config, model_dir
    for name, config in configs.items():
        model_dir = dirs[name]
        found = version_numbers(model_dir)
        problems += check_parameters(name, config, model_dir)
        if config.platform == "ensemble":
            problems += _check_ensemble(config, configs)
        elif (check := _model_file_check(config)) is not None:
            filename = model_filename(config)
            for version in found:
                path = model_dir / str(version) / filename
                if not path.is_file():
                    problems.append(f"{name}: version {version} has no {filename}")
                else:
                    problems += check(config, path)
        elif config.backend in MODEL_PY_BACKENDS:
            for version in found:
                if not (model_dir / str(version) / "model.py").is_file():
                    problems.append(f"{name}: version {version} has no model.py")
            if "scorer_model" in config.parameters:
                problems += _check_scorer_reference(config, model_dir, configs)
        if not found:
            hint = (" (engines are built on the serving GPU: `s2t build-trt`, then `s2t publish`)"
                    if config.platform == "tensorrt_plan" else "")
            problems.append(f"{name}: no version folder{hint}")
    return problems + _check_one_decision_policy(configs)
