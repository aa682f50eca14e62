"""The layers of docs/architecture.md, enforced: what each folder may import (imports inside functions count), no
import cycle between the project's modules, and no model that reads another model's folder."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from s2t.project_imports import imported_project_modules, project_files, source_module

ROOT = Path(__file__).resolve().parents[2]

# The project is one package, s2t. Its layers, lowest first: the wire format; the pure logic the models run
# (backends/); the callers' clients; the legacy service; the gateway in front of Triton; and the rest of s2t (the
# command line and the libraries under it, layered below). layer -> the layers it may import from (its own included).
ALLOWED = {
    "wire": {"wire"},
    "backends": {"backends", "wire"},
    "models": {"backends", "wire"},
    "clients": {"clients", "wire"},
    "legacy": {"legacy", "clients", "backends", "wire"},
    "gateway": {"gateway", "clients", "backends", "wire", "shared"},
    "s2t": {"s2t", "gateway", "legacy", "clients", "backends", "wire", "shared"},
    # What the gateway and the rest of s2t share that no model runs: files written whole or not at all.
    "shared": {"shared"},
}
LOWER = ("wire", "backends", "clients", "legacy", "gateway")
SHARED = {"s2t.atomic_files"}
# Inside backends/, by role: subpackage -> the subpackages it may import from (its own included). The runtime
# (the glue to Triton's backends and what every model shares) knows no domain; records know no scorer.
BACKENDS_ALLOWED = {
    "runtime": {"runtime"},
    "records": {"records", "runtime"},
    "scoring": {"scoring", "records", "runtime"},
    "routing": {"routing", "scoring", "records", "runtime"},
    "streaming": {"streaming", "scoring", "records", "runtime"},
    "llm": {"llm", "routing", "scoring", "records", "runtime"},
}


def module_layer(module: str) -> str | None:
    """The layer of a module (or of a name imported from it) of the project; None outside it."""
    parts = module.split(".")
    if parts[0] != "s2t":
        return None
    if ".".join(parts[:2]) in SHARED:
        return "shared"
    return parts[1] if len(parts) > 1 and parts[1] in LOWER else "s2t"


def layer(path: Path) -> str | None:
    parts = path.relative_to(ROOT).parts
    if parts[0].startswith("model_repository") or parts[0] == "ensembles" or path.name == "model.py":
        return "models"  # the Python-based ONNX Runtime backend's model.py is a model like the repositories' ones
    module = source_module(ROOT, path)
    return module_layer(module) if module is not None else None


def backends_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["s2t", "backends"] and len(parts) > 2 else None


@cache
def project_sources() -> tuple[Path, ...]:
    """Found once per run, and never by walking the hidden folders: the virtual environments there hold tens of
    thousands of .py files that no layer holds."""
    tops = (top for top in ROOT.iterdir() if not top.name.startswith("."))
    return tuple(sorted(p for top in tops for p in ([top] if top.is_file() else top.rglob("*.py"))
                        if p.suffix == ".py" and layer(p) is not None
                        and "__pycache__" not in p.parts and not p.name.endswith("_pb2.py")
                        and not p.name.endswith("_pb2_grpc.py")))


@cache
def imported_modules(path: Path) -> frozenset[str]:
    required, maybe = imported_project_modules(path)
    return frozenset(required | maybe)


# Inside s2t/, lowest first: a module may import from its own layer and those before it, never from one after it.
# The leaves (readers every layer shares) import no other s2t module; the command line, the package s2t/cli/ and
# nothing else, sits on top of everything. The lower layers (LOWER) are below all of these.
S2T_LAYERS = ("leaf", "models", "gate", "control", "serve", "bench", "soak", "cli")
S2T_LEAVES = {"s2t", "s2t.errors", "s2t.on_progress", "s2t.project_imports", "s2t.prometheus_text",
              "s2t.triton_admin", "s2t.triton_config"}


def s2t_layer(module: str) -> str | None:
    """The s2t layer of a module or of a name imported from it; None for a module no layer holds."""
    parts = module.split(".")
    top = ".".join(parts[:2])
    if module == "s2t" or top in S2T_LEAVES - {"s2t"}:
        return "leaf"
    return parts[1] if parts[0] == "s2t" and len(parts) > 1 and parts[1] in S2T_LAYERS else None


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Every import from an s2t module into a later layer or into another leaf, and every s2t module no layer holds.
    (`from s2t import x` also names the package `s2t`, whose __init__ is empty.)"""
    found = []
    for source, targets in sorted(edges.items()):
        here = s2t_layer(source)
        if here is None:
            found.append(f"{source} is in no s2t layer (add it to S2T_LEAVES or a layer's folder)")
            continue
        for target in sorted(t for t in targets if module_layer(t) == "s2t" and t != "s2t"):
            there = s2t_layer(target)
            if there is None:
                found.append(f"{source} imports {target}, which is in no s2t layer")
            elif S2T_LAYERS.index(there) > S2T_LAYERS.index(here) or here == there == "leaf":
                found.append(f"{source} ({here}) imports {target} ({there})")
    return found


