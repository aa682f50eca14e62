import asyncio

import numpy as np
import pytest

from s2t.backends.scoring.batch_scoring import (retrying, retrying_async, score_isolating_bad_records,
                                                score_isolating_bad_records_async)
from s2t.backends.runtime.serving_errors import INTERNAL, INVALID, UNAVAILABLE, NotAnsweredInTime, ServingError, of_kind


class FakeScorer:
    """Scores b"p=<float>" records; any other record makes its whole call fail as Triton does."""

    def __init__(self, failure_kind=INVALID):
        self.calls = []
        self.failure_kind = failure_kind

    def __call__(self, payloads):
        self.calls.append(list(payloads))
        bad = [p for p in payloads if not p.startswith(b"p=")]
        if bad:
            raise of_kind(self.failure_kind, f"bad record {bad[0].decode()}")
        probabilities = np.array([[float(p[2:])] for p in payloads], dtype=np.float32)
        return probabilities, np.array([[b"APPROVE"]] * len(payloads), dtype=object)


def test_good_records_are_scored_in_one_call():
    scorer = FakeScorer()
    scored = score_isolating_bad_records([b"p=0.25", b"p=0.5"], scorer)
    assert [s.probability for s in scored] == [0.25, 0.5]
    assert [s.error for s in scored] == [None, None]
    assert len(scorer.calls) == 1


def test_a_bad_record_gets_its_own_error_and_its_batch_mates_are_scored():
    scorer = FakeScorer()
    scored = score_isolating_bad_records([b"p=0.25", b"oops", b"p=0.75"], scorer)
    assert [s.probability for s in scored[::2]] == [0.25, 0.75]
    assert scored[1].error.kind == INVALID and scored[1].error.message == "bad record oops"
    assert len(scorer.calls) == 4  # the batch, then one call per record


@pytest.mark.parametrize("kind", [UNAVAILABLE, INTERNAL])
def test_a_server_failure_fails_every_record_without_retrying_one_by_one(kind):
    scorer = FakeScorer(failure_kind=kind)
    scored = score_isolating_bad_records([b"p=0.25", b"oops"], scorer)
    assert [s.error.kind for s in scored] == [kind, kind]
    assert len(scorer.calls) == 1


def test_a_wrong_number_of_scores_is_an_internal_error_not_a_misaligned_answer():
    scored = score_isolating_bad_records([b"a", b"b"], lambda p: (np.zeros((1, 1)), np.array([[b"X"]], dtype=object)))
    assert [s.error.kind for s in scored] == [INTERNAL, INTERNAL]


def test_no_records_means_no_call():
    assert score_isolating_bad_records([], lambda p: pytest.fail("called")) == []


def test_the_ensemble_prefix_of_a_step_error_is_not_passed_on():
    error = of_kind(INVALID, "in ensemble 'risk_pipeline', features.purpose: missing")
    assert error.message == str(error) == "features.purpose: missing"


@pytest.mark.parametrize("failures, kind, calls, outcome", [
    (0, UNAVAILABLE, 1, "scored"),
    (2, UNAVAILABLE, 3, "scored"),  # shed twice, then taken
    (3, UNAVAILABLE, 3, UNAVAILABLE),  # still overloaded after the last pause
    (1, INVALID, 1, INVALID),  # a bad record is not retried
    (1, INTERNAL, 1, INTERNAL),
])
def test_retrying_rides_out_shed_requests_only(failures, kind, calls, outcome):
    attempts, pauses = [], []

    def flaky(payloads):
        attempts.append(payloads)
        if len(attempts) <= failures:
            raise of_kind(kind, "Request timeout expired")
        return np.zeros((len(payloads), 1)), np.array([[b"APPROVE"]] * len(payloads), dtype=object)

    score = retrying(flaky, backoff_s=(0.05, 0.2), sleep=pauses.append)
    if outcome == "scored":
        assert score([b"x"])[0].shape == (1, 1)
    else:
        with pytest.raises(ServingError) as err:
            score([b"x"])
        assert err.value.kind == outcome
    assert len(attempts) == calls
    assert pauses == [0.05, 0.2][:calls - 1]


def test_the_coroutine_form_isolates_bad_records_as_the_blocking_one_does():
    scorer = FakeScorer()

    async def score_batch(payloads):
        return scorer(payloads)

    payloads = [b"p=0.25", b"oops", b"p=0.75", b"bad"]
    scored = asyncio.run(score_isolating_bad_records_async(payloads, score_batch))
    assert [(s.probability, s.error and s.error.message) for s in scored[::2]] == [(0.25, None), (0.75, None)]
    assert [s.error.message for s in scored[1::2]] == ["bad record oops", "bad record bad"]
    assert len(scorer.calls) == 5


@pytest.mark.parametrize("failures, kind, calls", [(2, UNAVAILABLE, 3), (1, INVALID, 1)])
def test_the_coroutine_form_retries_shed_requests_only(failures, kind, calls):
    attempts = []

    async def flaky(payloads):
        attempts.append(payloads)
        if len(attempts) <= failures:
            raise of_kind(kind, "Request timeout expired")
        return np.zeros((len(payloads), 1)), np.array([[b"APPROVE"]] * len(payloads), dtype=object)

    score = retrying_async(flaky, backoff_s=(0.001, 0.002))
    if kind == UNAVAILABLE:
        assert asyncio.run(score([b"x"]))[0].shape == (1, 1)
    else:
        with pytest.raises(ServingError):
            asyncio.run(score([b"x"]))
    assert len(attempts) == calls


def test_neither_form_sends_again_a_request_not_answered_in_time():
    """It may still be running where it was sent: a second copy would only add to the load that made it late."""
    attempts = []

    def late(payloads):
        attempts.append(payloads)
        raise NotAnsweredInTime("Triton did not answer within 30 s")

    async def late_async(payloads):
        return late(payloads)

    with pytest.raises(NotAnsweredInTime):
        retrying(late, backoff_s=(0.05, 0.2), sleep=lambda _: None)([b"x"])
    with pytest.raises(NotAnsweredInTime):
        asyncio.run(retrying_async(late_async, backoff_s=(0.001, 0.002))([b"x"]))
    assert len(attempts) == 2
