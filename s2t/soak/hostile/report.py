"""What `s2t soak --hostile` reports, computed from plain samples: latency and outcome counts per valid path and
phase, RSS per phase, and a verdict per reliability guarantee. No clients and no processes here, so that the rules
that turn measurements into verdicts are tested on tables.

A verdict is `holds` True or False with the figures that decided it, or None when the run could not measure it
(a path that sent nothing): an unmeasured guarantee is never reported as kept.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from s2t.bench.harness.latency import percentile_or_none as percentile
from s2t.prometheus_text import parse_metrics, samples_named
from s2t.soak import rss_trend

PHASES = ("before", "during", "after")
# The loads the phases put on the service: the valid traffic alone before and after the floods is one load.
LOADS = {"valid load": ("before", "after"), "floods": ("during",)}
# A valid request is answered (with a result), failed (answered with an error status) or unanswered (the client
# gave up waiting, or the connection ended without a reply): only the last breaks "every request gets an answer".
ANSWERED, FAILED, UNANSWERED = "answered", "failed", "unanswered"
OUTCOMES = (ANSWERED, FAILED, UNANSWERED)
# A tick of the valid load skipped because the path already had its cap of requests in flight (a slow server).
NOT_SENT = "not_sent"
# What `s2t serve`'s supervisor counts when it steps in: reloads of a model (by model and reason), restarts of
# tritonserver, hung servers aborted. A caller's mistake must move none of them.
SUPERVISOR_COUNTERS = ("s2t_supervisor_reloads_total", "s2t_server_restarts_total", "s2t_server_hangs_total")
# Always on the supervisor's page (a reload counter appears with its first reload): its absence means the page
# was not read.
SUPERVISOR_ALWAYS = "s2t_server_restarts_total"


@dataclass(frozen=True)
class Sample:
    """One valid request: the phase it was sent in, how it ended, its latency (None when unanswered)."""
    phase: str
    outcome: str
    latency_s: float | None = None
    detail: str = ""
    at_s: float | None = None  # when it was sent, in seconds into the run


def phase_of(elapsed_s: float, before_s: float, during_s: float) -> str:
    if elapsed_s < before_s:
        return "before"
    return "during" if elapsed_s < before_s + during_s else "after"


def phase_bounds(phases_s: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """Each phase's (from s, to s) into the run, from the phases' lengths in PHASES order."""
    bounds, start = {}, 0.0
    for phase in PHASES:
        bounds[phase] = (start, start + phases_s[phase])
        start += phases_s[phase]
    return bounds


# The width of the windows of a path's latency timeline: short enough to tell a burst from a queue that builds.
WINDOW_S = 5.0


def timeline(samples: Iterable[Sample], window_s: float = WINDOW_S) -> list[dict]:
    """p50/p99 in ms and the count of the answered requests sent in each `window_s` window (by when they were sent),
    to tell a latency spike at one moment (a burst) from one that lasts (a queue that builds)."""
    windows: dict[int, list[float]] = {}
    for s in samples:
        if s.outcome == ANSWERED and s.latency_s is not None and s.at_s is not None:
            windows.setdefault(int(s.at_s // window_s), []).append(s.latency_s * 1000)
    return [{"from_s": w * window_s, "answered": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}
            for w, ms in sorted(windows.items())]


def worst_window(line: Sequence[Mapping]) -> Mapping | None:
    return max(line, key=lambda w: w["p99_ms"], default=None)


def path_summary(samples: Iterable[Sample]) -> dict:
    """Per phase: counts of each outcome, p50/p99 in ms of the answered ones, and up to 5 distinct error details;
    and the timeline of the whole run."""
    out = {}
    samples = list(samples)
    for phase in PHASES:
        mine = [s for s in samples if s.phase == phase]
        ms = [s.latency_s * 1000 for s in mine if s.outcome == ANSWERED and s.latency_s is not None]
        details = sorted({s.detail[:200] for s in mine if s.outcome in (FAILED, UNANSWERED) and s.detail})
        out[phase] = {**{o: sum(s.outcome == o for s in mine) for o in (*OUTCOMES, NOT_SENT)},
                      "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "errors": details[:5]}
    out["timeline"] = timeline(samples)
    return out


def _verdict(holds: bool | None, detail: str) -> dict:
    return {"holds": holds, "detail": detail}


def not_measured(why: str) -> dict:
    return _verdict(None, why)


def every_request_answered(paths: Mapping[str, dict], floods: Mapping[str, dict]) -> dict:
    """Every valid request and every flood request got a reply (an error status counts as a reply)."""
    lost = {f"{path} {phase}": summary[phase][UNANSWERED] for path, summary in paths.items() for phase in PHASES
            if summary[phase][UNANSWERED]}
    lost.update({f"flood {name}": flood.get(UNANSWERED, 0) for name, flood in floods.items()
                 if flood.get(UNANSWERED, 0)})
    sent = sum(summary[phase][o] for summary in paths.values() for phase in PHASES for o in OUTCOMES)
    if not sent:
        return _verdict(None, "no valid request was sent")
    return _verdict(not lost, "all answered" if not lost else
                    ", ".join(f"{where}: {n} unanswered" for where, n in sorted(lost.items())))


def valid_requests_succeeded(paths: Mapping[str, dict]) -> dict:
    """Valid requests are answered with a result, not an error, whatever the floods do."""
    failed = {f"{path} {phase}": summary[phase][FAILED] for path, summary in paths.items() for phase in PHASES
              if summary[phase][FAILED]}
    return _verdict(not failed, "none failed" if not failed else
                    ", ".join(f"{where}: {n} failed" for where, n in sorted(failed.items())))


def latency_targets_kept(paths: Mapping[str, dict], targets_ms: Mapping[str, float]) -> dict:
    """p99 of every valid path within its target in every phase."""
    over, unmeasured = [], []
    for path, summary in sorted(paths.items()):
        for phase in PHASES:
            p99 = summary[phase]["p99_ms"]
            if p99 is None:
                unmeasured.append(f"{path} {phase}")
            elif p99 > targets_ms[path]:
                over.append(f"{path} {phase}: p99 {p99:.0f} ms > {targets_ms[path]:.0f} ms")
    if over:
        return _verdict(False, "; ".join(over))
    if unmeasured:
        return _verdict(None, "no answered request in " + ", ".join(unmeasured))
    return _verdict(True, "every p99 within its target")


def no_restarts(before: Mapping[str, int], after: Mapping[str, int]) -> dict:
    """The same tritonserver and stub processes (name -> pid) at the end as at the start."""
    changed = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    if not before:
        return _verdict(None, "no serving process was seen")
    return _verdict(not changed, "same pids" if not changed else "changed: " + ", ".join(
        f"{name} {before.get(name)} -> {after.get(name)}" for name in changed))


def nothing_left(kind: str, left: Sequence[str]) -> dict:
    return _verdict(not left, f"no {kind} left" if not left else f"{len(left)} {kind} left: " + ", ".join(left[:10]))


def apis_restricted(probes: Sequence[Mapping]) -> dict:
    """Every probe of an admin API without the key was refused before it did anything."""
    if not probes:
        return _verdict(None, "not probed")
    open_ = [p["probe"] for p in probes if not p["refused"]]
    return _verdict(not open_, "all refused" if not open_ else "open without the key: " + ", ".join(open_))


def labels_from_configuration(leaked: int, probed: int) -> dict:
    """No text a client sent (`leaked` of `probed` bogus routes found in the metrics page) became a label."""
    if not probed:
        return _verdict(None, "no bogus route was sent")
    return _verdict(not leaked, f"none of {probed} bogus routes in the metrics" if not leaked else
                    f"{leaked} of {probed} bogus routes became metric labels")


def supervisor_totals(samples: Sequence[str]) -> dict[str, float]:
    """Each of SUPERVISOR_COUNTERS summed over its labels, from the supervisor's metric samples (lines of its
    page); a counter with no sample is absent."""
    metrics = parse_metrics("\n".join(samples))
    totals = {}
    for name in SUPERVISOR_COUNTERS:
        values = [value for _labels, value in samples_named(metrics, name)]
        if values:
            totals[name] = sum(values)
    return totals


def no_reload_or_restart(before: Mapping[str, float], after: Mapping[str, float]) -> dict:
    """The supervisor's counters (supervisor_totals) the same at the end of the run as at its start."""
    if SUPERVISOR_ALWAYS not in before or SUPERVISOR_ALWAYS not in after:
        return _verdict(None, "the supervisor's metrics were not read at the start and the end")
    changed = [f"{name} {before.get(name, 0):.0f} -> {after.get(name, 0):.0f}" for name in SUPERVISOR_COUNTERS
               if before.get(name, 0) != after.get(name, 0)]
    return _verdict(not changed, "no reload, restart or hang" if not changed else "; ".join(changed))