def module_name(path: Path) -> str:
    module = source_module(ROOT, path)
    assert module is not None, f"{path} is no module of the project"
    return module


def crossing_edges(sources: dict[str, tuple[str, set[str]]]) -> list[str]:
    """Every import of `sources` (name -> (its layer, the modules it imports)) against ALLOWED and, inside
    backends/, against BACKENDS_ALLOWED."""
    crossings = []
    for name, (here, modules) in sorted(sources.items()):
        for module in sorted(modules):
            there = module_layer(module)
            if there not in ALLOWED[here]:
                crossings.append(f"{name} ({here}) imports {module} ({there})")
            elif here == there == "backends" and (part := backends_part(name)) is not None:
                target = backends_part(module)
                if target is not None and target not in BACKENDS_ALLOWED.get(part, set()):
                    crossings.append(f"{name} (backends.{part}) imports {module} (backends.{target})")
    return crossings


def test_every_import_follows_an_allowed_edge():
    sources = {str(p.relative_to(ROOT)): (layer(p), imported_modules(p)) for p in project_sources()}
    sources = {name: (here, {m for m in modules if module_layer(m)}) for name, (here, modules) in sources.items()}
    renamed = {}
    for path in project_sources():
        here, modules = sources[str(path.relative_to(ROOT))]
        renamed[module_name(path) if here != "models" else str(path.relative_to(ROOT))] = (here, modules)
    assert crossing_edges(renamed) == []


@pytest.mark.parametrize("name, here, module, found", [
    ("s2t.backends.records.record_decoder", "backends", "s2t.backends.scoring.ort_runner",
     "(backends.records) imports s2t.backends.scoring.ort_runner (backends.scoring)"),
    ("s2t.backends.runtime.triton_glue", "backends", "s2t.backends.records.record_decoder",
     "(backends.runtime) imports s2t.backends.records.record_decoder (backends.records)"),
    ("s2t.backends.scoring.ort_runner", "backends", "s2t.gate.parity", "(backends) imports s2t.gate.parity (s2t)"),
    ("s2t.legacy.service", "legacy", "s2t.gateway.triton_infer",
     "(legacy) imports s2t.gateway.triton_infer (gateway)"),
    ("s2t.clients.risk_client", "clients", "s2t.backends.runtime.bytes_tensor", "(clients) imports"),
    ("s2t.backends.llm.explainer", "backends", "s2t.backends.scoring.reason_codes", None),
    ("s2t.gate.parity", "s2t", "s2t.gateway.dual_run", None),
])
def test_the_edge_check_refuses_an_import_against_the_table(name, here, module, found):
    crossings = crossing_edges({name: (here, {module})})
    assert (crossings == []) if found is None else (len(crossings) == 1 and found in crossings[0]), crossings


def test_s2t_imports_point_only_down_its_layers():
    edges = {module_name(p): imported_modules(p) for p in project_sources() if layer(p) == "s2t"}
    assert upward_imports(edges) == []


