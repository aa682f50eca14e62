"""CPU per request of risk_pipeline, side by side: the measure of the hot path that a busy machine does not spoil.

Wall-clock req/s on a machine shared with other work says more about the other work than about the server. What a
request costs the server does not depend on who else runs: the user + system CPU of tritonserver and all its stubs
(from /proc) over a round, divided by the requests Triton answered in it. Each *side* is a server variant (config
knobs of risk_pipeline, or another revision's python code) with a load generator (wrk on HTTP JSON, or
perf_analyzer on HTTP or gRPC) at a fixed concurrency; all servers are up together and the sides take turns, round
after round, so the machine's changes fall on every side alike. Each side's figure is its median round; req/s is
recorded too, but only as a figure relative to the first side measured at the same moments.

CPU per request still moves with the batch size the dynamic batcher forms (a starved server batches more), so each
round records the mean batch as well: compare sides at equal mean batch.

    python -m s2t.bench.scenarios.cpu_cost --side base --side two:instances=2 --side grpc:client=perf_analyzer,protocol=grpc
    python -m s2t.bench.scenarios.cpu_cost --side before:rev=HEAD~1 --side after      # this tree's code against a revision
    s2t bench --mode cpu-cost --side base --side grpc:client=h2load          # the same, as a mode of `s2t bench`
    s2t bench --mode grpc-front                                             # gRPC through the front vs Triton's own

The server tree's CPU includes the gRPC front's process (a sibling of tritonserver, not its child), also shown on its
own.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from s2t.bench.load import h2load, perf_analyzer, wrk
from s2t.bench.load.generators import SPEAKS, Load, drive, measured_round
from s2t.bench.harness import report, workload
from s2t.bench.harness import repository as repositories
from s2t.bench.harness.rounds import median, median_round, take_turns
from s2t.bench.scenarios import stub_profile
from s2t.bench.harness.machine_load import LoadWatch
from s2t.project_imports import PROJECT_PACKAGES
from s2t.serve.triton_server import LATENCY_QUANTILES, TritonServer, free_port, latency_summary_args
from s2t.wire.names import PAYLOAD, PIPELINE, SCORER

CLIENTS = tuple(SPEAKS)
# Two sides when none are named: the served config, and a second instance (the knob most often asked about).
DEFAULT_SIDES = ("base", "two:instances=2")
# The knobs a side may set: server knobs make a server of their own, client knobs only change the load. `front`: the
# gRPC front inside tritonserver (`on`, as `s2t serve` runs it), in a process of its own (`process`), or none (`off`:
# gRPC goes to Triton's own endpoint; s2t/serve/grpc_front.py). `http_front`: the HTTP front inside tritonserver
# (`on`, as `s2t serve` runs it) or none (`off`: HTTP on Triton's own endpoint, as `s2t serve --no-http-front`;
# s2t/serve/http_front.py). `summaries`: Triton's
# latency summaries: `off` (as `s2t serve` by default), `on` (as `s2t serve --latency-summaries`), `triton` (Triton's
# default quantiles) or quantiles of your own (0.5:0.05/0.99:0.001).
SERVER_KNOBS = ("instances", "queue_delay_us", "preferred", "intra_op_threads", "http_threads", "rev", "front",
                "http_front", "summaries")
FRONT_VALUES = ("on", "off", "process")
HTTP_FRONT_VALUES = ("on", "off")
SUMMARY_VALUES = ("off", "on", "triton")
QUANTILES = re.compile(r"0?\.\d+:0?\.\d+(/0?\.\d+:0?\.\d+)*")
CLIENT_KNOBS = ("client", "protocol")


@dataclass(frozen=True)
class Side:
    """One measured side: a name, the server it runs on (its knobs) and the load generator."""

    name: str
    server: tuple[tuple[str, str], ...] = ()
    client: str = "wrk"
    protocol: str = "http"

    @property
    def server_key(self) -> tuple[tuple[str, str], ...]:
        return self.server


# The protocol each load generator speaks unless told (h2load: gRPC only, wrk: HTTP only).
DEFAULT_PROTOCOL = {generator: protocols[0] for generator, protocols in SPEAKS.items()}
PROTOCOLS = SPEAKS


@dataclass(frozen=True)
class Plan:
    """How much one run measures."""

    rounds: int
    concurrency: int
    seconds: float  # wrk's and h2load's duration per round
    requests: int  # perf_analyzer's requests per window


# `s2t bench --mode cpu-cost` and `cpu-cost-smoke` (the tests' plan: it only proves the machinery).
PLANS = {"cpu-cost": Plan(3, 16, 5.0, 3000), "cpu-cost-smoke": Plan(2, 4, 1.0, 500)}


def parse_side(text: str) -> Side:
    """`NAME` or `NAME:knob=value,knob=value` (knobs: SERVER_KNOBS and CLIENT_KNOBS; `preferred` as 4/8/16)."""
    name, _, knobs = text.partition(":")
    if not name:
        raise ValueError(f"side {text!r}: no name")
    server, client = {}, {"client": "wrk"}
    for item in filter(None, knobs.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not value:
            raise ValueError(f"side {name}: {item!r} is not knob=value")
        if key == "front" and value not in FRONT_VALUES:
            raise ValueError(f"side {name}: front is {', '.join(FRONT_VALUES)}, got {value!r}")
        if key == "http_front" and value not in HTTP_FRONT_VALUES:
            raise ValueError(f"side {name}: http_front is {', '.join(HTTP_FRONT_VALUES)}, got {value!r}")
        if key == "summaries" and value not in SUMMARY_VALUES and not QUANTILES.fullmatch(value):
            raise ValueError(f"side {name}: summaries is {', '.join(SUMMARY_VALUES)} or quantiles as "
                             f"0.5:0.05/0.99:0.001, got {value!r}")
        if key in SERVER_KNOBS:
            server[key] = value
        elif key in CLIENT_KNOBS:
            client[key] = value
        else:
            raise ValueError(f"side {name}: unknown knob {key!r} (knobs: {', '.join(SERVER_KNOBS + CLIENT_KNOBS)})")
    generator = client["client"]
    if generator not in CLIENTS:
        raise ValueError(f"side {name}: client must be one of {CLIENTS}, got {generator!r}")
    protocol = client.get("protocol", DEFAULT_PROTOCOL[generator])
    if protocol not in PROTOCOLS[generator]:
        raise ValueError(f"side {name}: {generator} speaks {' or '.join(PROTOCOLS[generator])} here, not {protocol!r}")
    return Side(name, tuple(sorted(server.items())), generator, protocol)


def edit_config(text: str, knobs: dict[str, str]) -> str:
    """risk_pipeline's config with the side's server knobs applied (comments are not kept: a copy to measure)."""
    return repositories.edited(text, lambda config: _apply_knobs(config, knobs))


def _apply_knobs(config, knobs: dict[str, str]) -> None:
    if "instances" in knobs:
        for group in config.instance_group:
            group.count = int(knobs["instances"])
    if "queue_delay_us" in knobs:
        config.dynamic_batching.max_queue_delay_microseconds = int(knobs["queue_delay_us"])
    if "preferred" in knobs:
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(int(s) for s in knobs["preferred"].split("/"))
    if "intra_op_threads" in knobs:
        config.parameters["intra_op_thread_count"].string_value = knobs["intra_op_threads"]


def server_args(knobs: dict[str, str]) -> list[str]:
    """tritonserver's own options for the side's knobs."""
    args = [f"--http-thread-count={int(knobs['http_threads'])}"] if "http_threads" in knobs else []
    summaries = knobs.get("summaries", "off")
    if summaries == "off":
        return args
    quantiles = {"on": LATENCY_QUANTILES, "triton": None}.get(summaries, summaries.replace("/", ","))
    return args + latency_summary_args(quantiles)


def with_source_root(model_py: str, root: Path) -> str:
    """A model.py that imports the models' code from `root` (another revision's) rather than this checkout's: `root`
    first on the path, and the project's packages imported so far forgotten (the in-process backend's interpreter
    has imported this checkout's `s2t` before any model.py runs, and a package already imported finds its
    submodules in its own folder, whatever the path says). The backend's own glue (s2t/backends/runtime/inprocess.py,
    loaded before any model) stays this checkout's: a request the revision's model refuses is answered INTERNAL,
    not INVALID_ARG (its error classes are the revision's), so rev sides measure valid records. This checkout's
    finder of s2t.backends and s2t.clients (s2t/__init__.py: the top-level backends/ and clients/) goes too, or it
    would hand out this checkout's code under the revision's names; a revision of that layout installs its own."""
    return (f"import sys; sys.path.insert(0, {str(root)!r})\n"
            f"sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, '__name__', '') != '_CheckoutPackages']\n"
            f"for _name in [m for m in sys.modules if m.split('.')[0] in {tuple(PROJECT_PACKAGES)!r}]:\n"
            f"    del sys.modules[_name]\n" + model_py)


def relative(measured: dict[str, list[dict]], key: str, higher_is_better: bool = False) -> dict[str, float]:
    """Each side's `key` over the first side's, round by round (the two ran moments apart, on the same machine),
    and the median of those ratios: on a busy machine a round's figure moves by far more than the sides differ,
    and a ratio taken within one round cancels most of that."""
    first = measured[next(iter(measured))]
    out = {}
    for side, rounds in measured.items():
        out[side] = median([r[key] / f[key] for r, f in zip(rounds, first) if f[key]], higher_is_better)
    return out


@dataclass
class _Server:
    knobs: dict[str, str]
    repository: Path
    server: TritonServer | None = None
    sides: list[Side] = field(default_factory=list)


def _revision_tree(rev: str, dest: Path) -> Path:
    """The models' code of git revision `rev` of this checkout, in `dest`: `s2t/backends/` (the top-level `backends/`
    of a revision with the package mapping, extracted under `s2t/`) and `s2t/wire/`, or, in a revision from before the one
    package, the top-level `backends/` and `wire/`."""
    root = Path(__file__).resolve().parents[3]
    dest.mkdir(parents=True)
    top = subprocess.run(["git", "-C", str(root), "ls-tree", "--name-only", rev], capture_output=True, text=True,
                         check=True).stdout.split()
    before_package = "wire" in top
    if before_package:
        archives = [["backends", "wire"]]
    elif "backends" in top:  # extracted under s2t/, where an install puts it
        archives = [["s2t/__init__.py", "s2t/wire"], ["--prefix=s2t/", "backends"]]
    else:
        archives = [["s2t/__init__.py", "s2t/backends", "s2t/wire"]]
    for args in archives:
        archive = subprocess.run(["git", "-C", str(root), "archive", rev, *args], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    # The wire format's generated code (`make proto`) is not in git: the revision's records need this checkout's.
    wire = dest / ("wire" if before_package else "s2t/wire")
    for generated in (root / "s2t" / "wire").glob("*_pb2*.py"):
        if wire.is_dir() and not (wire / generated.name).exists():
            shutil.copy2(generated, wire / generated.name)
    return dest


def _revision_model(rev: str, dest: Path) -> None:
    """risk_pipeline's config and model.py as git revision `rev` of this checkout has them (its backend included:
    a revision before the in-process backend runs it on the python backend), over the copy in `dest`."""
    root = Path(__file__).resolve().parents[3]
    folder = f"model_repository/{PIPELINE}"
    names = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "--name-only", rev, folder], capture_output=True,
                           text=True, check=True).stdout.split()
    for name in names:
        target = dest / Path(name).relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(subprocess.run(["git", "-C", str(root), "show", f"{rev}:{name}"], capture_output=True,
                                          check=True).stdout)


def _repository(source: Path, dest: Path, knobs: dict[str, str], tmp: Path) -> Path:
    """risk_pipeline and the scorer it reads, copied from `source`, with the side's knobs."""
    repositories.copy_repository(source, dest, (PIPELINE, SCORER))
    if "rev" in knobs:
        _revision_model(knobs["rev"], dest / PIPELINE)
    repositories.edit_config(dest / PIPELINE, lambda config: _apply_knobs(config, knobs))
    if "rev" in knobs:
        root = _revision_tree(knobs["rev"], tmp / f"rev-{dest.name}")
        for model_py in (dest / PIPELINE).glob("[0-9]*/model.py"):
            model_py.write_text(with_source_root(model_py.read_text(), root))
    return dest


