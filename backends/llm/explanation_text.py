"""The words around reason codes: the template answer (the light path) and the prompt the language model gets.

Both are built from the same reason codes and the record's own values, so the light path says exactly what the
model's weights say, and the language model is only asked to phrase it.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from s2t.backends.scoring.reason_codes import Reason


def _label(feature: str) -> str:
    return feature.replace("_", " ")


def _value(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"'{value}'" if isinstance(value, str) else str(value)


def reason_phrases(reasons: Sequence[Reason], features: Mapping[str, object]) -> list[str]:
    return [f"{_label(r.feature)} is {_value(features.get(r.feature))}" for r in reasons]


def template_explanation(decision: str, probability: float, reasons: Sequence[Reason],
                         features: Mapping[str, object]) -> str:
    head = f"Decision {decision}: estimated risk of default {probability:.0%}."
    if not reasons:
        return head + " No attribute raises the risk above its reference."
    return head + " Main reasons: " + "; ".join(reason_phrases(reasons, features)) + "."


def explanation_prompt(decision: str, probability: float, reasons: Sequence[Reason],
                       features: Mapping[str, object]) -> str:
    facts = "; ".join(reason_phrases(reasons, features)) or "no single attribute stands out"
    return (f"A loan application was scored {decision} with an estimated risk of default of {probability:.0%}. "
            f"The attributes that raised the risk most: {facts}. "
            "In two short sentences, explain this to the applicant in plain words.")