# The legacy service is the "before" a cutover is measured against: it must run as it did, whatever happens to its
# replacement. Nothing it reaches by import may belong to the gateway or to Triton's serving (the layers say the
# first; this follows every import through the modules it reaches).
LEGACY_SERVICE = ROOT / "s2t" / "legacy" / "service.py"
REPLACEMENT_MODULES = ("s2t.gateway", "s2t.serve")
TRITON_PACKAGES = {"tritonclient", "tritonserver", "pytriton", "triton_python_backend_utils"}


def replacement_reached(start: Path) -> list[str]:
    """The gateway's-side and Triton-serving modules, and Triton's own packages, that `start` reaches by import."""
    reached = project_files(ROOT, [start]) | {start}
    names = {module_name(p) for p in reached}
    found = sorted(n for n in names if any(n == m or n.startswith(m + ".") for m in REPLACEMENT_MODULES))
    found += sorted(f"{module_name(p)} imports {package}" for p in reached
                    for package in imported_third_party(p) & TRITON_PACKAGES)
    return found


def test_the_legacy_service_imports_nothing_of_its_replacement_nor_of_tritons_serving():
    assert replacement_reached(LEGACY_SERVICE) == []


def test_the_replacement_check_sees_what_the_gateway_reaches():
    assert "s2t.gateway.triton_infer" in replacement_reached(ROOT / "s2t" / "gateway" / "skill_gateway.py")


def test_the_pure_logic_imports_nothing_of_triton():
    """backends/ runs where no server does (the unit tests, the keeper's image): Triton's modules come in as
    arguments (the python backend's pb_utils) or not at all."""
    found = [f"{p.relative_to(ROOT)} imports {package}" for p in project_sources() if layer(p) == "backends"
             for package in sorted(imported_third_party(p) & TRITON_PACKAGES)]
    assert [p for p in project_sources() if layer(p) == "backends"] and found == []


def test_the_s2t_layer_check_finds_an_upward_import():
    found = upward_imports({"s2t.gate.example": {"s2t.control.rollout.Rollout", "s2t.models.convert"},
                            "s2t.models.example": {"s2t.gate"}, "s2t.triton_config": {"s2t.on_progress"},
                            "s2t.bench.example": {"s2t.serve.triton_server", "s2t.cli"},
                            "s2t.serve.example": {"s2t.control.version_store", "s2t.triton_config.load"},
                            "s2t.elsewhere": set()})
    assert found == ["s2t.bench.example (bench) imports s2t.cli (cli)",
                     "s2t.elsewhere is in no s2t layer (add it to S2T_LEAVES or a layer's folder)",
                     "s2t.gate.example (gate) imports s2t.control.rollout.Rollout (control)",
                     "s2t.models.example (models) imports s2t.gate (gate)",
                     "s2t.triton_config (leaf) imports s2t.on_progress (leaf)"]


def test_the_project_modules_import_each_other_without_a_cycle():
    modules = {module_name(p): p for p in project_sources() if layer(p) != "models"}
    graph = {name: {m for m in imported_modules(path) if m in modules and m != name} for name, path in modules.items()}
    cycles, state = [], {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_command_line_is_the_s2t_cli_package_alone():
    """Only s2t/cli/ talks to people through click; below it, modules return values and raise S2TErrors."""
    command_line = sorted(module_name(p) for p in project_sources() if layer(p) == "s2t"
                          and s2t_layer(module_name(p)) == "cli")
    stray = [module_name(p) for p in project_sources() if layer(p) == "s2t" and p.parent != ROOT / "s2t" / "cli"
             and "click" in imported_third_party(p)]
    assert command_line and all(m.startswith("s2t.cli.") or m == "s2t.cli" for m in command_line)
    assert stray == []


# A command module parses options and calls the library: past this, a command is doing the library's work.
CLI_MODULE_MAX_LINES = 150


def test_every_command_module_is_short():
    modules = sorted((ROOT / "s2t" / "cli").glob("*.py"))
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in modules if (n := len(p.read_text().splitlines())) >
            CLI_MODULE_MAX_LINES]
    assert len(modules) > 5 and long == []


