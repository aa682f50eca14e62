"""A bench run is publishable only from a quiet machine: the load average at its start and the CPU other processes
used in each round, read from /proc."""
import math
import subprocess
import sys
import time

import pytest

from s2t.bench.harness.machine_load import LoadWatch, RoundLoad, markdown_lines, verdict


def round_of(share: float, label: str = "wrk triton round 1", cores: int = 2, wall: float = 10.0) -> RoundLoad:
    """A round in which the run's own processes used one core and others `share` of all cores."""
    own = wall
    return RoundLoad(label, wall, own + share * wall * cores, own, cores)


@pytest.mark.parametrize("load_average, cores, shares, publishable, named", [
    (0.0, 2, [0.0, 0.02], True, []),
    (0.5, 2, [0.10], True, []),                          # both exactly at their limits
    (0.51, 2, [0.0], False, ["load average 0.51", "0.26 per core"]),
    (10.0, 2, [0.0], False, ["5.00 per core"]),
    (3.9, 16, [0.0], True, []),
    (0.1, 2, [0.02, 0.35, 0.01], False, ["round 2: other processes used 35%"]),
    (1.2, 2, [0.5], False, ["0.60 per core", "used 50% of the CPU"]),
])
def test_a_run_is_publishable_only_under_both_limits(load_average, cores, shares, publishable, named):
    rounds = [round_of(s, f"wrk triton round {i + 1}", cores) for i, s in enumerate(shares)]
    found = verdict(load_average, cores, rounds)
    assert found.publishable is publishable
    assert bool(found.reasons) is not publishable
    for text in named:
        assert any(text in reason for reason in found.reasons), (text, found.reasons)


def test_other_cpu_share_is_what_the_machine_used_beyond_the_runs_own_processes():
    assert RoundLoad("r", 10.0, 12.0, 10.0, 2).other_cpu_share == pytest.approx(0.1)
    # /proc/stat and the processes' own times tick separately: a round can read the run's CPU a tick over the
    # machine's. That is no negative load.
    assert RoundLoad("r", 10.0, 9.9, 10.0, 2).other_cpu_share == 0.0


def test_a_round_of_no_time_is_no_evidence_of_a_quiet_machine():
    entry = RoundLoad("wrk triton round 1", 0.0, 0.0, 0.0, 2)
    assert math.isnan(entry.other_cpu_share)
    found = verdict(0.0, 2, [entry])
    assert not found.publishable and "unknown share" in found.reasons[0]


def test_cpu_burnt_outside_the_watched_processes_counts_as_other():
    """A watch on an idle child: this process's own busy loop is another process's load."""
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = LoadWatch(pid=idle.pid, load_average_1m=0.0, cores=2)
        spent = time.process_time()
        with watch.round("busy loop beside the watched process"):
            deadline = time.monotonic() + 0.2  # 20 ticks of the kernel's CPU clock
            while time.monotonic() < deadline:
                pass
        spent = time.process_time() - spent
    finally:
        idle.kill()
        idle.wait(timeout=30)
    (entry,) = watch.rounds
    other = entry.machine_cpu_seconds - entry.own_cpu_seconds
    # Whatever else the machine runs, the loop's own CPU is in the machine's busy time and not in the child's,
    # and it is this process's: another process's CPU, read from it.
    assert other >= 0.8 * spent - 0.05
    assert entry.own_cpu_seconds < 0.1
    assert entry.other_process_cpu_seconds >= 0.8 * spent - 0.05
    assert entry.other_cpu_share >= (0.8 * spent - 0.05) / (entry.wall_seconds * 2)


def test_the_share_is_the_other_processes_cpu_not_kernel_time_no_process_was_charged_for():
    # The machine busy 3.1 s, the run 1.6 s, the other processes 0.05 s: 1.45 s belongs to no process.
    entry = RoundLoad("perf_analyzer rate=1000/s", 3.0, 3.1, 1.6, 2, 0.05)
    assert entry.other_cpu_share == pytest.approx(0.05 / 6)
    assert entry.unattributed_cpu_seconds == pytest.approx(1.45)
    assert entry.as_dict()["unattributed_cpu_seconds"] == pytest.approx(1.45)
    assert verdict(0.0, 2, [entry]).publishable
    # A record without the figure keeps the machine's busy time beyond the run's as the measure.
    assert RoundLoad("r", 3.0, 3.1, 1.6, 2).other_cpu_share == pytest.approx(1.5 / 6)


