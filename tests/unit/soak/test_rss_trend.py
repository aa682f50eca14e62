"""The one memory rule of every soak: RSS fitted by least squares after the warm-up and projected to 72 hours."""
import json
import math

import pytest

from s2t.soak import rss_trend
from s2t.soak.supervised import SERVING_TREE, SoakReport

MIB = 2**20


def test_least_squares_finds_the_line_through_noisy_points():
    points = [(t, 100 + 2 * t + (1 if t % 2 else -1)) for t in range(10)]
    slope, at_zero = rss_trend.least_squares(points)
    assert slope == pytest.approx(2.0, abs=0.1) and at_zero == pytest.approx(100, abs=1)
    with pytest.raises(ValueError):
        rss_trend.least_squares([(1.0, 5.0), (1.0, 6.0)])


def test_the_projection_is_the_slope_over_72_hours_as_a_share_of_the_fitted_start():
    # 1 MiB an hour on 1,000 MiB: 72 MiB at 72 h, 7.2%.
    points = [(t, 1000 * MIB + t * MIB / 3600) for t in range(0, 600, 10)]
    fit = rss_trend.trend(points)
    assert fit["projected_growth"] == pytest.approx(0.072, rel=1e-6)
    assert fit["slope_bytes_per_hour"] == pytest.approx(MIB, rel=1e-6) and fit["samples"] == 60
    assert rss_trend.verdict({"serving": fit})["holds"] is False
    flat = rss_trend.trend([(t, 1000 * MIB + (t % 20) * 1000) for t in range(0, 600, 10)])
    assert rss_trend.verdict({"serving": flat})["holds"] is True


def test_the_warm_up_is_left_out_of_the_fit():
    # Arenas filling in the first minute, flat after: no growth once the warm-up is left out.
    points = [(t, (500 + min(t, 60)) * MIB) for t in range(0, 600, 5)]
    assert rss_trend.warm_up_s(600) == 60 and rss_trend.warm_up_s(120) == 12
    assert rss_trend.trend(points, rss_trend.warm_up_s(600))["projected_growth"] == pytest.approx(0.0, abs=1e-9)
    assert rss_trend.trend(points, 0)["projected_growth"] > 1


def test_a_step_that_stays_is_growth_and_one_that_returns_is_not():
    stays = [(t, (1000 if t < 300 else 1050) * MIB) for t in range(60, 1200, 10)]
    returns = [(t, (1050 if 300 <= t < 900 else 1000) * MIB) for t in range(60, 1140, 10)]
    assert rss_trend.verdict({"serving": rss_trend.trend(stays)})["holds"] is False
    assert abs(rss_trend.trend(returns)["projected_growth"]) < rss_trend.MAX_PROJECTED_GROWTH


def test_each_phase_of_a_changing_load_is_fitted_on_its_own():
    # 15 min of valid load, 30 min of floods that take 250 MiB when they start and hold it flat, 15 min after that
    # give some back: the whole run's line reads the step as growth, each phase's own line is flat.
    def rss(t):
        return (600 if t < 900 else 850 if t < 2700 else 830) * MIB + (t % 30) * 1000
    points = [(float(t), rss(t)) for t in range(0, 3600, 10)]
    phases = {"before": (0.0, 900.0), "during": (900.0, 2700.0), "after": (2700.0, 3600.0)}
    fits = rss_trend.phase_trends({"serving": points}, phases)
    assert set(fits) == {"serving (before)", "serving (during)", "serving (after)"}
    assert rss_trend.verdict(fits)["holds"] is True
    assert fits["serving (during)"]["from_s"] == 900.0 + rss_trend.warm_up_s(1800.0)
    assert fits["serving (during)"]["to_s"] <= 2700.0
    assert rss_trend.verdict({"whole run": rss_trend.trend(points, rss_trend.warm_up_s(3600.0))})["holds"] is False
    # Growth that goes on under the floods fails the rule, however flat the other phases are.
    leaking = [(t, y + (8 * MIB * (t - 900) / 3600 if 900 <= t < 2700 else 0)) for t, y in points]
    grown = rss_trend.verdict(rss_trend.phase_trends({"serving": leaking}, phases))
    assert grown["holds"] is False and "serving (during)" in grown["detail"]


def test_the_first_phase_is_fitted_after_the_servers_own_warm_up_and_growth_past_it_still_fails():
    # Caches filling over the first minutes of serving, a buffer taken for good six minutes in, then flat.
    def warming(t):
        return 614 * MIB + min(t, 300) / 300 * 1.5 * MIB + (0.9 * MIB if t >= 360 else 0) + (t % 20) * 1000
    phases = {"before": (0.0, 900.0), "during": (900.0, 2700.0), "after": (2700.0, 3600.0)}
    points = [(float(t), warming(t)) for t in range(0, 3600, 2)]
    fits = rss_trend.phase_trends({"serving": points}, phases)
    assert fits["serving (before)"]["from_s"] == 450.0
    assert rss_trend.verdict(fits)["holds"] is True
    # With a minute's warm-up, as a later phase gets, the same first phase would read as growth.
    assert rss_trend.verdict({"before": rss_trend.trend(points[:450], 60.0)})["holds"] is False
    leaking = [(t, y + (2 * MIB * (t - 450) / 450 if 450 <= t < 900 else 0)) for t, y in points]
    grown = rss_trend.verdict(rss_trend.phase_trends({"serving": leaking}, phases))
    assert grown["holds"] is False and "serving (before)" in grown["detail"]


