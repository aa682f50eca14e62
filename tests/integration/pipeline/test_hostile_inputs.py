"""The hostile-input suite: thousands of hostile records mixed with valid ones, sent concurrently to the live
server through risk_pipeline, risk_router and risk_stream. Afterwards the server is the same process and ready,
every valid record was scored right, and every hostile request got its own error naming the field."""
import json
import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from s2t.backends.scoring.decision_policy import decide
from s2t.clients import stream_client
from s2t.gate.hostile_records import (HOSTILE_ROUTES, HOSTILE_SEQUENCE_IDS, KINDS, ODD_BUT_VALID, hostile_records,
                                      names_field)

VALID, HOSTILE, ODD = 600, 2400, 150
CONCURRENCY = 16
TOLERANCE = 1e-5
_ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']*', ")


@pytest.fixture(scope="module")
def rows(german_credit_data):
    return german_credit_data.records()


def fire(url, model, calls):
    """Each call (payload, parameters) as its own request, CONCURRENCY at a time; (result | error) per call."""
    local, clients = threading.local(), []

    def one(call):
        payload, parameters = call
        if not hasattr(local, "client"):
            local.client = grpcclient.InferenceServerClient(url)
            clients.append(local.client)
        client = local.client
        tensor = grpcclient.InferInput("payload", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
        try:
            result = client.infer(model, [tensor], parameters=parameters, client_timeout=120)
            return {name: result.as_numpy(name) for name in ("probability", "decision")}
        except InferenceServerException as err:
            return err

    try:
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            return list(pool.map(one, calls))
    finally:
        for client in clients:
            client.close()


def mixed(rows, seed):
    """(kind, what, payload): valid records (what = row index), odd-but-valid ones and hostile ones, shuffled."""
    rng = random.Random(seed)
    items = [("valid", i % len(rows), json.dumps({"request_id": f"v-{i}", "features": rows[i % len(rows)]}).encode())
             for i in range(VALID)]
    items += [("odd", name, make(rows[rng.randrange(len(rows))], rng))
              for name, make in (ODD_BUT_VALID[i % len(ODD_BUT_VALID)] for i in range(ODD))]
    items += [("hostile", h, h.payload) for h in hostile_records(rows, HOSTILE, rng)]
    rng.shuffle(items)
    return items


def check_answers(items, answers, legacy_scores, thresholds, hostile_field=lambda what: what.field):
    lost = [a for a in answers if isinstance(a, InferenceServerException) and a.status() not in (
        "StatusCode.INVALID_ARGUMENT",)]
    assert not lost, f"{len(lost)} requests failed for another reason than their input: {lost[:3]}"
    for (kind, what, _), answer in zip(items, answers):
        if kind == "hostile":
            assert isinstance(answer, InferenceServerException), f"{what.kind}: scored"
            message = _ENSEMBLE_PREFIX.sub("", answer.message())
            assert names_field(message, hostile_field(what)), (what.kind, message[:200])
            assert len(message) < 1000, f"{what.kind}: the error echoes the record"
        else:
            assert not isinstance(answer, Exception), f"{kind} {what}: {answer}"
            probability = answer["probability"].ravel()
            assert 0.0 <= probability[0] <= 1.0
            assert answer["decision"].ravel().tolist() == decide(probability, thresholds).tolist()
            if kind == "valid":
                assert abs(probability[0] - legacy_scores[what]) <= TOLERANCE


def assert_same_server_ready(triton, pid):
    assert triton.process.poll() is None and triton.process.pid == pid
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        assert client.is_server_ready()
        assert all(client.is_model_ready(m) for m in ("risk_pipeline", "risk_router", "risk_stream"))
    finally:
        client.close()


def test_hostile_records_through_risk_pipeline(triton, rows, legacy_scores, decision_thresholds):
    pid = triton.process.pid
    items = mixed(rows, 1)
    answers = fire(triton.grpc_url, "risk_pipeline", [(p, None) for _, _, p in items])
    check_answers(items, answers, legacy_scores, decision_thresholds)
    assert {what.kind for kind, what, _ in items if kind == "hostile"} == {name for name, _ in KINDS}
    assert_same_server_ready(triton, pid)
    print(f"\nrisk_pipeline: {len(items)} requests ({HOSTILE} hostile of {len(KINDS)} kinds), "
          f"{sum(not isinstance(a, Exception) for a in answers)} scored, 0 lost")


def test_hostile_records_and_routes_through_risk_router(triton, rows, legacy_scores, decision_thresholds):
    pid = triton.process.pid
    items = mixed(rows, 2)
    rng = random.Random(3)
    # A fifth of the valid records ask for a route the router does not serve: those must fail naming `route`.
    calls = []
    for k, (kind, what, payload) in enumerate(items):
        if kind == "valid" and rng.random() < 0.2:
            route = HOSTILE_ROUTES[k % len(HOSTILE_ROUTES)]
            items[k] = ("hostile", "route", payload)
            calls.append((payload, {"route": route}))
        else:
            calls.append((payload, None))
    answers = fire(triton.grpc_url, "risk_router", calls)
    check_answers(items, answers, legacy_scores, decision_thresholds,
                  hostile_field=lambda what: what if what == "route" else what.field)
    assert_same_server_ready(triton, pid)
    print(f"\nrisk_router: {len(items)} requests, {sum(k == 'hostile' for k, _, _ in items)} hostile "
          f"(of which {sum(w == 'route' for _, w, _ in items)} routes), 0 lost")


def test_hostile_records_and_ids_through_risk_stream(triton, rows, legacy_scores, decision_thresholds):
    """16 streams at once; each sends 40 valid records in order with hostile ids, hostile records and duplicates
    between them. Every request is answered once; the valid records OK, in order, scored right."""
    pid = triton.process.pid
    rng = random.Random(4)
    json_kinds = [(name, make) for name, make in KINDS if not name.startswith("protobuf")]
    plans = []
    for k in range(16):
        sends = []  # (what, payload); what: ("valid", i) | ("hostile", field) | ("duplicate", i)
        for i in range(40):
            sends.append((("valid", i), None))
            roll = rng.random()
            if roll < 0.3:
                sequence_id = HOSTILE_SEQUENCE_IDS[rng.randrange(len(HOSTILE_SEQUENCE_IDS))]
                record = {"features": rows[i]} if sequence_id is None else {"sequence_id": sequence_id,
                                                                            "features": rows[i]}
                text = json.dumps(record).encode()
                if isinstance(sequence_id, int) and abs(sequence_id) > 2 ** 64:
                    text = text.replace(str(sequence_id).encode(), b"1" + b"0" * 400)
                sends.append((("hostile", "sequence_id|payload"), text))
            elif roll < 0.5:
                name, make = json_kinds[rng.randrange(len(json_kinds))]
                payload, _ = make(rows[i], rng)
                # Without a usable id a record has no place in the stream: refused naming sequence_id, or the
                # payload when it cannot be read at all.
                sends.append((("hostile", "sequence_id|payload|stream_id|request_id|features"), payload))
            elif roll < 0.6:
                sends.append((("duplicate", i), None))
        plans.append(sends)
    results = [None] * len(plans)

    def run(k):
        sends = plans[k]
        order = [what[1] if what[0] in ("valid", "duplicate") else 0 for what, _ in sends]
        payloads = {place: payload for place, (_, payload) in enumerate(sends) if payload is not None}
        results[k] = stream_client.run_stream(triton.grpc_url, f"hostile-stream-{k}", [{"features": r} for r in rows],
                                              order, payloads=payloads, timeout_s=120)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for sends, result in zip(plans, results):
        assert result.complete, f"{result.stream}: {result.finals} of {len(sends)} requests answered"
        ok = [a for a in result.answers if a.status == "OK"]
        assert [a.sequence_id for a in ok] == list(range(40)), "valid records answered OK, in order"
        probability = np.array([a.probability for a in ok])
        assert np.abs(probability - legacy_scores[:40]).max() <= TOLERANCE
        assert [a.decision.encode() for a in ok] == decide(probability.astype(np.float32),
                                                           decision_thresholds).tolist()
        duplicates = sorted(what[1] for what, _ in sends if what[0] == "duplicate")
        assert sorted(a.sequence_id for a in result.answers if a.status == "DUPLICATE") == duplicates
        assert not [a for a in result.answers if a.status in ("GAP", "LATE")]
        hostile = [what[1] for what, _ in sends if what[0] == "hostile"]
        assert len(result.errors) == len(hostile)
        for error, field in zip(result.errors, hostile):
            assert names_field(error, field), error[:200]
    assert_same_server_ready(triton, pid)
    requests = sum(len(s) for s in plans)
    print(f"\nrisk_stream: 16 streams, {requests} requests, "
          f"{sum(what[0] == 'hostile' for s in plans for what, _ in s)} hostile, "
          f"{sum(what[0] == 'duplicate' for s in plans for what, _ in s)} duplicates, 0 lost")
