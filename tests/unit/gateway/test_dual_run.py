import asyncio
import json
import threading

import grpc
import pytest

from s2t.gateway.dual_run import MAX_IDS_KEPT, DiffTally, DualRun, write_json_atomically
from s2t.wire import skill_pb2
from s2t.wire.skill_call import CallRefused

OK, BAD = skill_pb2.OK, skill_pb2.INVALID_RECORD


def result(request_id, probability=0.2, decision="APPROVE", status=OK):
    return skill_pb2.SkillResult(request_id=request_id, probability=probability, decision=decision, status=status)


@pytest.mark.parametrize("triton, legacy, expected", [
    (result("a", 0.2), result("a", 0.2), {"compared": 1, "both_scored": 1, "max_abs_diff": 0.0}),
    (result("a", 0.25), result("a", 0.2), {"over_tolerance": {"count": 1, "request_ids": ["a"]}}),
    (result("a", 0.31, "REVIEW"), result("a", 0.29, "APPROVE"), {"decision_flips": {"count": 1, "request_ids": ["a"]}}),
    (result("a", status=BAD), result("a"), {"errors_on_one_side": {
        "triton": {"count": 1, "request_ids": ["a"]}, "legacy": {"count": 0, "request_ids": []}}}),
    (result("a"), result("a", status=BAD), {"errors_on_one_side": {
        "triton": {"count": 0, "request_ids": []}, "legacy": {"count": 1, "request_ids": ["a"]}}}),
    (result("a", status=BAD), result("a", status=BAD), {"both_invalid": 1, "both_scored": 0, "compared": 1}),
])
def test_each_kind_of_difference_is_counted_with_its_request_id(triton, legacy, expected):
    tally = DiffTally(tolerance=1e-5)
    tally.compare([triton], [legacy])
    report = tally.report()
    for key, value in expected.items():
        assert report[key] == value, key


def test_the_largest_difference_is_kept_and_ids_are_capped_while_counts_are_not():
    tally = DiffTally(tolerance=0.0)
    n = MAX_IDS_KEPT + 5
    tally.compare([result(str(i), 0.1 + i * 1e-4) for i in range(n)], [result(str(i), 0.1) for i in range(n)])
    report = tally.report()
    assert report["over_tolerance"]["count"] == n - 1  # row 0 is equal
    assert len(report["over_tolerance"]["request_ids"]) == MAX_IDS_KEPT
    assert report["max_abs_diff"] == pytest.approx((n - 1) * 1e-4, rel=1e-5)


def test_a_failing_mirror_is_counted_by_its_status_and_never_reaches_the_caller(tmp_path):
    def refuse(window, number):
        raise CallRefused(grpc.StatusCode.UNAVAILABLE, "down")

    dual = DualRun(refuse, "triton", "legacy:1", report_path=tmp_path / "r.json", report_interval_s=60)
    dual.submit([skill_pb2.SkillRecord(request_id="a")] * 3, 0, [result("a")] * 3)
    report = dual.close()
    assert (report["mirror_failures"], report["mirror_failed_records"]) == (1, 3)
    assert report["mirror_failure_reasons"] == {"UNAVAILABLE": 1}
    assert json.loads((tmp_path / "r.json").read_text())["mirror_failures"] == 1


def test_a_full_backlog_counts_the_window_instead_of_waiting():
    release = threading.Event()

    def slow(window, number):
        release.wait(10)
        return [result("a")]

    dual = DualRun(slow, "legacy", "triton:1", max_pending=1, threads=1)
    dual.submit([skill_pb2.SkillRecord()], 0, [result("a")])
    dual.submit([skill_pb2.SkillRecord()], 1, [result("a")])
    release.set()
    report = dual.close()
    assert report["mirror_failure_reasons"] == {"BACKLOG": 1} and report["compared"] == 1


def test_the_report_is_replaced_whole(tmp_path):
    path = tmp_path / "d" / "report.json"
    write_json_atomically(path, {"compared": 1})
    write_json_atomically(path, {"compared": 2})
    assert json.loads(path.read_text()) == {"compared": 2}
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]


class ClosingWindows:
    """A per-thread window scorer that records its loop and whether it was closed."""

    def __init__(self):
        self.loop = asyncio.get_running_loop()
        self.closed = False

    async def __call__(self, window, number):
        return [skill_pb2.SkillResult(probability=0.5, window=number) for _ in window]

    async def close(self):
        self.closed = True


def test_closing_the_dual_run_closes_every_mirror_threads_scorer_and_loop():
    from s2t.gateway.skill_gateway import BlockingWindows
    made = []
    lock = threading.Lock()

    def make():
        with lock:
            made.append(ClosingWindows())
            return made[-1]
    dual_run = DualRun(BlockingWindows(make), "triton", "legacy", threads=3)
    for number in range(24):
        dual_run.submit([b"r"], number, [skill_pb2.SkillResult(probability=0.5, window=number)])
    report = dual_run.close()
    assert made and len(made) <= 3 and report["mirror"] == "legacy"
    assert all(windows.closed and windows.loop.is_closed() for windows in made)