def test_one_slope_through_the_stretches_of_a_load_each_at_its_own_level():
    before = [(float(t), 100.0 + 2 * t) for t in range(0, 10)]
    after = [(float(t), 150.0 + 2 * t + (1 if t % 2 else -1)) for t in range(30, 40)]
    slope, levels = rss_trend.shared_slope([before, after])
    assert slope == pytest.approx(2.0, abs=0.1) and levels == pytest.approx([100, 150], abs=2)
    with pytest.raises(ValueError):
        rss_trend.shared_slope([[(1.0, 5.0)], [(2.0, 6.0)]])


LOADS = {"valid load": ("before", "after"), "floods": ("during",)}
PHASES = {"before": (0.0, 900.0), "during": (900.0, 2700.0), "after": (2700.0, 3600.0)}


def _hour(rss_at):
    return [(float(t), rss_at(t)) for t in range(0, 3600, 2)]


def _ripple(t):
    # A process at rest: a page now and then, given back by a trim every five minutes (glibc's heap top).
    return (t % 300) // 60 * 4096


@pytest.mark.parametrize("name, rss_at, fails", [
    ("flat, the floods' working set partly kept after them",
     lambda t: (644 if t < 900 else 900 if t < 2700 else 665) * MIB + _ripple(t), None),
    ("1 MiB/h under the valid load, before and after the floods",
     lambda t: (644 if t < 900 else 900 if t < 2700 else 665) * MIB + t * MIB / 3600 * (t < 900 or t >= 2700),
     "service (valid load)"),
    ("1 MiB/h under the floods only",
     lambda t: (644 if t < 900 else 900 if t < 2700 else 665) * MIB + (t - 900) * MIB / 1800 * (900 <= t < 2700),
     "service (floods)"),
    ("growth that goes on through the whole run, steps between the loads",
     lambda t: (644 if t < 900 else 900 if t < 2700 else 665) * MIB + t * MIB / 3600, "service (valid load)"),
])
def test_each_load_is_judged_by_its_own_line_and_a_step_between_loads_is_reported_not_projected(name, rss_at, fails):
    fits = rss_trend.load_trends({"service": _hour(rss_at)}, PHASES, LOADS)
    assert set(fits) == {"service (valid load)", "service (floods)"}
    valid = fits["service (valid load)"]
    # The first phase after the servers' own warm-up (its first half), the later ones after their minute.
    assert valid["stretches_s"] == [[450.0, 898.0], [2760.0, 3598.0]] and valid["from_s"] == 450.0
    assert fits["service (floods)"]["stretches_s"] == [[960.0, 2698.0]]
    assert valid["steps_bytes"][0] == pytest.approx(21 * MIB, abs=2.5 * MIB), name
    verdict = rss_trend.verdict(fits)
    if fails is None:
        assert verdict["holds"] is True, (name, verdict)
    else:
        assert verdict["holds"] is False and fails in verdict["detail"], (name, verdict)
    assert "450-898 + 2760-3598 s" in rss_trend.describe(valid) and "MiB from one stretch to the next" in \
        rss_trend.describe(valid)


def test_the_servers_first_quarter_hour_creeping_by_pages_then_at_rest_holds_and_its_phase_alone_would_not():
    # As the hour-long run of 2026-12-06 saw: the tree taking 2 MiB by pages over its first quarter hour of serving,
    # slower and slower, then flat after the floods: the before phase's line alone projects its last pages to 72 h.
    def creeping(t):
        return (642 * MIB + 2 * MIB * (1 - math.exp(-t / 240)) if t < 900 else 900 * MIB if t < 2700 else 665 * MIB) \
            + _ripple(t)
    points = _hour(creeping)
    assert rss_trend.phase_trends({"service": points}, PHASES)["service (before)"]["projected_growth"] > 0.05
    assert rss_trend.verdict(rss_trend.load_trends({"service": points}, PHASES, LOADS))["holds"] is True


def test_the_service_is_summed_at_the_times_each_group_was_sampled():
    serving = [(0.0, 10.0), (2.0, 11.0), (4.0, 12.0)]
    gateway = [(0.0, 1.0), (4.0, 2.0)]
    assert rss_trend.summed({"serving": serving, "gateway": gateway}) == [(0.0, 11.0), (4.0, 14.0)]
    assert rss_trend.summed({"serving": serving, "gateway": []}) == serving


