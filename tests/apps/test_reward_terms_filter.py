"""The reward-by-term filter the run and trajectory pages use instead of printing a Python dict."""

from __future__ import annotations

from apps.common.templatetags.reward_terms import reward_terms


def test_terms_read_as_names_and_values_never_as_a_dict() -> None:
    text = reward_terms({"normalized_match": 1.0, "length-cost": -0.02, "judge": "n/a"})
    assert text == "normalized_match 1.000 · length-cost \u22120.020 · judge n/a"
    assert "{" not in text
    assert reward_terms({}) == reward_terms(None) == "none"


def test_stored_json_is_shown_as_json() -> None:
    from apps.common.templatetags.json_view import json_pretty

    assert json_pretty({"b": [1, None], "a": True}) == '{\n  "a": true,\n  "b": [\n    1,\n    null\n  ]\n}'