def _drive(side: Side, server: TritonServer, load: Load, concurrency: int, seconds: float | None = None) -> dict:
    url = server.http_url if side.protocol == "http" else server.grpc_url
    return drive(side.client, url, side.protocol, PIPELINE, load, concurrency, seconds)


def measure_round(side: Side, server: TritonServer, run: Callable[[], dict]) -> dict:
    """One round of one side (generators.measured_round): the CPU per answered request, split, with the mean
    dynamic batch Triton formed and the machine's load average."""
    stats = stub_profile.snapshot(server.http_url, PIPELINE)
    load1 = psutil.getloadavg()[0]
    entry = measured_round(server.process.pid, run, lambda: _answered(server),
                           server.front.pid if server.front is not None else None)
    breakdown = stub_profile.breakdown(stats, stub_profile.snapshot(server.http_url, PIPELINE))
    return {**entry, "mean_batch": round(breakdown["mean_batch"], 2), "load_average_1m": round(load1, 2)}


def _answered(server: TritonServer) -> int:
    return stub_profile.snapshot(server.http_url, PIPELINE)["requests"]


def run(sides: list[Side], repository: Path, data_csv: Path, rounds: int, concurrency: int, seconds: float,
        requests: int, log: Callable[[str], None] = print) -> dict:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="s2t-cpu-cost-") as tmp_name:
        tmp = Path(tmp_name)
        payloads = workload.Workload.load(data_csv).payloads()
        inputs = tmp / "pipeline.json"
        inputs.write_text(json.dumps(workload.perf_input_pipeline(payloads)))
        # wrk sends the one record h2load can send (generators.py): every side of a comparison the same work.
        (tmp / "grpc_body.bin").write_bytes(h2load.infer_body(PIPELINE, PAYLOAD, payloads[0]))
        load = Load(inputs, perf_analyzer.Settings(requests, max_trials=3),
                    wrk.write_script(tmp / "triton.lua", f"/v2/models/{PIPELINE}/infer",
                                     [workload.triton_json_body(payloads[0])]), tmp / "grpc_body.bin", seconds)
        servers: dict[tuple, _Server] = {}
        for side in sides:
            if side.server_key not in servers:
                number = len(servers)
                knobs = dict(side.server_key)
                servers[side.server_key] = _Server(knobs, _repository(Path(repository), tmp / f"repo{number}", knobs,
                                                                      tmp))
            servers[side.server_key].sides.append(side)
        watch = LoadWatch()
        try:
            for number, entry in enumerate(servers.values()):
                entry.server = TritonServer([entry.repository], free_port(), free_port(), free_port(),
                                            log_path=tmp / f"server{number}.log", exit_timeout_seconds=10,
                                            stop_gracefully=False,
                                            grpc_front=entry.knobs.get("front") != "off",
                                            grpc_front_process=entry.knobs.get("front") == "process",
                                            http_front=entry.knobs.get("http_front") != "off",
                                            extra_args=server_args(entry.knobs)).start()
            warm_up = Load(inputs, perf_analyzer.Settings(max(requests // 4, 100), max_trials=3), load.wrk_script,
                           load.grpc_body, 1)
            for side in sides:  # warm-up: connections, lazy imports, the first batches
                _drive(side, servers[side.server_key].server, warm_up, concurrency)

            def one(side: Side, number: int) -> dict:
                server = servers[side.server_key].server
                label = f"{side.name} round {number + 1}"
                with watch.round(label):
                    entry = measure_round(side, server, lambda: _drive(side, server, load, concurrency))
                log(f"{label}: {entry['server_cpu_us_per_request']:.0f} us CPU/request (tritonserver "
                    f"{entry['front_end_cpu_us_per_request']:.0f}, gRPC front "
                    f"{entry['grpc_front_cpu_us_per_request']:.0f}, stubs {entry['stubs_cpu_us_per_request']:.0f}),"
                    f" batch {entry['mean_batch']:.1f}, {entry['requests_per_s']:.0f} req/s, "
                    f"load {entry['load_average_1m']:.1f}")
                return entry

            measured = {side.name: entries for side, entries in take_turns(sides, rounds, one).items()}
        finally:
            for entry in servers.values():
                if entry.server is not None:
                    entry.server.stop()
    medians = {name: median_round(entries, "server_cpu_us_per_request", higher_is_better=False)
               for name, entries in measured.items()}
    return {"started": started, "concurrency": concurrency, "rounds": rounds,
            "sides": {s.name: {"server": dict(s.server), "client": s.client, "protocol": s.protocol} for s in sides},
            "measured": measured, "median": medians,
            "relative_server_cpu_per_request": relative(measured, "server_cpu_us_per_request"),
            "relative_stubs_cpu_per_request": relative(measured, "stubs_cpu_us_per_request"),
            "relative_requests_per_s": relative(measured, "requests_per_s", higher_is_better=True),
            "load": watch.summary()}


def markdown(results: dict) -> str:
    lines = [f"# CPU per request of {PIPELINE} (c={results['concurrency']}, {results['rounds']} rounds, median; "
             "relative: the median of each round's ratio to the first side)", ""]
    if not results["load"]["publishable"]:
        lines += ["Taken on a busy machine: read the CPU per request and the relative figures only.", ""]
    lines += ["| side | server CPU us/req | tritonserver | gRPC front | stubs | client | mean batch | req/s (relative) "
              "| p99 ms | load avg |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in results["median"].items():
        lines.append(f"| {name} | {m['server_cpu_us_per_request']:.0f} "
                     f"({results['relative_server_cpu_per_request'][name]:.2f}x) | "
                     f"{m['front_end_cpu_us_per_request']:.0f} | {m['grpc_front_cpu_us_per_request']:.0f} | "
                     f"{m['stubs_cpu_us_per_request']:.0f} "
                     f"({results['relative_stubs_cpu_per_request'][name]:.2f}x) | "
                     f"{m['client_cpu_us_per_request']:.0f} | {m['mean_batch']:.1f} | "
                     f"{results['relative_requests_per_s'][name]:.2f}x | {m['p99_ms']:.2f} | "
                     f"{m['load_average_1m']:.1f} |")
    return "\n".join(lines)


def parse_sides(texts: list[str] | tuple[str, ...]) -> list[Side]:
    """The sides to measure (DEFAULT_SIDES when none), each named once; ValueError names the one that is wrong."""
    sides = [parse_side(text) for text in (texts or DEFAULT_SIDES)]
    if len({s.name for s in sides}) != len(sides):
        raise ValueError("side names must differ")
    return sides


def measure(sides: list[Side], repository: Path, data_csv: Path, plan: Plan, out_dir: Path,
            log: Callable[[str], None] = print) -> tuple[dict, str]:
    """One run of `plan` over `sides`, written to OUT/results.json and results.md; the results and the table."""
    results = run(sides, repository, data_csv, plan.rounds, plan.concurrency, plan.seconds, plan.requests, log=log)
    text = markdown(results)
    report.write_files(out_dir, results, text)
    return results, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m s2t.bench.scenarios.cpu_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", action="append", default=[],
                        help="NAME[:knob=value,...]; knobs " + ", ".join(SERVER_KNOBS + CLIENT_KNOBS)
                        + f" [default: {' '.join(DEFAULT_SIDES)}]")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--data", type=Path, default=Path("artifacts/data/germancredit.csv"))
    plan = PLANS["cpu-cost"]
    parser.add_argument("--rounds", type=int, default=plan.rounds)
    parser.add_argument("--concurrency", type=int, default=plan.concurrency)
    parser.add_argument("--seconds", type=float, default=plan.seconds, help="wrk's and h2load's duration per round")
    parser.add_argument("--requests", type=int, default=plan.requests, help="perf_analyzer's requests per window")
    parser.add_argument("--out", type=Path, default=Path("bench/results/cpu_cost"))
    args = parser.parse_args(argv)
    try:
        sides = parse_sides(args.side)
    except ValueError as err:
        parser.error(str(err))
    _, text = measure(sides, args.repository, args.data, Plan(args.rounds, args.concurrency, args.seconds,
                                                             args.requests), args.out,
                      log=lambda line: print(line, file=sys.stderr, flush=True))
    print(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