def test_a_load_with_too_few_samples_is_not_measured_never_kept():
    fits = rss_trend.load_trends({"service": [(1000.0, 5.0), (1001.0, 5.0)]}, PHASES, LOADS)
    assert all(fit["projected_growth"] is None for fit in fits.values())
    assert rss_trend.verdict(fits)["holds"] is None


@pytest.mark.parametrize("points", [[], [(10.0, 5.0)], [(10.0, 5.0), (20.0, 6.0)], [(10.0, 5.0)] * 3])
def test_too_few_samples_are_not_measured_never_kept(points):
    fit = rss_trend.trend(points)
    assert fit["projected_growth"] is None
    verdict = rss_trend.verdict({"serving": fit})
    assert verdict["holds"] is None and "too few samples" in verdict["detail"]


def test_the_plain_soak_applies_the_same_rule_and_checks_the_process_and_every_answer():
    samples = [{"at": float(t), "rss": {"tritonserver": 400 * MIB, "risk_scorer_0_0@1": 100 * MIB + t * MIB,
                                         SERVING_TREE: 500 * MIB + t * MIB}} for t in range(0, 60, 2)]
    # The rule holds the tree; the processes' fits say which one grew.
    report = SoakReport(60.0, 100.0, sent=6000, answered=6000, samples=samples,
                        tritonserver={"start": 7, "end": 7, "same_process": True})
    verdicts = report.verdicts()
    assert verdicts["every_request_answered"]["holds"] is True
    assert verdicts["same_tritonserver_process"]["holds"] is True
    assert verdicts["rss_projection"]["holds"] is False and "serving tree" in verdicts["rss_projection"]["detail"]
    assert not report.holds()
    assert report.rss_trend()["risk_scorer_0_0@1"]["projected_growth"] > 0.05
    parsed = json.loads(report.to_json())
    assert set(parsed["rss_trend"]) == {"tritonserver", "risk_scorer_0_0@1", SERVING_TREE}
    assert parsed["rss_trend"]["tritonserver"]["projected_growth"] == 0
    assert "72 h" in report.table() and "FAILS" in report.table()


def test_the_plain_soak_fails_on_a_restarted_server_and_on_an_unanswered_request():
    samples = [{"at": float(t), "rss": {SERVING_TREE: 500 * MIB}} for t in range(0, 60, 2)]
    restarted = SoakReport(60.0, 100.0, sent=10, answered=10, samples=samples,
                           tritonserver={"start": 7, "end": 9, "same_process": False})
    assert restarted.verdicts()["same_tritonserver_process"]["holds"] is False and not restarted.holds()
    lost = SoakReport(60.0, 100.0, sent=10, answered=9, samples=samples,
                      tritonserver={"start": 7, "end": 7, "same_process": True})
    assert lost.verdicts()["every_request_answered"]["holds"] is False and not lost.holds()
    whole = SoakReport(60.0, 100.0, sent=10, answered=10, samples=samples,
                       tritonserver={"start": 7, "end": 7, "same_process": True})
    assert whole.holds()


def test_the_fit_says_how_much_growth_over_the_run_reaches_the_limit():
    # 1,000 MiB for 720 s: 5% at 72 h is 0.05 * 1,000 MiB * 720 / 259,200 = 142 KiB over the run.
    fit = rss_trend.trend([(t, 1000 * MIB) for t in range(0, 721, 10)])
    assert fit["limit_over_the_fit_bytes"] == round(0.05 * 1000 * MIB * 720 / (72 * 3600))
    assert rss_trend.describe(fit).endswith("+0.0% at 72 h (5% there is 142 KiB over the fit)")


def test_owned_memory_counts_what_a_process_allocates_and_not_its_file_pages(tmp_path):
    import subprocess
    import sys

    import psutil

    from s2t.soak.resident import owned_bytes, tree_owned_bytes
    # A child that maps a 64 MiB file and reads it (file pages, counted in RSS) and then allocates 64 MiB of its own.
    data = tmp_path / "pages"
    data.write_bytes(b"\1" * (64 * MIB))
    child = subprocess.Popen([sys.executable, "-c", f"""
import mmap, sys, time
with open({str(data)!r}, 'rb') as f:
    pages = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    sum(pages[i] for i in range(0, len(pages), 4096))
print('mapped', flush=True)
sys.stdin.readline()
mine = bytearray(b'x' * {64 * MIB})
print('allocated', flush=True)
time.sleep(60)
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "mapped"
        mapped_rss, mapped_owned = psutil.Process(child.pid).memory_info().rss, owned_bytes(child.pid)
        assert mapped_rss - mapped_owned >= 60 * MIB, "the file's pages are in RSS, not in what the process owns"
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "allocated"
        assert owned_bytes(child.pid) - mapped_owned >= 60 * MIB
        assert tree_owned_bytes(child.pid) >= owned_bytes(child.pid)
    finally:
        child.kill()
        child.wait()
    with pytest.raises(psutil.NoSuchProcess):
        owned_bytes(child.pid)
