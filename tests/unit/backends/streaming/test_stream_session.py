"""The stream session decides one final answer per request, whatever its record says, and loses none."""
import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s2t.backends.runtime.serving_errors import INTERNAL, INVALID, UNAVAILABLE, InvalidInput, of_kind
from s2t.backends.records.record_decoder import SEQUENCE_ID_MAX, parse_record
from s2t.backends.streaming.reorder_buffer import ReorderSettings
from s2t.backends.streaming.session import DUPLICATE, LATE, OK, Arrival, StreamModelSettings, StreamSession
from tests.unit.fake_clock import Clock

SETTINGS = ReorderSettings(max_gap=10, reorder_timeout_ms=200, max_buffered=4)


def record(sequence_id, stream="s", **extra) -> bytes:
    """A record whose score the fake scorer reads from `p` (0.5 unless given); `bad` makes scoring refuse it."""
    features = {"p": 0.5, **({"bad": 1} if extra.pop("bad", False) else {})}
    return json.dumps({"sequence_id": sequence_id, "stream_id": stream, "features": features, **extra}).encode()


def raw(text: str) -> bytes:
    return text.encode()


def score_batch(payloads):
    records = [parse_record(p) for p in payloads]
    if any("bad" in r.features for r in records):
        raise of_kind(INVALID, "features.purpose: missing")
    return (np.array([[r.features["p"]] for r in records], dtype=np.float32),
            np.array([[b"REVIEW"]] * len(records), dtype=object))


class Session:
    """A session whose answers are collected per request token."""

    def __init__(self, fail_delivery=lambda answer: False, settings=SETTINGS):
        self.clock, self.answers, self.log, self.sent = Clock(0.0), [], [], 0

        def deliver(answer):
            if fail_delivery(answer):
                raise RuntimeError("send failed")
            self.answers.append(answer)

        self.session = StreamSession(settings, score_batch, deliver, log=self.log.append, clock_ms=self.clock)

    def send(self, *payloads, stream="s", start=False, end=False):
        arrivals = [Arrival(f"{stream}/{self.sent + k}", stream, start and k == 0, end and k == len(payloads) - 1,
                            payload=p) for k, p in enumerate(payloads)]
        self.sent += len(payloads)
        self.session.arrive(arrivals)
        return [a.token for a in arrivals]

    def finals(self, token):
        return [a for a in self.answers if a.token == token and a.final]

    def final(self, token):
        finals = self.finals(token)
        assert len(finals) == 1, f"{token}: {len(finals)} final answers"
        return finals[0]


@pytest.mark.parametrize("payload, kind, text", [
    (record(-1), INVALID, "sequence_id: -1 is outside 0..9223372036854775807"),
    (record(2 ** 63), INVALID, "sequence_id: 9223372036854775808 is outside"),
    (raw('{"sequence_id": 1' + "0" * 400 + ', "features": {}}'), INVALID, "sequence_id: 1000000000"),
    (raw('{"sequence_id": 1' + "0" * 5000 + ', "features": {}}'), INVALID, "payload: a JSON integer has more than"),
    (json.dumps({"features": {"p": 0.5}}).encode(), INVALID, "sequence_id: missing"),
    (record("7"), INVALID, "sequence_id: expected an integer, got string"),
    (record(0, stream="other"), INVALID, "stream_id: 'other' is not the stream of this sequence"),
    (b"{", INVALID, "payload: not valid JSON"),
    (record(0, bad=True), INVALID, "sequence_id 0: features.purpose: missing"),
])
def test_a_record_without_a_usable_place_gets_an_error_naming_the_field(payload, kind, text):
    s = Session()
    token, = s.send(payload, start=True)
    answer = s.final(token)
    assert answer.error is not None and answer.error.kind == kind and text in answer.error.message
    assert len(answer.error.message) < 300


def test_huge_ids_are_refused_and_other_streams_are_still_answered_by_the_timer():
    s = Session()
    healthy = s.send(record(1, stream="healthy"), stream="healthy", start=True)  # 0 missing: waits
    huge = s.send(record(2 ** 63, stream="huge"), record(10 ** 30, stream="huge"), stream="huge", start=True)
    s.clock.now = 250.0
    s.session.expire()
    assert [(a.status, a.sequence_id) for a in s.answers if a.token == healthy[0]] == [("GAP", 0), (OK, 1)]
    assert all(s.final(t).error.kind == INVALID for t in huge)


def test_the_largest_int64_id_is_served_and_the_stream_goes_on():
    s = Session()
    first, = s.send(record(SEQUENCE_ID_MAX), start=True)
    s.clock.now = 250.0
    s.session.expire()
    assert s.final(first).status == OK and s.final(first).sequence_id == SEQUENCE_ID_MAX
    # The window slides at once (max_gap 10), the rest is given up when the timeout passes.
    gaps = [a.status_text for a in s.answers if a.status == "GAP"]
    assert gaps == [f"GAP 0-{SEQUENCE_ID_MAX - 11}", f"GAP {SEQUENCE_ID_MAX - 10}-{SEQUENCE_ID_MAX - 1}"]
    late, = s.send(record(5))
    assert s.final(late).status == LATE


@pytest.mark.parametrize("ids, duplicates", [
    ([0, 0], [1]),  # answered already
    ([0, 2, 2], [2]),  # waiting
    ([0, 1, 0, 1], [2, 3]),
])
def test_a_duplicate_is_answered_duplicate_never_closed_silently(ids, duplicates):
    s = Session()
    tokens = s.send(*[record(i) for i in ids], start=True)
    for k in duplicates:
        answer = s.final(tokens[k])
        assert (answer.status, answer.sequence_id, answer.error) == (DUPLICATE, ids[k], None)
        assert math.isnan(answer.probability)


