"""The coding environment on HumanEval, in the real sandbox: canonical solutions pass, wrong code fails, and the
ways code dodges its tests (exiting early, hanging, crashing) never count as a pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workers.benchmarks.humaneval import humaneval_rows
from workers.envs.base import TaskFieldError
from workers.envs.coding import CodingEnv, extract_code
from workers.envs.registry import make_env
from workers.evals.stats import pass_at_ks
from workers.jobs.evaluate import task_result
from workers.rewards.schema import validate_reward_spec
from workers.rewards.score import score_trajectory
from workers.trajectories import Trajectory

ROWS = humaneval_rows()
BY_ID = {row["id"]: row for row in ROWS}


def _episode(row: dict, reply: str, **params: object) -> dict:  # type: ignore[type-arg]
    env = make_env("coding", **params)
    env.reset(CodingEnv.validate_task_row(row))
    result = env.step(reply)
    assert result.done
    return env.trajectory("t")


def _full(row: dict) -> str:  # type: ignore[type-arg]
    return f"Here it is:\n```python\n{row['code_prompt']}{row['canonical_solution']}```\n"


def test_humaneval_ships_164_problems_as_valid_coding_rows() -> None:
    assert len(ROWS) == 164 and len(BY_ID) == 164
    for index, row in enumerate(ROWS, start=1):
        CodingEnv.validate_task_row(row, index=index)


@pytest.mark.parametrize("task_id", [f"HumanEval/{i}" for i in range(0, 164, 7)])
def test_canonical_solutions_pass_in_the_sandbox(task_id: str) -> None:
    record = _episode(BY_ID[task_id], _full(BY_ID[task_id]))
    assert record["tests_passed"] == 1.0, record["sandbox"]
    assert record["sandbox"]["outcome"] == "ok" and record["error"] is None


@pytest.mark.slow
def test_every_canonical_solution_passes_in_the_sandbox() -> None:
    failing = [row["id"] for row in ROWS if _episode(row, _full(row))["tests_passed"] != 1.0]
    assert failing == []


def test_a_completion_of_the_body_runs_after_the_prompt() -> None:
    row = BY_ID["HumanEval/0"]
    assert _episode(row, row["canonical_solution"])["tests_passed"] == 1.0


def test_a_wrong_answer_fails_with_the_assertion_in_stderr() -> None:
    row = BY_ID["HumanEval/0"]
    record = _episode(row, "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")
    assert record["tests_passed"] == 0.0
    assert record["sandbox"]["outcome"] == "failed" and "AssertionError" in record["sandbox"]["stderr"]


@pytest.mark.parametrize("escape", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit(0)"])
def test_exiting_cleanly_before_the_tests_is_not_a_pass(escape: str) -> None:
    row = BY_ID["HumanEval/0"]
    reply = f"```python\n{escape}\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    record = _episode(row, reply)
    assert record["tests_passed"] == 0.0
    assert record["sandbox"]["outcome"] == "failed" and "before its tests finished" in record["sandbox"]["detail"]


def test_a_hanging_answer_is_a_timeout_not_a_pass_and_not_an_infrastructure_error() -> None:
    row = BY_ID["HumanEval/0"]
    reply = "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```"
    record = _episode(row, reply, timeout_seconds=1.0)
    assert record["tests_passed"] == 0.0 and record["sandbox"]["outcome"] == "timeout"
    assert record["error"] is None  # the model's fault, scored 0; not a broken harness


def test_code_that_reads_files_outside_its_directory_gets_nothing() -> None:
    row = BY_ID["HumanEval/0"]
    reply = "```python\ndef has_close_elements(numbers, threshold):\n    return open('/etc/passwd').read() is None\n```"
    record = _episode(row, reply)
    assert record["tests_passed"] == 0.0 and "PermissionError" in record["sandbox"]["stderr"]


def test_garbage_is_a_failure() -> None:
    record = _episode(BY_ID["HumanEval/2"], "I am not sure how to do this.")
    assert record["tests_passed"] == 0.0 and record["sandbox"]["outcome"] == "failed"


def test_code_extraction_prefers_the_block_that_defines_the_function() -> None:
    reply = "```python\nprint('example')\n```\nand\n```py\ndef f(x):\n    return x\n```\n```\nassert f(1) == 1\n```"
    assert extract_code(reply, "f") == ("def f(x):\n    return x\n", True)
    assert extract_code("    return 1\n", "f") == ("    return 1\n", False)
    assert extract_code("Sure:\n```python\ndef f(x):\n    return x", "f") == ("def f(x):\n    return x", True)


@pytest.mark.parametrize(
    ("change", "field"),
    [({"test": ""}, "test"), ({"entry_point": "1bad"}, "entry_point"), ({"code_prompt": None}, "code_prompt")],
)
def test_bad_task_rows_name_the_field(change: dict, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(TaskFieldError) as caught:
        CodingEnv.validate_task_row({**ROWS[0], **change}, index=3)
    assert caught.value.field == field and "task row 3" in str(caught.value)


def test_the_tests_passed_reward_scores_the_record() -> None:
    row = BY_ID["HumanEval/4"]
    spec = validate_reward_spec({"terms": [{"type": "tests_passed"}]})
    good = score_trajectory(spec, Trajectory.model_validate(_episode(row, _full(row))))
    bad = score_trajectory(spec, Trajectory.model_validate(_episode(row, "no")))
    assert (good.reward, bad.reward) == (1.0, 0.0)


def test_task_results_and_pass_at_k_aggregate_attempts() -> None:
    def sample(passed: float, outcome: str) -> SimpleNamespace:
        return SimpleNamespace(
            reward=passed,
            episode_metrics={"tests_passed": passed},
            error=None,
            trajectory={"id": f"t{passed}{outcome}", "sandbox": {"outcome": outcome}},
        )

    fields = task_result("x", [sample(1.0, "ok"), sample(0.0, "timeout"), sample(0.0, "failed")], "tests_passed")
    assert fields["passed"] == 1 and fields["samples"] == 3 and fields["score"] == pytest.approx(1 / 3)
    assert fields["outcomes"] == {"ok": 1, "timeout": 1, "failed": 1}
    metrics = pass_at_ks([(3, 1), (3, 0)], 3)
    assert metrics["pass@1"] == pytest.approx(1 / 6) and metrics["pass@3"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="not an episode metric"):
        task_result("x", [sample(1.0, "ok")], "item_f1")