def test_no_command_turns_an_error_into_an_exit_code_of_its_own():
    """s2t/cli/failures.py maps errors to exit codes once; a command that catches to exit would be a second way."""
    own_mapping = re.compile(r"ClickException\(|\bfailure\(|_live_errors|exit_code\s*=")
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sorted((ROOT / "s2t" / "cli").glob("*.py"))
             if p.name != "failures.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if own_mapping.search(line)]
    assert found == []


@cache
def imported_third_party(path: Path) -> frozenset[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return frozenset(names)


def test_no_model_config_points_into_another_models_folder():
    outside = re.compile(r'string_value:\s*"(\.\./[^"]*)"')
    found = [f"{config.relative_to(ROOT)}: {match}"
             for config in sorted(ROOT.glob("model_repository*/*/config.pbtxt"))
             for match in outside.findall(config.read_text())]
    assert found == []


def test_the_checks_see_every_layer():
    seen = {layer(p) for p in project_sources()}
    assert seen == set(ALLOWED)


def test_files_for_other_readers_are_written_one_way_only():
    """s2t/atomic_files.py is the one place that stages and renames; a second copy would drift from it."""
    staged_write = re.compile(r"os\.replace\(|os\.rename\(|\.rename\(|\.replace\((?:out|dest|path|target|output|cached)\)")
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in project_sources() if path != ROOT / "s2t" / "atomic_files.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if staged_write.search(line)]
    assert found == []


# A model.py declares what it serves (settings, inputs/outputs, the pure function); the glue is
# backends/runtime/triton_glue.py.
MODEL_PY_MAX_LINES = 80
GLUED_MODELS = sorted([*ROOT.glob("model_repository*/*/[0-9]*/model.py"),
                       ROOT / "backends" / "runtime" / "onnxruntime" / "model.py"])
OWN_GLUE = {
    "an _error helper": re.compile(r"^def _error\b", re.M),
    "a catch-all": re.compile(r"except Exception"),
    "its own TritonError": re.compile(r"\bTritonError\b"),
    "the config JSON parsed": re.compile(r"json\.loads\("),
    "a fault point": re.compile(r"fault_points\."),
    "a BLS call": re.compile(r"\.exec\("),
    "its own response sender": re.compile(r"\bStreamSender\(|\bOutbox\(|get_response_sender\("),
    "its own decoupled check": re.compile(r"using_decoupled_model_transaction_policy"),
    "its own parameter reading": re.compile(r"\bread_parameters\(|\.from_parameters\("),
}


def test_every_model_py_is_a_short_declaration():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in GLUED_MODELS
            if (n := len(p.read_text().splitlines())) > MODEL_PY_MAX_LINES]
    assert GLUED_MODELS and long == []


def test_no_model_py_keeps_glue_of_its_own():
    found = [f"{p.relative_to(ROOT)}: {what}" for p in GLUED_MODELS
             for what, pattern in OWN_GLUE.items() if pattern.search(p.read_text())]
    assert found == []


def test_every_model_py_declares_the_settings_check_config_reads():
    from s2t.gate.model_config import declared_settings

    folders = sorted(p.parents[1] for p in ROOT.glob("model_repository*/*/[0-9]*/model.py"))
    undeclared = [f.name for f in folders if "SETTINGS = " not in (f / "1" / "model.py").read_text()
                  or not declared_settings(f)]
    assert folders and undeclared == []


def test_config_parameters_are_read_one_way():
    """backends/runtime/model_parameters.py `read_parameters` is the one reader; a settings type's own reader
    beside it would be a second way (and a second place to forget a folder or an error)."""
    own_reader = re.compile(r"def from_parameters\(|def from_config\(")
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in project_sources()
             for number, line in enumerate(path.read_text().splitlines(), 1) if own_reader.search(line)]
    assert found == []

