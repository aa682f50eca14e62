"""risk_stream on the real server: in-order, exactly-once answers per stream under shuffling, duplication and loss."""
import json
import re
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest

from backends.decision_policy import decide
from clients import stream_client
from clients.legacy_record import encode
from tests.conftest import S2T

TOLERANCE = 1e-5
COUNTERS = ("reordered", "duplicate", "late", "gap")


@pytest.fixture(scope="module")
def records(german_credit_data):
    return [{"features": f} for f in german_credit_data.records()]


@pytest.fixture(scope="module")
def legacy(legacy_scores):
    return legacy_scores


@pytest.fixture(scope="module")
def thresholds(decision_thresholds):
    return decision_thresholds


def answers(result):
    return [(a.status, a.sequence_id, a.last_id) for a in result.answers]


def metrics(triton) -> dict[str, float]:
    with urllib.request.urlopen(f"http://localhost:{triton.metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(s2t_stream_\w+)\{[^}]*\} (\S+)$", text, re.M)}


@pytest.mark.parametrize("form", ["json", "protobuf"])
def test_thousand_records_on_eight_streams_shuffled_within_the_window_arrive_in_order_with_correct_scores(
        triton, records, legacy, thresholds, form):
    results, rows, _ = stream_client.replay(triton.grpc_url, records, 8, shuffle=0.1, window=8, form=form, seed=11)
    assert sum(len(r.sent) for r in results) == 1000
    for result, stream_rows in zip(results, rows):
        assert result.complete and result.errors == []
        assert [a.status for a in result.answers] == ["OK"] * len(stream_rows)
        assert result.ok_ids == list(range(len(stream_rows)))
        probability = np.array([a.probability for a in result.answers])
        assert np.abs(probability - legacy[stream_rows]).max() <= TOLERANCE
        decisions = [a.decision.encode() for a in result.answers]
        assert decisions == decide(probability.astype(np.float32), thresholds).tolist()
    assert sum(r.sent != sorted(r.sent) for r in results) > 0, "the replay did shuffle"


def test_duplicates_late_and_lost_records_get_the_documented_answers(triton, records):
    # 1 twice, 2 lost until 3 and 4 have waited past reorder_timeout_ms (200) and it was given up, then 2 late,
    # 0 again.
    order = [0, 1, 1, 3, 4, 2, 5, 0]
    result = stream_client.run_stream(triton.grpc_url, "dup-late-lost", records, order, wait_for={5: ("GAP", 2)})
    assert result.complete and result.errors == []
    assert answers(result) == [("OK", 0, 0), ("OK", 1, 1), ("DUPLICATE", 1, 1), ("GAP", 2, 2), ("OK", 3, 3),
                               ("OK", 4, 4), ("LATE", 2, 2), ("OK", 5, 5), ("DUPLICATE", 0, 0)]
    late = result.answers[6]
    assert 0.0 <= late.probability <= 1.0 and late.decision in ("APPROVE", "REVIEW", "DECLINE")
    assert result.finals == len(order)


def test_a_record_further_ahead_than_max_gap_gives_up_the_oldest_missing_id(triton, records):
    # 12 is 11 ids ahead of 1 (max_gap 10): 1 is given up at once, 2..11 are still waited for.
    order = [0, 12, *range(2, 12), 1]
    result = stream_client.run_stream(triton.grpc_url, "beyond-max-gap", records, order)
    assert result.complete and result.errors == []
    assert answers(result) == [("OK", 0, 0), ("GAP", 1, 1), *[("OK", i, i) for i in range(2, 13)], ("LATE", 1, 1)]


def test_sequence_end_flushes_waiting_records_naming_the_missing_ids(triton, records):
    result = stream_client.run_stream(triton.grpc_url, "end-flush", records, [0, 4, 2])
    assert result.complete
    assert answers(result) == [("OK", 0, 0), ("GAP", 1, 1), ("OK", 2, 2), ("GAP", 3, 3), ("OK", 4, 4)]


def test_a_malformed_record_is_answered_with_an_error_and_the_stream_continues(triton, records):
    missing_purpose = {k: v for k, v in records[2]["features"].items() if k != "purpose"}
    payloads = {2: encode({"sequence_id": 2, "features": missing_purpose}, "protobuf"), 5: b"{not json"}
    order = [0, 1, 2, 3, 4, 99, 5]
    result = stream_client.run_stream(triton.grpc_url, "malformed", records, order, payloads=payloads)
    assert result.complete
    assert answers(result) == [("OK", i, i) for i in (0, 1, 3, 4, 5)]
    assert len(result.errors) == 2
    assert any("sequence_id 2: features.purpose: missing" in e for e in result.errors), result.errors
    assert any("payload: not valid JSON" in e for e in result.errors), result.errors


def test_a_record_without_a_sequence_id_is_refused_naming_the_field(triton, records):
    payloads = {1: json.dumps({"features": records[1]["features"]}).encode()}
    result = stream_client.run_stream(triton.grpc_url, "no-sequence-id", records, [0, 1, 1], payloads=payloads)
    assert result.complete and answers(result) == [("OK", 0, 0), ("OK", 1, 1)]
    assert len(result.errors) == 1 and "sequence_id: missing" in result.errors[0]


