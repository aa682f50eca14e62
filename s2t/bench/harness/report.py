"""Ratios, targets, goals, and the three forms of a run's results: results.json, results.md and PNG plots.

Each headline line reads the rounds the sides took in turns (s2t/bench/harness/rounds.py): the median round, with the
worst round and every round beside it. Targets are what a run must meet; goals are where the project aims.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from s2t.bench.harness import machine_load, rounds

MB = 2**20
TARGET_HTTP_RATIO = 1.0  # above it: faster than the strongest FastAPI app
# CPU per request of the serving process tree against FastAPI's (uvicorn and its workers).
TARGET_CPU_RATIO = 0.6
TARGET_GRPC_RATIO = 1.0
TARGET_BATCH_SHARE = 0.5
TARGET_BATCH = 256
TARGET_COLD_START_S = 2.0
TARGET_RSS_BYTES = 512 * MB
GOAL_HTTP_RATIO_MEDIAN_ROUND = 2.0
GOAL_HTTP_RATIO_EVERY_ROUND = 1.5
GOAL_GRPC_RATIO = 1.2
GOAL_CPU_RATIO = 0.4
GOAL_COLD_START_S = 1.5  # every start
GOAL_ROLLBACK_S = 1.0  # the rollback command under load, every swap
GOAL_ROLLBACK_IN_FORCE_S = 0.5  # from the command's launch until risk_pipeline serves the previous version


def _ratio(a: float | None, b: float | None) -> float:
    if a is None or not b or math.isnan(b):
        return float("nan")
    return a / b


def _point(points: list[dict], **match) -> dict | None:
    return next((p for p in points if all(p.get(k) == v for k, v in match.items())), None)


def _largest_batch(points: list[dict]) -> int | None:
    batches = [p["batch"] for p in points if p["model"] == "risk_scorer" and p["protocol"] == "grpc" and p["batch"] > 1]
    return max(batches, default=None)


def ratios(results: dict) -> dict:
    """Every ratio from measured numbers of this run: against baseline 1 (FastAPI) and baseline 2 (in-process)."""
    triton, base = results["http_triton"], results["http_baseline"]
    points, inproc = results["perf_analyzer"], results["inprocess"]
    out = {
        "http_throughput_vs_fastapi": _ratio(triton["throughput"], base["throughput"]),
        "http_p99_triton_over_fastapi_p50": _ratio(triton["p99_ms"], base["p50_ms"]),
        "http_cpu_per_request_fastapi_over_triton": _ratio(base["cpu_ms_per_request"], triton["cpu_ms_per_request"]),
    }
    planned = results.get("perf_analyzer_failures", [])
    batch = TARGET_BATCH if _point(points + planned, model="risk_scorer", protocol="grpc", batch=TARGET_BATCH) \
        else _largest_batch(points)
    out["batch"] = batch
    if batch:
        engine = _point(inproc, what="onnxruntime", batch=batch)
        whole = _point(inproc, what="decode+onnxruntime+decide", batch=batch)
        scorer = _point(points, model="risk_scorer", protocol="grpc", batch=batch)
        pipeline = _point(points, model="risk_pipeline", protocol="grpc", batch=batch)
        rate = lambda p, key: p[key] if p else None  # noqa: E731 - a point perf_analyzer gave up on
        out["grpc_scorer_batch_vs_inprocess"] = _ratio(rate(scorer, "infer_per_s"), rate(engine, "rows_per_s"))
        out["grpc_pipeline_batch_vs_inprocess_pipeline"] = _ratio(rate(pipeline, "infer_per_s"),
                                                                  rate(whole, "rows_per_s"))
    connections = results["http_triton"]["connections"]
    http = _point(points, model="risk_pipeline", protocol="http", batch=1, concurrency=connections)
    if http:
        out["perf_analyzer_http_pipeline_vs_fastapi"] = _ratio(http["infer_per_s"], base["throughput"])
    if "protocols" in results:
        # Rounds taken in turns, median of each: one point per protocol compares two moments of the machine.
        out["grpc_vs_http_pipeline"] = results["protocols"]["grpc_vs_http"]
    return out


def protocol_clients(found: dict) -> str:
    """The load generators of the HTTP / gRPC comparison, as the tables name them."""
    generators = found["generators"]
    if generators["http"] == generators["grpc"]:
        return generators["http"]
    return f"HTTP: {generators['http']}, gRPC: {generators['grpc']}"


def _http_rounds(results: dict) -> dict[str, list[dict]]:
    """Each side's wrk rounds, Triton's under `triton`."""
    return results["http_rounds"]


def spreads(results: dict) -> dict:
    """Every headline figure over its rounds, starts or swaps (rounds.Duel and rounds.Spread)."""
    http = _http_rounds(results)
    out = {"http": rounds.duel(http["triton"], {app: e for app, e in http.items() if app != "triton"}, "throughput",
                               cpu="cpu_ms_per_request")}
    protocol = results["protocols"]["rounds"] if "protocols" in results else None
    if protocol is not None:
        out["grpc_vs_http"] = rounds.duel(protocol.get("grpc", []), {"http": protocol.get("http", [])},
                                          "requests_per_s", cpu="server_cpu_us_per_request")
    cold = results["cold_start"]
    out["cold_start"] = rounds.spread(cold["seconds"], higher_is_better=False)
    swaps = results.get("hot_swap", {}).get("swaps")
    if swaps:
        out["rollback"] = rounds.spread([s.get("rollback_s") for s in swaps], higher_is_better=False)
        if any("in_force_s" in s for s in swaps):
            out["rollback_in_force"] = rounds.spread([s.get("in_force_s") for s in swaps], higher_is_better=False)
    if results.get("ceiling"):
        out["ceiling_share"] = rounds.spread(results["ceiling"]["share"], higher_is_better=True)
    for share, found in open_loop_duels(results).items():
        out[f"open_loop_{share:.0%}"] = found
    return out


def open_loop_duels(results: dict) -> dict[float, rounds.Duel]:
    """Triton against the plain FastAPI app at each share of its capacity, round by round: achieved rates and
    p99s (from the scheduled send time) of the same schedule."""
    found = results.get("open_loop")
    if not found:
        return {}
    opponent = found["opponent"]
    return {point["share"]: rounds.duel(point["rounds"]["triton"], {opponent: point["rounds"][opponent]},
                                        "achieved_rate", cpu="cpu_ms_per_request")
            for point in found["points"]}


def _kept_up(entries: list[dict]) -> int:
    return sum(bool(e.get("kept_up")) for e in entries)


def _open_loop_targets(results: dict) -> list[dict]:
    """At each share of the plain FastAPI app's capacity: Triton answers the whole schedule in every round, its p99
    at or below the app's in the median round."""
    found = results.get("open_loop")
    if not found:
        return []
    opponent, rows = found["opponent"], []
    for point, (share, duel) in zip(found["points"], open_loop_duels(results).items()):
        ours, theirs = point["rounds"]["triton"], point["rounds"][opponent]
        pairs = [f"{_format(o['p99_ms'], '', 2)} vs {_format(t['p99_ms'], ' ms', 2)}" for o, t in zip(ours, theirs)]
        at = duel.p99.median_at
        measured = ("not measured" if at is None else
                    f"p99 median round {pairs[at]} (worst round {pairs[duel.p99.worst_at]}, rounds: {', '.join(pairs)})"
                    f"; {point['offered_rate']:.0f} req/s offered, achieved {ours[at]['achieved_rate']:.0f} vs "
                    f"{theirs[at]['achieved_rate']:.0f}; kept up: Triton in {_kept_up(ours)} of {len(ours)} rounds, "
                    f"{opponent} in {_kept_up(theirs)} of {len(theirs)}")
        rows.append({"target": f"risk_pipeline HTTP p99 at {share:.0%} of the capacity of FastAPI {opponent} (the same "
                               "open-loop schedule, latency from the scheduled send) at or below its p99, every "
                               "request answered",
                     "measured": measured,
                     "met": at is not None and duel.p99.median <= 1.0 and _kept_up(ours) == len(ours)})
    return rows


