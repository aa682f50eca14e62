import pytest

from s2t.backends.llm.degrade_policy import EXPECTED_TTFT, LLM, DegradePolicy
from s2t.backends.llm.explanation_text import explanation_prompt, template_explanation
from s2t.backends.scoring.reason_codes import Reason

REASONS = (Reason("duration_in_month", 0.6954), Reason("status_of_existing_checking_account", 0.812))
FEATURES = {"duration_in_month": 48.0, "status_of_existing_checking_account": "... < 0 DM"}


def test_the_template_states_the_decision_and_each_reason_with_its_value():
    assert template_explanation("DECLINE", 0.734, REASONS, FEATURES) == (
        "Decision DECLINE: estimated risk of default 73%. Main reasons: duration in month is 48; "
        "status of existing checking account is '... < 0 DM'.")


def test_the_template_without_reasons_says_so():
    assert template_explanation("APPROVE", 0.05, (), {}).endswith("No attribute raises the risk above its reference.")


def test_the_prompt_carries_the_same_facts_as_the_template():
    prompt = explanation_prompt("DECLINE", 0.734, REASONS, FEATURES)
    assert "duration in month is 48" in prompt and "DECLINE" in prompt and "73%" in prompt


def test_reason_codes_are_feature_and_signed_points():
    assert [r.code() for r in REASONS] == ["duration_in_month:+0.695", "status_of_existing_checking_account:+0.812"]


def test_the_model_is_tried_until_its_expected_ttft_is_over_the_threshold():
    policy = DegradePolicy(threshold_s=1.0, probe_interval_s=5.0)
    assert policy.route(0.0) == LLM
    policy.first_token(0.3)
    assert policy.route(1.0) == LLM
    policy.timed_out(4.0)
    assert policy.estimate.value > 1.0
    assert policy.route(2.0) == EXPECTED_TTFT


def test_a_degraded_policy_still_probes_the_model_once_per_interval():
    policy = DegradePolicy(threshold_s=1.0, probe_interval_s=5.0)
    policy.route(0.0)
    policy.timed_out(3.0)
    assert policy.route(1.0) == EXPECTED_TTFT
    assert policy.route(5.5) == LLM
    assert policy.route(6.0) == EXPECTED_TTFT


@pytest.mark.parametrize("threshold, interval", [(-1.0, 5.0), (1.0, 0.0)])
def test_bad_degrade_settings_refuse_to_load(threshold, interval):
    with pytest.raises(ValueError):
        DegradePolicy(threshold, interval)
