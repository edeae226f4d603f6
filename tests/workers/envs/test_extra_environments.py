"""Environments from the user's own code through CRUCIBLE_ENVIRONMENTS (workers/envs/registry.py)."""

from __future__ import annotations

import pytest

from workers.envs.registry import load_extra_environments


def test_a_module_class_pair_registers_an_environment_by_its_name():
    from tests.workers.envs.hanging import HangingEnv

    assert load_extra_environments(" tests.workers.envs.hanging:HangingEnv ,") == {"hanging": HangingEnv}
    assert load_extra_environments("") == {}


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("tests.workers.envs.nowhere:Env", "cannot load 'tests.workers.envs.nowhere:Env'"),
        ("tests.workers.envs.hanging:Missing", "cannot load"),
        ("tests.workers.envs.hanging", "write module:Class"),
        ("tests.workers.envs.hanging:wait_for_a_tool_that_never_answers", "not a workers.envs.base.Environment"),
        ("workers.envs.exact_answer:ExactAnswerEnv", "'exact_answer', a name already taken"),
        ("tests.workers.envs.hanging:HangingEnv,tests.workers.envs.hanging:HangingEnv", "already taken"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_variable_and_the_fix(spec, words):
    with pytest.raises(ImportError, match="CRUCIBLE_ENVIRONMENTS") as caught:
        load_extra_environments(spec)
    assert words in str(caught.value)