def caller_errors_answered_alone(floods: Mapping[str, Mapping], valid_succeeded: Mapping) -> dict:
    """In each caller-error flood (a result with "invalid" and "valid" counts, see bad_requests.count), every
    invalid request refused with its own 4xx naming its field and every valid request beside it scored, while the
    valid paths' requests succeeded (`valid_succeeded`, the valid_requests_succeeded verdict)."""
    measured = {name: flood for name, flood in floods.items() if flood.get("invalid", {}).get("sent")}
    unmeasured = sorted(set(floods) - set(measured))
    wrong = []
    for name, flood in sorted(measured.items()):
        for side, must in (("invalid", "refused naming their field"), ("valid", "scored")):
            sent, right = flood[side]["sent"], flood[side]["as_expected"]
            if right != sent:
                wrong.append(f"{name}: {sent - right} of {sent} {side} requests not {must}")
        wrong += [f"{name}: {label}" for label in flood.get("unexpected", [])[:3]]
    if valid_succeeded["holds"] is False:
        wrong.append(f"valid paths: {valid_succeeded['detail']}")
    if wrong:
        return _verdict(False, "; ".join(wrong))
    if unmeasured or not measured:
        return _verdict(None, "no invalid request sent by " + ", ".join(unmeasured or sorted(floods)))
    if valid_succeeded["holds"] is None:
        return _verdict(None, f"valid paths: {valid_succeeded['detail']}")
    invalid = sum(flood["invalid"]["sent"] for flood in measured.values())
    valid = sum(flood["valid"]["sent"] for flood in measured.values())
    return _verdict(True, f"{invalid} invalid requests each refused naming its field; {valid} valid beside them "
                          "scored; the valid paths unharmed")


