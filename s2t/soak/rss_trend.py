"""The one memory rule of every soak: RSS sampled over the run, fitted by least squares over time, and projected to
72 hours of the same load; a process (or process tree) whose projected growth is 5% or more of its fitted size at
the start of the fit fails it.

A line through every sample after the warm-up, rather than the last sample against one baseline: one late spike
or a quiet moment at the end cannot decide alone, and the slope says what a run of days would add, which is what a
soak of minutes is asked. The warm-up (a minute, or a tenth of a shorter run) is left out so that allocator arenas
and caches filling once are not read as a leak. A step that stays (memory taken during a burst and never returned)
counts: under one load a soak cannot tell it from a leak, so it is reported as the growth it would be if it went on.

The fit is taken over one load: the whole run of a soak whose load does not change, and each load of one whose
load does (the hostile soak: valid traffic, then the floods beside it, then valid traffic again). Memory a new load
takes when it starts is that load's working set, not growth; what the rule asks of each load is that 72 hours more
of it would not add 5%. The whole run's line and each phase's are reported beside the loads' for the reader.

The first phase of a run is also the servers' first minutes of serving, when they take what they keep for good (a
buffer or arena sized by the first requests of each kind, a step that comes minutes in): 1-2 MiB of a 650 MiB tree in
its first six minutes of valid load, then flat (2026-12-06). A minute's warm-up reads that as a leak, so the first
phase (all of a run under one load) is fitted over its second half only; the later phases, whose processes are
warm, after their minute.

A load that comes back (the hostile soak's valid traffic, before and after the floods) is one load: its stretches
are fitted together, one slope through all of them, each stretch at its own level (`load_trend`). What the other load
left taken between them is a step, reported beside the line (`steps_bytes`), not growth of this one; growth under the
valid load shows in both stretches, and the line through both spans most of the run, where a quarter of an hour's
line alone multiplies a page or a trim of glibc's heap (the ripple of a process at rest, a few hundred KiB) by
hundreds on its way to 72 hours. Memory the other load freed and kept resident could take a slow leak's first
allocations without showing it; the steps say how much that is.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

PROJECTION_HOURS = 72.0
# Projected growth at PROJECTION_HOURS, of the fitted size at the start of the fit, from which a soak fails.
MAX_PROJECTED_GROWTH = 0.05
# Samples a fit needs: two always make a line, so a third is the least that can disagree with it.
MIN_SAMPLES = 3
WARM_UP_MAX_S = 60.0
# The share of a run's first phase left out of its fit: the servers' own warm-up.
FIRST_PHASE_WARM_UP_SHARE = 0.5

Points = Sequence[tuple[float, float]]  # (seconds into the run, RSS bytes)


def warm_up_s(run_seconds: float) -> float:
    """Seconds left out at the start of a run's fit: a minute, or a tenth of a run shorter than ten minutes."""
    return min(WARM_UP_MAX_S, run_seconds / 10)


def least_squares(points: Points) -> tuple[float, float]:
    """(slope per second, value at t = 0) of the least-squares line through `points` (at least two distinct t)."""
    slope, [at_zero] = shared_slope([points])
    return slope, at_zero


def trend(points: Points, warm_up: float = 0.0, hours: float = PROJECTION_HOURS) -> dict:
    """The fit of the samples at or after `warm_up` s (`load_trend` of one stretch): sizes fitted at the first and
    last of them, the slope in bytes an hour, and the growth projected to `hours` past the first, as a fraction of
    the size fitted there (None with fewer than MIN_SAMPLES samples)."""
    return load_trend([[(t, y) for t, y in points if t >= warm_up]], hours)


def trends(series: Mapping[str, Points], run_seconds: float) -> dict[str, dict]:
    """`trend` of every named series over a run of `run_seconds` under one load: a run's first phase, so fitted
    after the servers' own warm-up."""
    warm = max(warm_up_s(run_seconds), FIRST_PHASE_WARM_UP_SHARE * run_seconds)
    return {name: trend(points, warm) for name, points in series.items()}