def _hot_swap_rows(swap: dict, found: dict) -> list[list[str]]:
    """The load during the swaps and what each rollback took."""
    rows = [[f"risk_pipeline under {swap['callers']} gRPC callers during {len(swap['swaps'])} publish + "
             f"`s2t rollback` ({swap['model_control_mode']} mode, admin key)",
             f"{swap['requests_per_s']:.0f} req/s, {swap['errors']} failed, {swap['answered']} answered"]]
    if "rollback_in_force" in found:
        rows.append(["rollback in force (from the command's launch until risk_pipeline serves the previous version)",
                     over_rounds(found["rollback_in_force"], " s", "swap")])
    if "rollback" in found:
        rows.append(["rollback command (launch until it is back)", over_rounds(found["rollback"], " s", "swap")])
    return rows


def spread_document(results: dict) -> dict:
    """`spreads` as results.json holds them."""
    return {name: asdict(found) for name, found in spreads(results).items()}


def _format(value: float, unit: str, digits: int = 2) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}{unit}"


def over_rounds(found: rounds.Spread, unit: str = "x", noun: str = "round", digits: int = 2) -> str:
    """`median round X (worst round Y, rounds: a, b, c)`: how every headline figure reads."""
    every = ", ".join(_format(v, unit, digits) for v in found.values)
    return (f"median {noun} {_format(found.median, unit, digits)} (worst {noun} {_format(found.worst, unit, digits)}, "
            f"{noun}s: {every})")