def test_a_protobuf_record_without_sequence_id_reads_zero_and_is_answered():
    from s2t.clients.legacy_record import encode
    s = Session()
    first, second = s.send(encode({"stream_id": "s", "features": {"p": 0.5}}, "protobuf"),
                           encode({"stream_id": "s", "features": {"p": 0.5}}, "protobuf"), start=True)
    assert s.final(first).status == OK and s.final(first).sequence_id == 0
    assert s.final(second).status == DUPLICATE


def test_an_id_below_the_first_of_a_resumed_stream_is_refused_as_stale():
    s = Session()
    s.send(record(10))  # no START: the stream goes on from 10 (evicted while idle, or the instance restarted)
    stale, = s.send(record(3))
    assert s.final(stale).error.kind == INVALID
    assert "sequence_id 3: below 10, the first id of stream s" in s.final(stale).error.message


def test_a_full_buffer_refuses_the_record_as_unavailable():
    s = Session()
    tokens = s.send(*[record(i) for i in (1, 2, 3, 4, 5)], start=True)
    assert s.final(tokens[-1]).error.kind == UNAVAILABLE
    assert "reorder buffer of stream s full" in s.final(tokens[-1]).error.message


def test_a_failed_delivery_is_replaced_by_an_error_and_the_rest_of_the_round_still_goes_out():
    s = Session(fail_delivery=lambda a: a.status == OK and a.sequence_id == 1)
    tokens = s.send(record(1), record(2), record(3), start=True)
    s.clock.now = 250.0
    s.session.expire()
    assert s.final(tokens[0]).error.kind == INTERNAL
    assert [s.final(t).status for t in tokens[1:]] == [OK, OK]
    assert s.session.delivery_failures == 1 and "send failed" in s.log[0]


def test_end_answers_every_waiting_record():
    s = Session()
    tokens = s.send(record(0), record(3), record(2), start=True, end=True)
    assert [s.final(t).status for t in tokens] == [OK, OK, OK]
    assert s.session.snapshot()[1:] == (0, 0)


def test_a_request_without_exactly_one_record_is_answered_with_its_error():
    s = Session()
    s.session.arrive([Arrival("t", "s", error=InvalidInput("payload: a stream request carries one record, got 2"))])
    assert s.final("t").error.message == "payload: a stream request carries one record, got 2"


ids = st.one_of(st.integers(-5, 30), st.integers(2 ** 63 - 3, 2 ** 63 + 3), st.just(10 ** 400), st.none(),
                st.text(max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), ids, st.booleans()), max_size=30),
       st.lists(st.floats(0, 400), max_size=5))
def test_every_request_gets_exactly_one_final_answer_whatever_the_ids(sends, pauses):
    s = Session()
    tokens = []
    for k, (stream, sequence_id, start) in enumerate(sends):
        if sequence_id is None:
            payload = json.dumps({"stream_id": stream, "features": {"p": 0.5}}).encode()
        elif isinstance(sequence_id, int) and abs(sequence_id) > 10 ** 300:
            payload = raw('{"sequence_id": ' + str(sequence_id) + ', "features": {"p": 0.5}}')
        else:
            payload = record(sequence_id, stream=stream)
        tokens += s.send(payload, stream=stream, start=start)
        if k < len(pauses):
            s.clock.now += pauses[k]
            s.session.expire()
    s.session.close()
    for token in tokens:
        s.final(token)
    assert s.session.snapshot()[1:] == (0, 0)


@pytest.mark.parametrize("batching, refused", [
    ({"oldest": {"max_candidate_sequences": "4096"}}, False),
    ({"oldest": {"max_candidate_sequences": 100}}, False),
    ({"oldest": {"max_candidate_sequences": "4097"}}, True),
    ({"direct": {}}, False),
    ({}, False),
])
def test_a_batcher_with_more_slots_than_the_model_keeps_streams_is_refused(batching, refused):
    from s2t.backends.streaming.session import check_sequence_batching
    settings = StreamModelSettings(reorder=ReorderSettings())
    if refused:
        with pytest.raises(ValueError, match=r"max_streams \(4096\) must be at least .* \(4097\)"):
            check_sequence_batching(settings, batching)
    else:
        check_sequence_batching(settings, batching)


def test_the_shipped_config_keeps_state_for_every_slot_and_forgets_streams_when_triton_does():
    from s2t.backends.runtime.model_parameters import read_parameters
    from s2t.backends.streaming.session import check_sequence_batching
    from tests.conftest import MODEL_REPOSITORY
    text = (MODEL_REPOSITORY / "risk_stream" / "config.pbtxt").read_text()
    parameters = {m.group(1): {"string_value": m.group(2)} for m in re.finditer(
        r'key: "(\w+)"\s*value: \{ string_value: "([^"]*)" \}', text)}
    settings = read_parameters(StreamModelSettings, parameters)
    slots = re.search(r"max_candidate_sequences:\s*(\d+)", text).group(1)
    idle_us = int(re.search(r"max_sequence_idle_microseconds:\s*(\d+)", text).group(1))
    check_sequence_batching(settings, {"oldest": {"max_candidate_sequences": slots}})
    assert settings.reorder.stream_idle_ms * 1000 == idle_us