def _fitted_stretches(phases: Mapping[str, tuple[float, float]]) -> dict[str, tuple[float, float, bool]]:
    """Each phase's (fit from s, to s, last) into the run: after the warm-up of a run as long as the phase counted
    from its start, the first phase after the servers' own (FIRST_PHASE_WARM_UP_SHARE of it)."""
    last_end = max((end for _, end in phases.values()), default=0.0)
    first_start = min((start for start, _ in phases.values()), default=0.0)
    stretches = {}
    for phase, (start, end) in phases.items():
        warm_up = warm_up_s(end - start)
        if start == first_start:
            warm_up = max(warm_up, FIRST_PHASE_WARM_UP_SHARE * (end - start))
        stretches[phase] = (start + warm_up, end, end == last_end)
    return stretches


def _inside(points: Points, stretch: tuple[float, float, bool]) -> list[tuple[float, float]]:
    """The samples of a stretch: a sample at a boundary is the next phase's; the last phase takes every later one."""
    start, end, last = stretch
    return sorted((t, y) for t, y in points if start <= t and (t < end or last))


def phase_trends(series: Mapping[str, Points], phases: Mapping[str, tuple[float, float]]) -> dict[str, dict]:
    """`trend` of every series over each phase (name -> (from s, to s) into the run) after its warm-up
    (`_fitted_stretches`): {"<series> (<phase>)": fit}."""
    stretches = _fitted_stretches(phases)
    return {f"{name} ({phase})": trend(_inside(points, stretch), stretch[0])
            for name, points in series.items() for phase, stretch in stretches.items()}


def shared_slope(stretches: Sequence[Points]) -> tuple[float, list[float]]:
    """(slope per second, value at t = 0 of each stretch): the least-squares lines through `stretches` with one
    slope and a level of their own each (every stretch non-empty, two distinct t in one of them at least)."""
    centred = []
    for points in stretches:
        mean_t = sum(t for t, _ in points) / len(points)
        mean_y = sum(y for _, y in points) / len(points)
        centred.append((points, mean_t, mean_y))
    spread = sum((t - mean_t) ** 2 for points, mean_t, _ in centred for t, _ in points)
    if spread == 0:
        raise ValueError("a line needs samples at two different times at least")
    slope = sum((t - mean_t) * (y - mean_y) for points, mean_t, mean_y in centred for t, y in points) / spread
    return slope, [mean_y - slope * mean_t for _, mean_t, mean_y in centred]


def load_trend(stretches: Sequence[Points], hours: float = PROJECTION_HOURS) -> dict:
    """`trend`'s fit of the stretches of one load together (`shared_slope`): the growth projected to `hours` as a
    fraction of the size fitted at the start of the first stretch, the stretches' (from s, to s), and the steps
    between them (the next stretch's fitted level at its start less the line of the one before carried there)."""
    kept = [sorted(points) for points in stretches if points]
    samples = sum(len(points) for points in kept)
    out = {"samples": samples, "from_s": kept[0][0][0] if kept else None, "to_s": kept[-1][-1][0] if kept else None,
           "stretches_s": [[points[0][0], points[-1][0]] for points in kept], "start_bytes": None, "end_bytes": None,
           "steps_bytes": [], "slope_bytes_per_hour": None, "projected_growth": None, "projected_hours": hours,
           "limit_over_the_fit_bytes": None}
    span = sum(points[-1][0] - points[0][0] for points in kept)
    if samples < MIN_SAMPLES or span == 0:
        return out
    # How fine the run can see: the growth over the fitted span that projects to the limit. A short run must be
    # flat to within it (a few hundred KiB in 90 s of a 400 MiB tree), a long one less so.
    slope, levels = shared_slope(kept)
    start = levels[0] + slope * kept[0][0][0]
    out.update(start_bytes=round(start), end_bytes=round(levels[-1] + slope * kept[-1][-1][0]),
               steps_bytes=[round(after - before) for before, after in zip(levels, levels[1:])],
               slope_bytes_per_hour=round(slope * 3600),
               projected_growth=slope * hours * 3600 / start if start > 0 else None,
               limit_over_the_fit_bytes=round(MAX_PROJECTED_GROWTH * start * span / (hours * 3600)))
    return out


