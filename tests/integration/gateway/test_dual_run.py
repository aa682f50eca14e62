"""Dual-run through `s2t gateway --mirror`: the legacy service and Triton compared on the same windows, with the
legacy protocol and client both sides, and a legacy side that slows down or dies mid-run."""
import json
import signal
import time
import urllib.request

import grpc
import numpy as np
import pytest

from s2t.wire import skill_pb2, skill_pb2_grpc
from tests.conftest import SAVED_MODEL, free_port
from tests.integration.skill_services import running, skill_records, start, stop
from s2t.gate import parity

TOLERANCE = 1e-5


def legacy_args(port):
    return ["legacy", "serve", "--port", str(port), "--saved-model", str(SAVED_MODEL)]


def gateway_args(port, triton, legacy_port, report, *extra):
    return ["gateway", "--port", str(port), "--grpc-url", triton.grpc_url, "--mirror", f"localhost:{legacy_port}",
            "--diff-report", str(report), "--diff-report-interval-s", "0.5", *extra]


@pytest.fixture(scope="module")
def legacy_port(built_artifacts):
    port = free_port()
    with running(legacy_args(port), "listening"):
        yield port


def score(port, records, timeout=120):
    with grpc.insecure_channel(f"localhost:{port}") as channel:
        return skill_pb2_grpc.SkillStub(channel).Score(iter(records), timeout=timeout)


def probabilities(result):
    return np.array([r.probability for r in result.results], dtype=np.float64)


def wait_for_report(path, condition, timeout=60):
    deadline = time.monotonic() + timeout
    report = None
    while time.monotonic() < deadline:
        if path.exists():
            report = json.loads(path.read_text())
            if condition(report):
                return report
        time.sleep(0.2)
    pytest.fail(f"the diff report never met the condition; last: {report}")


def test_500_records_answered_by_triton_match_the_legacy_service_and_the_report_says_500_compared(
        triton, legacy_port, german_credit_data, tmp_path):
    records = skill_records(german_credit_data, range(500))
    report_path, gateway_port, metrics_port = tmp_path / "diff.json", free_port(), free_port()
    direct = score(legacy_port, records)
    gateway, _ = start(gateway_args(gateway_port, triton, legacy_port, report_path, "--metrics-port",
                                    str(metrics_port)), "ready")
    try:
        mirrored = score(gateway_port, records)
        wait_for_report(report_path, lambda r: r["compared"] == 500)
        metrics = urllib.request.urlopen(f"http://localhost:{metrics_port}/metrics", timeout=10).read().decode()
    finally:
        assert stop(gateway) == 0
    assert [r.status for r in mirrored.results] == [skill_pb2.OK] * 500
    assert [r.request_id for r in mirrored.results] == [r.request_id for r in direct.results]
    assert parity.compare("gateway", probabilities(direct), probabilities(mirrored), TOLERANCE).rows_over_tolerance == 0
    assert [r.decision for r in mirrored.results] == [r.decision for r in direct.results]
    report = json.loads(report_path.read_text())
    assert report["answered_by"] == "triton" and report["compared"] == 500 and report["both_scored"] == 500
    assert report["decision_flips"] == {"count": 0, "request_ids": []}
    assert report["over_tolerance"]["count"] == 0 and report["max_abs_diff"] <= TOLERANCE
    assert report["mirror_failures"] == 0
    assert "s2t_cutover_compared_total 500.0" in metrics
    assert "s2t_cutover_decision_flips_total 0.0" in metrics


def test_answers_from_legacy_are_the_legacy_services_own_and_a_bad_record_is_refused_on_both_sides(
        triton, legacy_port, german_credit_data, tmp_path):
    records = skill_records(german_credit_data, range(100))
    del records[7].features["purpose"]
    report_path, gateway_port = tmp_path / "diff.json", free_port()
    direct = score(legacy_port, records)
    # Windows of 128 on both paths: TensorFlow's sums depend on the batch they run in (differences of 1e-8).
    with running(gateway_args(gateway_port, triton, legacy_port, report_path, "--answer-from", "legacy",
                              "--window-size", "128"), "ready"):
        answered = score(gateway_port, records)
        report = wait_for_report(report_path, lambda r: r["compared"] == 100)
    assert probabilities(answered).tolist() == probabilities(direct).tolist()
    assert answered.results[7].status == skill_pb2.INVALID_RECORD
    assert answered.results[7].error == "features.purpose: missing"
    assert report["answered_by"] == "legacy" and report["both_invalid"] == 1 and report["both_scored"] == 99
    assert report["errors_on_one_side"]["triton"]["count"] == report["errors_on_one_side"]["legacy"]["count"] == 0
    assert report["decision_flips"]["count"] == 0 and report["over_tolerance"]["count"] == 0


def test_a_legacy_side_that_hangs_then_dies_mid_run_costs_callers_nothing_and_is_counted(
        triton, german_credit_data, legacy_scores, tmp_path):
    mirror_timeout_s = 5
    legacy_port, gateway_port, report_path = free_port(), free_port(), tmp_path / "diff.json"
    legacy, _ = start(legacy_args(legacy_port), "listening")
    calls = [np.arange(50 * i, 50 * (i + 1)) for i in range(10)]
    answers = []
    try:
        with running(gateway_args(gateway_port, triton, legacy_port, report_path, "--mirror-timeout-s",
                                  str(mirror_timeout_s)), "ready") as gateway:
            for rows in calls[:3]:
                answers.append(score(gateway_port, skill_records(german_credit_data, rows)))
            wait_for_report(report_path, lambda r: r["compared"] == 150)

            legacy.send_signal(signal.SIGSTOP)  # hangs: connections open, nothing answered
            for rows in calls[3:6]:
                started = time.monotonic()
                answers.append(score(gateway_port, skill_records(german_credit_data, rows)))
                assert time.monotonic() - started < mirror_timeout_s
            wait_for_report(report_path, lambda r: r["mirror_failures"] == 6)
            legacy.send_signal(signal.SIGCONT)
            stop(legacy)

            for rows in calls[6:]:
                answers.append(score(gateway_port, skill_records(german_credit_data, rows)))
        assert gateway.returncode == 0
    finally:
        legacy.send_signal(signal.SIGCONT)
        stop(legacy)
    for rows, answer in zip(calls, answers):
        assert [r.status for r in answer.results] == [skill_pb2.OK] * 50
        assert parity.compare("gateway", legacy_scores[rows], probabilities(answer), TOLERANCE).rows_over_tolerance == 0
    report = json.loads(report_path.read_text())
    assert report["compared"] == 150
    assert report["mirror_failures"] == 14 and report["mirror_failed_records"] == 350
    assert report["mirror_failure_reasons"] == {"DEADLINE_EXCEEDED": 6, "UNAVAILABLE": 8}