def oversized_bodies_refused(flood: Mapping | None) -> dict:
    """Every oversized HTTP body refused as the caller's error (a 4xx: 413 or 400), none failing the server (5xx)
    or going unanswered."""
    counted = {k: v for k, v in (flood or {}).get("outcomes", {}).items() if k.startswith(("HTTP ", "no answer"))}
    if not counted:
        return _verdict(None, "no oversized body was sent")
    wrong = {k: v for k, v in counted.items() if not k.startswith("HTTP 4")}
    if wrong:
        said = (flood.get("answers") or {})
        return _verdict(False, "; ".join(f"{n} x {k}" + (f" ({said[k][:120]!r})" if k in said else "")
                                         for k, n in sorted(wrong.items())) + ", not a 4xx")
    return _verdict(True, ", ".join(f"{n} x {k}" for k, n in sorted(counted.items())))


def flood_answered_alone(flood: Mapping | None, holds_when: str) -> dict:
    """A flood of wire_attacks (a result with "hostile" and "valid" counts): holds when every hostile request came
    back as it must, every valid request beside it was scored, and nothing went unanswered."""
    if not flood or not flood.get("sent") or "hostile" not in flood:
        return _verdict(None, "not run" if not flood else
                        f"nothing sent: {', '.join(flood.get('outcomes', {})) or 'no outcome'}"[:300])
    wrong = []
    for side in ("hostile", "valid"):
        sent, right = flood[side]["sent"], flood[side]["as_expected"]
        if right != sent:
            wrong.append(f"{sent - right} of {sent} {side} requests not as they must be")
    if flood.get(UNANSWERED):
        wrong.append(f"{flood[UNANSWERED]} unanswered")
    if not flood["valid"]["sent"]:
        wrong.append("no valid request beside it")
    if wrong:
        return _verdict(False, "; ".join(wrong) + ": " + "; ".join(flood.get("unexpected", [])[:3]))
    return _verdict(True, f"{holds_when} ({flood['hostile']['sent']} hostile, {flood['valid']['sent']} valid)")