def load_trends(series: Mapping[str, Points], phases: Mapping[str, tuple[float, float]],
                loads: Mapping[str, Sequence[str]]) -> dict[str, dict]:
    """`load_trend` of every series under each load (name -> its phases, in `phases`), each phase's samples after
    its warm-up as `phase_trends` takes them: {"<series> (<load>)": fit}."""
    stretches = _fitted_stretches(phases)
    return {f"{name} ({load})": load_trend([_inside(points, stretches[phase]) for phase in load_phases])
            for name, points in series.items() for load, load_phases in loads.items()}


def summed(series: Mapping[str, Points]) -> list[tuple[float, float]]:
    """One series of the sums of `series` at the times every one of them was sampled: a tree of processes sampled
    group by group, as one."""
    sampled = [points for points in series.values() if points]  # a group not running here has no samples
    by_time: dict[float, list[float]] = {}
    for points in sampled:
        for t, y in points:
            by_time.setdefault(t, []).append(y)
    return [(t, sum(ys)) for t, ys in sorted(by_time.items()) if len(ys) == len(sampled)]


def verdict(fits: Mapping[str, Mapping], limit: float = MAX_PROJECTED_GROWTH) -> dict:
    """{"holds", "detail"}: holds when every fit's projected growth is under `limit`; None when one could not be
    fitted (too few samples), and never True then."""
    grown, unfitted = [], []
    for name, fit in sorted(fits.items()):
        growth = fit.get("projected_growth")
        if growth is None:
            unfitted.append(f"{name} ({fit.get('samples', 0)} samples)")
        elif growth >= limit:
            grown.append(f"{name} {describe(fit)}")
    hours = next(iter(fits.values()), {}).get("projected_hours", PROJECTION_HOURS)
    if grown:
        return {"holds": False, "detail": f"projected {hours:.0f} h growth {limit:.0%} or more: " + "; ".join(grown)}
    if unfitted or not fits:
        return {"holds": None, "detail": "too few samples to fit: " + (", ".join(unfitted) or "no series")}
    worst = max(fits.items(), key=lambda item: item[1]["projected_growth"])
    return {"holds": True, "detail": f"every projected {hours:.0f} h growth under {limit:.0%} (largest: "
                                     f"{worst[0]} {describe(worst[1])})"}


def describe(fit: Mapping) -> str:
    """'1084.0 -> 1141.0 MiB fitted over 12-120 s, +28.5 MiB/h, +190.1% at 72 h (5% there is 106 KiB over the
    fit)' (or why there is no fit)."""
    if fit.get("projected_growth") is None:
        return f"not fitted ({fit.get('samples', 0)} samples)"
    over = " + ".join(f"{start:.0f}-{end:.0f}" for start, end in fit.get("stretches_s") or
                      [(fit["from_s"], fit["to_s"])])
    steps = "".join(f", {step / 2**20:+.1f} MiB from one stretch to the next" for step in fit.get("steps_bytes") or [])
    return (f"{fit['start_bytes'] / 2**20:.1f} -> {fit['end_bytes'] / 2**20:.1f} MiB fitted over "
            f"{over} s{steps}, {fit['slope_bytes_per_hour'] / 2**20:+.1f} MiB/h, "
            f"{fit['projected_growth'] * 100:+.1f}% at {fit['projected_hours']:.0f} h"
            + (f" ({MAX_PROJECTED_GROWTH:.0%} there is {fit['limit_over_the_fit_bytes'] / 2**10:.0f} KiB over the fit)"
               if fit.get("limit_over_the_fit_bytes") else ""))