def test_a_process_started_during_the_round_counts_whole_and_a_reused_pid_as_new():
    from s2t.bench.harness.machine_load import other_cpu_seconds
    before = {10: (100.0, 5.0), 11: (100.0, 1.0)}
    after = {10: (100.0, 5.5), 11: (200.0, 0.3), 12: (300.0, 0.2)}
    assert other_cpu_seconds(before, after) == pytest.approx(0.5 + 0.3 + 0.2)


def test_the_summary_and_the_printed_report_say_whether_the_run_is_publishable():
    quiet = LoadWatch(load_average_1m=0.1, cores=2)
    quiet.rounds.append(round_of(0.03))
    busy = LoadWatch(load_average_1m=11.5, cores=2)
    busy.rounds.append(round_of(0.4))
    assert quiet.summary()["publishable"] and not busy.summary()["publishable"]
    assert busy.summary()["rounds"][0]["other_cpu_share"] == pytest.approx(0.4)
    assert markdown_lines(quiet.summary())[0].startswith("**Publishable**")
    printed = markdown_lines(busy.summary())[0]
    assert printed.startswith("**NOT PUBLISHABLE") and "load average 11.50" in printed and "40%" in printed


def test_a_run_with_no_watched_round_is_not_publishable():
    """A mode that measured without watching any round cannot vouch for a quiet machine, whatever the load average."""
    found = verdict(0.0, 2, [])
    assert not found.publishable and "no measured round" in found.reasons[0]
    assert not LoadWatch(load_average_1m=0.0, cores=2).summary()["publishable"]


def test_the_verdict_is_the_one_recomputed_from_the_recorded_load_average():
    """results.json records the load average to 2 decimals; the verdict must follow from that figure."""
    summary = LoadWatch(load_average_1m=0.5049, cores=2)
    summary.rounds.append(round_of(0.0))
    recorded = summary.summary()
    assert recorded["load_average_1m_at_start"] == 0.5
    assert recorded["publishable"] is verdict(0.5, 2, summary.rounds).publishable is True


BURNER = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end:\n    pass\n"
# Starts a busy process in a session of its own, prints its pid and leaves it behind (the busy one is reparented).
LEAVE_BEHIND = ("import subprocess, sys, time\n"
                "p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], start_new_session=True)\n"
                "print(p.pid, flush=True)\n"
                "time.sleep(float(sys.argv[2]))\n")


def _left_behind(stay_s: float) -> tuple[subprocess.Popen, int]:
    middle = subprocess.Popen([sys.executable, "-c", LEAVE_BEHIND, BURNER, str(stay_s)], stdout=subprocess.PIPE,
                              text=True)
    return middle, int(middle.stdout.readline())


def test_a_process_the_run_started_stays_its_own_after_leaving_its_tree_and_a_foreign_one_counts():
    """A stopped server's stubs finish on their own, reparented: still the run's. A busy process that was never in
    the run's tree while it was watched is another process's load."""
    import psutil

    from s2t.bench.harness.machine_load import TREE_SAMPLE_S, other_processes

    ours = None
    foreign_parent, foreign = _left_behind(0.0)
    foreign_parent.wait(timeout=30)
    watch = LoadWatch(load_average_1m=0.0, cores=2)
    try:
        with watch.round("a server stopped while its stub goes on"):
            middle, ours = _left_behind(TREE_SAMPLE_S * 2.5)  # seen by a sample of the tree
            middle.wait(timeout=30)
            assert psutil.Process(ours).ppid() != middle.pid  # it left the run's tree
        ours_started = psutil.Process(ours).create_time()
        assert (ours, ours_started) in watch.own
        assert (foreign, psutil.Process(foreign).create_time()) not in watch.own
        others = other_processes(watch.pid, watch.own)
        assert ours not in others and foreign in others
        # The next round still knows it, and its CPU is no other process's.
        with watch.round("the next round"):
            time.sleep(0.3)
        assert ours not in other_processes(watch.pid, watch.own)
        burnt = psutil.Process(ours).cpu_times()
        assert burnt.user + burnt.system > 0.3  # busy in the rounds, and counted in neither as another's
    finally:
        for pid in (ours, foreign):
            if pid is None:
                continue
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