def table(report: Mapping) -> str:
    """The printed form: latency and counts per path and phase, RSS per phase, then the verdicts."""
    phases_s = report["phases_s"]
    lines = [(f"hostile soak: {report['seconds']:.0f} s (before {phases_s['before']:.0f} s, during "
              f"{phases_s['during']:.0f} s, after {phases_s['after']:.0f} s)"),
             (f"{'path':<20} {'phase':<7} {'p50 ms':>8} {'p99 ms':>8} {'target':>7} {'answered':>9} {'failed':>7} "
              f"{'unanswered':>10} {'not sent':>8}")]

    def ms(value):
        return "-" if value is None else f"{value:.0f}"
    for path, summary in report["paths"].items():
        for phase in PHASES:
            row = summary[phase]
            lines.append(f"{path:<20} {phase:<7} {ms(row['p50_ms']):>8} {ms(row['p99_ms']):>8} "
                         f"{report['latency_targets_ms'][path]:>7.0f} {row[ANSWERED]:>9} {row[FAILED]:>7} "
                         f"{row[UNANSWERED]:>10} {row[NOT_SENT]:>8}")
    for path, summary in report["paths"].items():
        worst = worst_window(summary.get("timeline", []))
        if worst is not None and worst["p99_ms"] > report["latency_targets_ms"][path]:
            lines.append(f"{path:<20} worst {WINDOW_S:.0f} s window: sent at {worst['from_s']:.0f}-"
                         f"{worst['from_s'] + WINDOW_S:.0f} s, p50 {worst['p50_ms']:.0f} ms, p99 "
                         f"{worst['p99_ms']:.0f} ms ({worst['answered']} answered)")
    lines.append(f"{'RSS MiB (max/last)':<20} " + " ".join(f"{phase:>15}" for phase in PHASES))
    for group, phases in report["rss"].items():
        lines.append(f"{group:<20} " + " ".join(
            f"{phases[p]['max'] / 2**20:>7.0f}/{phases[p]['last'] / 2**20:<7.0f}" if p in phases else f"{'-':>15}"
            for p in PHASES))
    fits = report.get("rss_trend", {})
    if fits:
        lines.append("RSS of the service (the serving tree and the gateway) fitted over each load after its warm-up, "
                     "projected to 72 h of that load (the rule):")
        for name, fit in report.get("rss_trend_by_load", {}).items():
            lines.append(f"  {name:<24} {rss_trend.describe(fit)}")
        lines.append("and of each group, by load, by phase and over the whole run:")
        for name, fit in {**report.get("rss_trend_by_group_and_load", {}),
                          **report.get("rss_trend_by_phase", {})}.items():
            lines.append(f"  {name:<24} {rss_trend.describe(fit)}")
        for group, fit in fits.items():
            lines.append(f"  {group + ' (whole run)':<24} {rss_trend.describe(fit)}")
        by_process = report.get("rss_trend_by_process_and_load") or report.get("rss_trend_by_process", {})
        grown = sorted(((name, fit) for name, fit in by_process.items() if fit.get("slope_bytes_per_hour")),
                       key=lambda item: -item[1]["slope_bytes_per_hour"])[:6]
        for name, fit in grown:  # the end of a name says the stub and the phase
            lines.append(f"    {name if len(name) <= 48 else '...' + name[-45:]:<48} {rss_trend.describe(fit)}")
    load = report.get("load_average")
    if load:
        lines.append("load average (1, 5, 15 min): at the start " + " ".join(f"{v:.2f}" for v in load["start"])
                     + ", at the end " + " ".join(f"{v:.2f}" for v in load["end"]) + f" on {load['cpus']} CPUs")
    grpc_port = report.get("services", {}).get("grpc_port_served_by")
    if grpc_port:
        lines.append(f"public gRPC port served by: {grpc_port}")
    if report.get("supervisor_before"):
        lines.append("supervisor at the start: " + ", ".join(report["supervisor_before"]))
    if report.get("supervisor"):
        lines.append("supervisor at the end: " + ", ".join(report["supervisor"]))
    lines.append("floods:")
    for name, flood in report["floods"].items():
        counts = ", ".join(f"{v} x {k}" for k, v in sorted(flood.get("outcomes", {}).items()))
        lines.append(f"  {name:<22} sent {flood.get('sent', 0)}: {counts}")
        if "held" in flood:
            lines.append(f"  {'':<22} held: " + ", ".join(f"{v} x {k}" for k, v in sorted(flood["held"]["ended"].items())))
    lines.append("verdicts:")
    for name, verdict in report["verdicts"].items():
        mark = {True: "holds", False: "FAILS", None: "not measured"}[verdict["holds"]]
        lines.append(f"  {name:<39} {mark:<13} {verdict['detail']}")
    return "\n".join(lines)