def _p99_pairs(http: dict[str, list[dict]], duel: rounds.Duel) -> list[str]:
    def pair(number: int) -> str:
        opponent = duel.opponents[number]
        if opponent is None:
            return "n/a"
        ours, theirs = (http[side][number].get("p99_ms", float("nan")) for side in ("triton", opponent))
        return f"{_format(ours, '', 1)} vs {_format(theirs, ' ms', 1)}"
    return [pair(n) for n in range(duel.rounds)]


def _p99_above(duel: rounds.Duel, opponent: str) -> str:
    """`above OPPONENT's in N of M rounds`, and the rounds without a p99 to compare."""
    return (f"above {opponent}'s in {duel.p99_above} of {duel.rounds} rounds"
            + (f", {duel.p99_unknown} without a p99" if duel.p99_unknown else ""))


def _p99_text(http: dict[str, list[dict]], duel: rounds.Duel) -> str:
    pairs, p99 = _p99_pairs(http, duel), duel.p99
    if p99.median_at is None:
        return "not measured"
    return (f"median round {pairs[p99.median_at]} (worst round {pairs[p99.worst_at]}, rounds: {', '.join(pairs)}); "
            + _p99_above(duel, "FastAPI"))


def _median_round_pair(http: dict[str, list[dict]], duel: rounds.Duel, found: rounds.Spread, key: str, unit: str,
                       digits: int) -> str:
    """Both sides' figure in the median round of `found`, and the opponent's name."""
    n = found.median_at
    opponent = duel.opponents[n]
    return (f"{http['triton'][n][key]:.{digits}f} vs {http[opponent][n][key]:.{digits}f}{unit} ({opponent}) "
            "in the median round")


def targets(results: dict, r: dict) -> list[dict]:
    triton = results["http_triton"]
    # The serving tree as a user runs it (s2t serve, tritonserver, stubs) after load.
    rss = results["serving_tree"]["after_load_bytes"]
    found, http = spreads(results), _http_rounds(results)
    duel, cold = found["http"], found["cold_start"]
    rows = [
        {"target": f"risk_pipeline HTTP c={triton['connections']}: above {TARGET_HTTP_RATIO:g}x the req/s of the "
                   "strongest FastAPI app in the same round",
         "measured": "not measured" if duel.rate.median_at is None else
                     f"{over_rounds(duel.rate)}; "
                     + _median_round_pair(http, duel, duel.rate, "throughput", " req/s", 0),
         "met": duel.rate.median > TARGET_HTTP_RATIO},
        {"target": "risk_pipeline HTTP p99 at or below FastAPI's p99",
         "measured": _p99_text(http, duel),
         "met": duel.p99.median <= 1.0},
        {"target": f"risk_pipeline HTTP CPU per request (server process tree) at most {TARGET_CPU_RATIO:g}x "
                   "FastAPI's",
         "measured": "not measured" if duel.cpu.median_at is None else
                     f"{over_rounds(duel.cpu)}; " + _median_round_pair(http, duel, duel.cpu, "cpu_ms_per_request",
                                                                        " ms", 2),
         "met": duel.cpu.median <= TARGET_CPU_RATIO},
    ]
    if "grpc_vs_http" in found:
        rows.append({"target": f"risk_pipeline gRPC c={triton['connections']} at least its HTTP req/s "
                               f"({protocol_clients(results['protocols'])})",
                     "measured": over_rounds(found["grpc_vs_http"].rate),
                     "met": found["grpc_vs_http"].rate.median >= TARGET_GRPC_RATIO})
    if r.get("batch"):
        share = r["grpc_pipeline_batch_vs_inprocess_pipeline"]
        rows.append({"target": f"risk_pipeline gRPC batches of {r['batch']}: >= {TARGET_BATCH_SHARE:.0%} of in-process "
                               "decode + score + decide rows/s",
                     "measured": ("perf_analyzer failed (see perf_analyzer_failures)" if math.isnan(share)
                                  else f"{share:.0%}")
                                 + f" (risk_scorer alone, packed tensors: {r['grpc_scorer_batch_vs_inprocess']:.0%} "
                                   "of in-process ONNX Runtime)",
                     "met": share >= TARGET_BATCH_SHARE})
    rows += [
        {"target": f"cold start <= {TARGET_COLD_START_S:g} s from s2t serve's launch",
         "measured": over_rounds(cold, " s", "start") + f"; first start {results['cold_start']['seconds'][0]:.2f} s",
         "met": cold.median <= TARGET_COLD_START_S},
        {"target": f"RSS of the serving tree (s2t serve, tritonserver, stubs) <= {TARGET_RSS_BYTES / MB:.0f} MB "
                   "after load",
         "measured": f"{rss / MB:.0f} MB", "met": rss <= TARGET_RSS_BYTES},
    ]
    return rows + _open_loop_targets(results)


