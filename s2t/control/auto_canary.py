"""`s2t canary MODEL N --auto`: the automated canary loop, judged by `s2t/gate/canary_analysis.py`.

Each step sets the split, waits for the interval (extended while too few candidate records came), and holds the
step's figures against the limits; the first breach rolls the candidate back, clearing every step promotes it. The
verdict is written to the model's history before the split changes.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Callable

from s2t.control.rollout import Rollout, canary, promote, rollback, rollback_plan
from s2t.gate.canary_analysis import Limits, Outcome, StepFigures, breaches, figures, judgeable
from s2t.prometheus_text import scrape


def run(rollout: Rollout, version: int, steps: list[float], interval_seconds: float, limits: Limits,
        metrics_url: str, log: Callable[[str], None] = print) -> Outcome:
    if not rollout.url:
        raise ValueError("the analysis reads the live server: give --http-url")
    primary_version = rollout.state().primary
    primary_name, candidate_name = f"{rollout.model}:{primary_version}", f"{rollout.model}:{version}"
    phases = [("shadow", steps[0])] + [("canary", p) for p in steps if p < 100]
    done: list[StepFigures] = []
    for phase, percent in phases:
        canary(rollout, version, percent if phase == "canary" else 0.0, percent if phase == "shadow" else 0.0)
        # The reloaded router starts its counters afresh and hands them over at most every second.
        time.sleep(1.5)
        before = scrape(metrics_url)
        for _ in range(limits.max_extensions + 1):
            time.sleep(interval_seconds)
            step = figures(before, scrape(metrics_url), phase, percent, primary_name, candidate_name)
            if judgeable(step, limits):
                break
        log(step.line())
        done.append(step)
        problems = breaches(step, limits) if judgeable(step, limits) else [
            f"{step.candidate_rows} candidate records in {phase} {percent:g}%, fewer than {limits.min_rows}"]
        if problems:
            reason = f"{phase} {percent:g}%: " + "; ".join(problems)
            _record(rollout, version, "rolled back", reason, done, limits)
            rollback(rollout, rollback_plan(rollout, None))
            return Outcome(False, reason, tuple(done))
    _record(rollout, version, "promoted", "every step within the limits", done, limits)
    promote(rollout, version)
    return Outcome(True, "every step within the limits", tuple(done))


def _record(rollout: Rollout, version: int, verdict: str, reason: str, steps: list[StepFigures],
            limits: Limits) -> None:
    rollout.record({"action": "canary-analysis", "version": version, "verdict": verdict, "reason": reason,
                    "steps": [asdict(s) for s in steps], "limits": asdict(limits)})