def counts(grpc_client) -> tuple[int, int]:
    stats = grpc_client.get_inference_statistics("risk_stream", as_json=True)["model_stats"][0]
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def test_streams_are_batched_together_not_served_one_by_one(triton, records, grpc_client):
    inferences_before, executions_before = counts(grpc_client)
    results, _, _ = stream_client.replay(triton.grpc_url, records[:400], 8, seed=3)
    assert all(r.complete and r.errors == [] and len(r.ok_ids) == len(r.sent) for r in results)
    # risk_stream sends a batch's answers before its execute returns, and Triton counts the batch only then: the
    # last batch may still be uncounted when its answers arrive.
    deadline = time.monotonic() + 30
    while counts(grpc_client)[0] - inferences_before < 400 and time.monotonic() < deadline:
        time.sleep(0.05)
    inferences_after, executions_after = counts(grpc_client)
    inferences, executions = inferences_after - inferences_before, executions_after - executions_before
    assert inferences == 400
    assert executions < inferences, f"{executions} executions for {inferences} records: no batch across streams"


def test_reorder_metrics_appear_on_the_metrics_port_after_traffic(triton, records):
    before = metrics(triton)
    results, _, _ = stream_client.replay(triton.grpc_url, records[:300], 4, shuffle=0.3, window=6, duplicate=0.1,
                                         loss=0.05, seed=5)
    late_order = [0, 2, 1]  # 1 arrives after the timeout has given it up
    stream_client.run_stream(triton.grpc_url, "metrics-late", records, late_order, wait_for={2: ("GAP", 1)})
    after = metrics(triton)
    for name in COUNTERS:
        assert after[f"s2t_stream_{name}_total"] > before.get(f"s2t_stream_{name}_total", 0.0), name
    assert "s2t_stream_buffered" in after and "s2t_stream_overflow_total" in after
    assert after["s2t_stream_buffered"] == 0.0  # every stream ended: nothing left waiting


def test_stream_command_reports_in_order_rate_latency_and_throughput(triton):
    out = subprocess.run([str(S2T), "stream", "--grpc-url", triton.grpc_url, "--streams", "16",
                          "--records", "320", "--duplicate", "0.05", "--form", "protobuf"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "streams 16  records sent" in out.stdout
    assert "in-order rate 1.0000  exactly once yes" in out.stdout
    assert re.search(r"p50 [\d.]+ ms  p95 [\d.]+ ms  p99 [\d.]+ ms", out.stdout)
    assert re.search(r"throughput \d+ records/s", out.stdout)


def test_hostile_sequence_ids_each_get_an_explicit_answer_and_healthy_streams_keep_theirs(triton, records):
    """Ids beyond int64, far beyond it, negative, not integers, missing (protobuf reads 0) and duplicated, sent
    on eight streams at once next to eight healthy ones whose missing id only the timer gives up."""
    features = records[0]["features"]
    hostile = {
        1: json.dumps({"sequence_id": 2 ** 63, "features": features}).encode(),
        2: b'{"sequence_id": 1' + b"0" * 400 + b', "features": {}}',
        3: json.dumps({"sequence_id": -1, "features": features}).encode(),
        4: json.dumps({"sequence_id": "4", "features": features}).encode(),
        5: encode({"features": features}, "protobuf"),
    }
    expected_errors = ["sequence_id: 9223372036854775808 is outside 0..9223372036854775807",
                       "sequence_id: 1000000000", "sequence_id: -1 is outside",
                       "sequence_id: expected an integer, got string"]
    results = {}

    def run(name, order, payloads=None, wait_for=None):
        results[name] = stream_client.run_stream(triton.grpc_url, name, records, order, payloads=payloads,
                                                 wait_for=wait_for, timeout_s=30)

    threads = [threading.Thread(target=run, args=(f"hostile-{k}", [0, 1, 2, 3, 4, 5, 1, 6], hostile))
               for k in range(8)]
    # 1 is missing until 2 has waited past reorder_timeout_ms (200): the timer answers GAP 1 and 2; the rest are sent
    # once GAP 1 has come, so 1, sent last, is LATE.
    threads += [threading.Thread(target=run, args=(f"healthy-{k}", [0, 2, 3, 4, 5, 6, 7, 1], None, {2: ("GAP", 1)}))
                for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, result in results.items():
        assert result.complete, f"{name}: {result.finals} of {len(result.sent)} requests answered"
        if name.startswith("healthy"):
            assert answers(result) == [("OK", 0, 0), ("GAP", 1, 1), *[("OK", i, i) for i in range(2, 8)],
                                       ("LATE", 1, 1)] and result.errors == []
            continue
        # The protobuf record without an id reads 0: a duplicate of the stream's first record.
        assert answers(result) == [("OK", 0, 0), ("DUPLICATE", 0, 0), ("OK", 1, 1), ("GAP", 2, 5), ("OK", 6, 6)]
        assert len(result.errors) == 4
        for error, text in zip(result.errors, expected_errors):
            assert text in error, result.errors