def goals(results: dict) -> list[dict]:
    """Where the project aims, beyond the targets: the median round and, where it says so, every round."""
    found, connections = spreads(results), results["http_triton"]["connections"]
    duel = found["http"]
    rows = [
        {"goal": f"risk_pipeline HTTP c={connections}: >= {GOAL_HTTP_RATIO_MEDIAN_ROUND:g}x the strongest FastAPI "
                 f"app's req/s in the median round and >= {GOAL_HTTP_RATIO_EVERY_ROUND:g}x in every round, its p99 at "
                 "or below FastAPI's in every round",
         "measured": f"{over_rounds(duel.rate)}; p99 " + _p99_above(duel, "FastAPI"),
         "met": (duel.rate.median >= GOAL_HTTP_RATIO_MEDIAN_ROUND and duel.rate.worst >= GOAL_HTTP_RATIO_EVERY_ROUND
                 and duel.rate.missing == 0 and duel.p99_at_or_below_every_round)},
    ]
    if "grpc_vs_http" in found:
        grpc = found["grpc_vs_http"].rate
        rows.append({"goal": f"risk_pipeline gRPC c={connections}: >= {GOAL_GRPC_RATIO:g}x its HTTP req/s in the "
                             "median round",
                     "measured": over_rounds(grpc), "met": grpc.median >= GOAL_GRPC_RATIO})
    rows += [
        {"goal": f"risk_pipeline HTTP CPU per request at most {GOAL_CPU_RATIO:g}x FastAPI's in the median round",
         "measured": "not measured" if duel.cpu.median_at is None else over_rounds(duel.cpu),
         "met": duel.cpu.median <= GOAL_CPU_RATIO},
        {"goal": f"cold start <= {GOAL_COLD_START_S:g} s in every start",
         "measured": over_rounds(found["cold_start"], " s", "start"),
         "met": found["cold_start"].worst <= GOAL_COLD_START_S and found["cold_start"].missing == 0},
    ]
    if "rollback_in_force" in found:
        in_force = found["rollback_in_force"]
        rows.append({"goal": f"rollback of risk_scorer under load: in force <= {GOAL_ROLLBACK_IN_FORCE_S:g} s from "
                             "the command's launch in every swap",
                     "measured": over_rounds(in_force, " s", "swap"),
                     "met": in_force.worst <= GOAL_ROLLBACK_IN_FORCE_S and in_force.missing == 0})
    if "rollback" in found:
        rollback = found["rollback"]
        rows.append({"goal": f"rollback of risk_scorer under load: the command <= {GOAL_ROLLBACK_S:g} s in every swap",
                     "measured": over_rounds(rollback, " s", "swap"),
                     "met": rollback.worst <= GOAL_ROLLBACK_S and rollback.missing == 0})
    return rows


def summary_lines(results: dict) -> list[str]:
    """What the console shows at the end of a run: each target, then each goal, met or missed, with its rounds."""
    def line(met: bool, what: str, measured: str) -> str:
        return f"{'met   ' if met else 'MISSED'}  {what}: {measured}"
    share = spreads(results).get("ceiling_share")
    measured = [] if share is None else [
        "measured:", f"        risk_pipeline's share of the ceiling (a model doing no work, the same serving path): "
                     f"{over_rounds(share, '')}"]
    return (["targets:", *(line(t["met"], t["target"], t["measured"]) for t in results["targets"])]
            + ["goals:", *(line(g["met"], g["goal"], g["measured"]) for g in results.get("goals", []))] + measured)


def _table(header: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return "n/a" if math.isnan(v) else (f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}")
        return str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(results: dict) -> str:
    m, r = results["machine"], results["ratios"]
    triton, mem, found = results["http_triton"], results["memory"], spreads(results)
    out = [f"# s2t bench ({results['mode']} mode)", "",
           f"{m['cpu']}, {m['logical_cores']} logical cores, {m['memory_gb']} GB, {m['os']}, Python {m['python']}; "
           f"load average at start {m['load_average_at_start'][0]} (1 min). Load generators run on the same cores.", "",
           *(machine_load.markdown_lines(results["load"]) if "load" in results else []),
           "## Targets", "",
           "Each line's figure is its median round, with the worst round and every round beside it (rounds taken in "
           "turns, each compared within itself).", "",
           _table(["target", "measured", "met"], [[t["target"], t["measured"], "yes" if t["met"] else "**no**"]
                                                  for t in results["targets"]]), "",
           *(["## Goals", "", _table(["goal", "measured", "met"],
                                     [[g["goal"], g["measured"], "yes" if g["met"] else "**no**"]
                                      for g in results["goals"]]), ""] if results.get("goals") else []),
           f"## HTTP JSON, same load generator (wrk, {triton['connections']} connections, closed loop)", "",
           f"All servers up at once, taking turns: {len(triton['rounds_throughput'])} rounds; each row is its median "
           "round, the order rotating. FastAPI apps: uvicorn[standard] (uvloop, httptools), the worker counts the mode "
           "sweeps (one side each), ONNX Runtime 1 thread per worker; `baseline` "
           "scores the raw body with risk_pipeline's own code on the event loop and renders with orjson, "
           "`fastapi-docs` is written as FastAPI's docs show (Pydantic body model, `def` endpoint, return type).", "",
           _table(["server", "req/s", "rounds req/s", "p50 ms", "p90 ms", "p99 ms", "CPU ms/req", "CPU cores",
                   "RSS MB", "errors"],
                  [[name, e["throughput"], " / ".join(f"{t:.0f}" for t in e["rounds_throughput"]), e["p50_ms"],
                    e["p90_ms"], e["p99_ms"], e["cpu_ms_per_request"], e["cpu_cores"], e["rss_bytes"] / MB, e["errors"]]
                   for name, e in (("Triton risk_pipeline", triton),
                                   *((f"FastAPI {app}", e) for app, e in results["http_fastapi_apps"].items()))]),
           "", *_http_round_by_round(_http_rounds(results), found["http"]),
           *_open_loop(results.get("open_loop")),
           "Same answers as risk_pipeline on the first records: " + "; ".join(
               f"{app}: {c['records']} records, max |Δp| {c['max_abs_diff']:.1e}, decisions equal {c['same_decisions']}"
               for app, c in results["same_answers"].items()) + ".",
           "", *_where_time_goes(results.get("where_time_goes")),
           *_ceiling(results, found.get("ceiling_share")),
           "## Ratios", "", "Each side's median round against the other's (the targets and goals compare the sides "
           "round by round).", "", _table(["ratio", "value"], [[k, v] for k, v in r.items()]), "",
           "## perf_analyzer", "",
           _table(["model", "protocol", "batch", "load", "rows/s", "req/s", "p50 ms", "p90 ms", "p99 ms", "CPU ms/req"],
                  [[p["model"], p["protocol"], p["batch"],
                    f"c={p['concurrency']}" if p["concurrency"] else f"{p['request_rate']:g} req/s",
                    p["infer_per_s"], p["requests_per_s"], p["p50_ms"], p["p90_ms"], p["p99_ms"], p["cpu_ms_per_request"]]
                   for p in results["perf_analyzer"]]), "",
           *_protocols(results.get("protocols"), found.get("grpc_vs_http")),
           *(["perf_analyzer gave up on: " + "; ".join(
               f"{f['model']} {f['protocol']} b={f['batch']} "
               + (f"c={f['concurrency']}" if f["concurrency"] else f"{f['request_rate']:g} req/s") + f" ({f['error']})"
               for f in results["perf_analyzer_failures"]), ""] if results.get("perf_analyzer_failures") else []),
           "## Baseline 2: in-process ONNX Runtime (1 thread)", "",
           _table(["work", "batch", "rows/s", "p50 ms/call", "p99 ms/call"],
                  [[p["what"], p["batch"], p["rows_per_s"], p["p50_ms"], p["p99_ms"]] for p in results["inprocess"]]), "",
           "## Cold start, memory, hot swap, streaming", "",
           _table(["measure", "value"], [
               [f"cold start ({results['cold_start']['clock']})",
                over_rounds(found["cold_start"], " s", "start")],
               ["first cold start (nothing of the run in the page cache yet)",
                f"{results['cold_start']['seconds'][0]:.2f} s"],
               ["tritonserver's own start (the server's clock, without the command around it)",
                f"{results['cold_start']['tritonserver_start_s']:.2f} s"],
               ["models ready", len(results["cold_start"]["models"])],
               ["RSS of the serving tree (s2t serve, tritonserver, stubs), after load",
                f"{results['serving_tree']['after_load_bytes'] / MB:.0f} MB"],
               ["RSS tritonserver + stubs, idle", f"{mem['triton_idle_bytes'] / MB:.0f} MB"],
               ["RSS tritonserver + stubs, peak under load", f"{mem['triton_peak_bytes'] / MB:.0f} MB"],
               ["RSS tritonserver + stubs, after load", f"{mem['triton_after_load_bytes'] / MB:.0f} MB"],
               ["RSS FastAPI baseline after load", f"{mem['baseline_after_load_bytes'] / MB:.0f} MB"],
               *_hot_swap_rows(results["hot_swap"], found),
               ["streaming (s2t stream, gRPC, risk_stream)",
                f"{results['streaming']['throughput']:.0f} records/s on {results['streaming']['streams']} streams, "
                f"p99 {results['streaming']['latency_ms'].get('p99', float('nan')):.0f} ms, "
                f"in-order {results['streaming']['in_order_rate']:.3f}"],
           ]), "", f"Run took {results['seconds']:.0f} s.", ""]
    return "\n".join(out)


def _protocols(found: dict | None, duel: rounds.Duel | None) -> list[str]:
    if not found or duel is None:
        return []
    rows = [[protocol, m["requests_per_s"], " / ".join(f"{e['requests_per_s']:.0f}" for e in found["rounds"][protocol]),
             m["p50_ms"], m["p99_ms"], m["client_cpu_us_per_request"], m["front_end_cpu_us_per_request"],
             m.get("grpc_front_cpu_us_per_request", float("nan")), m["stubs_cpu_us_per_request"]]
            for protocol, m in found["median"].items()]
    return [f"### HTTP and gRPC, {found['model']}, {protocol_clients(found)} c={found['concurrency']}, "
            "alternating rounds", "",
            f"gRPC / HTTP req/s, each round within itself: {over_rounds(duel.rate)}; each protocol's own median "
            f"round: {found['grpc_vs_http']:.2f}x; gRPC's p99 " + _p99_above(duel, "HTTP") + ". CPU per request in "
            "microseconds: the load generator, tritonserver's own process (front ends, batcher, the models it runs "
            "in process, risk_pipeline among them, and the gRPC front that runs inside it), the gRPC front as a "
            "process of its own (when it runs as one) and the python stubs.", "",
            _table(["protocol", "req/s", "rounds req/s", "p50 ms", "p99 ms", "client us", "tritonserver us",
                    "gRPC front us", "stubs us"], rows), ""]


def _http_round_by_round(http: dict[str, list[dict]], duel: rounds.Duel) -> list[str]:
    """Triton against the strongest FastAPI app of each round, the figures the targets and goals are made of."""
    rows = []
    for number, opponent in enumerate(duel.opponents):
        ours, theirs = http["triton"][number], (http[opponent][number] if opponent is not None else {})
        rows.append([number + 1, ours.get("throughput", float("nan")), opponent or "n/a",
                     theirs.get("throughput", float("nan")), _format(duel.rate.values[number], "x"),
                     ours.get("p99_ms", float("nan")), theirs.get("p99_ms", float("nan")),
                     ours.get("cpu_ms_per_request", float("nan")), theirs.get("cpu_ms_per_request", float("nan"))])
    return ["Round by round, Triton against the strongest FastAPI app of the same round:", "",
            _table(["round", "Triton req/s", "strongest FastAPI", "its req/s", "ratio", "Triton p99 ms", "its p99 ms",
                    "Triton CPU ms/req", "its CPU ms/req"], rows), ""]


def _open_loop(found: dict | None) -> list[str]:
    if not found:
        return []
    rows = []
    for point in found["points"]:
        for side, entries in point["rounds"].items():
            m = point["median"][side]
            rows.append([f"{point['share']:.0%}", point["offered_rate"], "Triton risk_pipeline" if side == "triton"
                         else f"FastAPI {side}", " / ".join(f"{e['achieved_rate']:.0f}" for e in entries),
                         m["p50_ms"], " / ".join(_format(e["p99_ms"], "", 2) for e in entries), m["max_ms"],
                         sum(e["unanswered"] + e["errors"] for e in entries), f"{_kept_up(entries)} of {len(entries)}",
                         m["cpu_ms_per_request"], m["send_lag_p99_ms"]])
    return [f"## Latency at the same offered rate (open loop, {found['connections']} connections)", "",
            f"Triton and FastAPI {found['opponent']} (the plain app at its strongest worker count; its median wrk "
            f"round, {found['capacity_rps']:.0f} req/s, is the capacity) fed the same schedule, requests sent at fixed "
            f"intervals whatever the server does, {found['seconds']:g} s a round, the sides taking turns. Each "
            "latency runs from the request's scheduled send time to its whole answer, so a side that falls behind "
            "pays for its queue; a side kept up when it answered every request without error at 95% of the offered "
            "rate or more. Each row is the side's median round by p99; the generator's own CPU and how late it sent "
            "(its share of every latency) beside.", "",
            _table(["share", "offered req/s", "server", "achieved req/s (rounds)", "p50 ms", "p99 ms (rounds)",
                    "max ms", "unanswered + errors", "kept up", "generator CPU ms/req", "generator send lag p99 ms"],
                   rows), ""]


def _where_time_goes(found: dict | None) -> list[str]:
    if not found:
        return []
    stats = found["triton_statistics"]
    lines = ["## Where risk_pipeline's time goes (one more wrk run, py-spy on the interpreter running it)", "",
             f"Triton's statistics: {stats['requests']} requests in {stats['executions']} executions (mean batch "
             f"{stats['mean_batch']:.1f}); queue {stats['queue_us_per_request']:.0f} us per request; per execution "
             + ", ".join(f"{k} {v:.0f} us" for k, v in stats["per_execution_us"].items()) + ".", ""]
    spy = found.get("py_spy", {})
    if spy.get("samples"):
        lines += [f"py-spy, {spy['samples']} samples of the interpreter running its model.py (self time; no Python frame = "
                  "native code on that thread: on the in-process backend, joining the batch's inputs and answering "
                  "each request):", "",
                  _table(["frame", "share"], [[e["frame"], f"{e['share']:.1%}"] for e in spy["self"]]), "",
                  _table(["inside (inclusive)", "share"], [[e["frame"], f"{e['share']:.1%}"] for e in spy["inclusive"]]),
                  ""]
    elif spy.get("error"):
        lines += [f"py-spy did not run: {spy['error']}", ""]
    return lines


def _ceiling(results: dict, share: rounds.Spread | None) -> list[str]:
    """risk_pipeline against the model that does no work with its inputs, outputs, batching and backend, and
    where the difference goes by Triton's statistics per execution."""
    found = results.get("ceiling")
    if not found:
        return []
    ceiling_stats, ours = found["triton_statistics"], results.get("where_time_goes", {}).get("triton_statistics")
    lines = [f"## The ceiling: {found['model']} (risk_pipeline's inputs, outputs, batching and backend; no work)", "",
             _table(["round", "ceiling req/s", "ceiling p99 ms", "ceiling CPU ms/req", "risk_pipeline req/s",
                     "share of the ceiling"],
                    [[n + 1, c["throughput"], c["p99_ms"], c["cpu_ms_per_request"], t["throughput"],
                      _format(found["share"][n], "", 2)]
                     for n, (c, t) in enumerate(zip(found["rounds"], results["http_rounds"]["triton"]))]), "",
             f"risk_pipeline reaches {over_rounds(share, '')} of the ceiling's req/s."]

    def infer_us(stats: dict) -> float:
        return stats["per_execution_us"]["compute_infer"]

    if ours and ceiling_stats.get("executions"):
        lines.append(
            f"Per execution (Triton's statistics), the model's own call: {infer_us(ours):.0f} us for risk_pipeline "
            f"at a mean batch of {ours['mean_batch']:.1f}, {infer_us(ceiling_stats):.0f} us for the ceiling at "
            f"{ceiling_stats['mean_batch']:.1f}: decoding, scoring and deciding a record cost "
            f"{infer_us(ours) / ours['mean_batch'] - infer_us(ceiling_stats) / ceiling_stats['mean_batch']:.0f} us "
            "more than handing it over and answering it; the rest of a request's CPU is the serving machinery, the "
            "same on both.")
    return lines + [""]


def plots(results: dict, out_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    points = [p for p in results["perf_analyzer"] if p["concurrency"] and p["batch"] == 1]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for model in ("risk_pipeline", "risk_scorer"):
        for protocol in ("http", "grpc"):
            series = sorted((p["concurrency"], p["infer_per_s"], p["p99_ms"]) for p in points
                            if p["model"] == model and p["protocol"] == protocol)
            if series:
                c, t, l = zip(*series)
                ax1.plot(c, t, marker="o", label=f"{model} {protocol}")
                ax2.plot(c, l, marker="o", label=f"{model} {protocol}")
    ax1.axhline(results["http_baseline"]["throughput"], color="grey", linestyle="--", label="FastAPI (wrk)")
    ax1.set(xlabel="concurrency", ylabel="requests/s", title="perf_analyzer throughput")
    ax2.set(xlabel="concurrency", ylabel="p99 ms", title="perf_analyzer p99", yscale="log")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    written.append(_save(fig, out_dir / "concurrency.png"))

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 4))
    names = ["Triton", "FastAPI"]
    entries = [results["http_triton"], results["http_baseline"]]
    ax1.bar(names, [e["throughput"] for e in entries], color=["tab:green", "tab:grey"])
    ax1.set(ylabel="requests/s", title="HTTP JSON, same generator")
    width = 0.25
    for k, key in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        ax2.bar([i + (k - 1) * width for i in range(2)], [e[key] for e in entries], width, label=key[:3])
    ax2.set_xticks(range(2), names)
    ax2.set(ylabel="ms", title="latency", yscale="log")
    ax2.legend()
    written.append(_save(fig, out_dir / "http_side_by_side.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    batches = sorted({p["batch"] for p in results["inprocess"]})
    for label, rows in (("in-process ORT", [_point(results["inprocess"], what="onnxruntime", batch=b) for b in batches]),
                        ("in-process decode+ORT", [_point(results["inprocess"], what="decode+onnxruntime+decide",
                                                          batch=b) for b in batches])):
        ax.plot(batches, [p["rows_per_s"] for p in rows], marker="o", linestyle="--", label=label)
    for model in ("risk_scorer", "risk_pipeline"):
        series = sorted((p["batch"], p["infer_per_s"]) for p in results["perf_analyzer"]
                        if p["model"] == model and p["protocol"] == "grpc" and (p["batch"] > 1 or p["concurrency"] == 1))
        if series:
            ax.plot(*zip(*series), marker="o", label=f"Triton {model} gRPC")
    ax.set(xlabel="batch size", ylabel="rows/s", xscale="log", yscale="log", title="batches vs in-process")
    ax.legend(fontsize=7)
    written.append(_save(fig, out_dir / "batches.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def write_files(out_dir: Path, results: dict, markdown_text: str | None = None, name: str = "results") -> None:
    """A run's figures as NAME.json, and its tables as NAME.md when given: how every bench mode writes them."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    if markdown_text is not None:
        (out_dir / f"{name}.md").write_text(markdown_text.rstrip("\n") + "\n")


def write(results: dict, out_dir: Path) -> None:
    results["ratios"] = ratios(results)
    results["targets"] = targets(results, results["ratios"])
    results["goals"] = goals(results)
    results["spread"] = spread_document(results)
    results["plots"] = [p.name for p in plots(results, out_dir)]
    write_files(out_dir, results, markdown(results))
