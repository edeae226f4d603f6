"""PARL's reward terms (docs/methods.md K1, K2), their anneal, and wide-task generation."""

from __future__ import annotations

import math
from typing import Any

import pytest

from workers.rewards.schema import RewardSpecError, parl_spec, validate_reward_spec
from workers.rewards.score import annealed_weights, score_trajectory
from workers.search.types import Chunk
from workers.search.wide import WideParams, synthesize_wide, verify_wide_row
from workers.trajectories import Trajectory


def _record(subagents: list[dict[str, Any]], *, critical: int = 5, duplicates: int = 0, answer: str = "") -> Trajectory:
    return Trajectory.model_validate(
        {
            "id": "r",
            "answer": answer,
            "swarm": {
                "subagents": subagents,
                "stages": [{"subagent_steps": [s["steps"] for s in subagents]}],
                "critical_steps": critical,
                "errors": {"duplicate_tasks": duplicates},
            },
        }
    )


def _sub(finished: bool, prompt: str | None = None) -> dict[str, Any]:
    global _counter
    _counter += 1
    return {"agent": "a", "prompt": prompt or f"task {_counter}", "finished": finished, "steps": 3}


_counter = 0


def test_r_parallel_saturates_and_r_finish_is_the_finish_rate_minus_duplicates() -> None:
    spec = parl_spec(lambda_parallel=0.5, lambda_finish=0.25)
    terms = score_trajectory(spec, _record([_sub(True), _sub(False)])).terms
    assert terms["parallel_instantiation"] == pytest.approx(2 / 4)
    assert terms["subagent_finish"] == pytest.approx(1 / 2)
    repeated = [_sub(True), _sub(True), _sub(True), _sub(True), _sub(True, "task 1"), _sub(False, "task 2")]
    repeated[0]["prompt"], repeated[1]["prompt"] = "task 1", "task 2"
    many = score_trajectory(spec, _record(repeated, duplicates=2)).terms
    assert many["parallel_instantiation"] == 1.0
    assert many["subagent_finish"] == pytest.approx(4 / 6)  # the repeats of task 1 and task 2 are not distinct
    none = score_trajectory(spec, _record([])).terms
    assert (none["parallel_instantiation"], none["subagent_finish"]) == (0.0, 0.0)


def test_lambdas_anneal_to_zero_linearly_or_by_cosine() -> None:
    record = _record([_sub(True) for _ in range(4)])  # r_parallel = r_finish = 1
    linear = parl_spec(lambda_parallel=0.2, lambda_finish=0.1, anneal_steps=10)
    assert score_trajectory(linear, record, step=0).reward == pytest.approx(0.3)
    assert score_trajectory(linear, record, step=5).reward == pytest.approx(0.15)
    assert score_trajectory(linear, record, step=10).reward == 0.0
    assert score_trajectory(linear, record, step=99).reward == 0.0
    assert score_trajectory(linear, record).reward == pytest.approx(0.3)  # no step: evaluation, unannealed
    cosine = parl_spec(lambda_parallel=0.2, lambda_finish=0.0, anneal_steps=10, schedule="cosine")
    assert score_trajectory(cosine, record, step=5).reward == pytest.approx(0.2 * 0.5)
    assert score_trajectory(cosine, record, step=2).reward == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi * 0.2)))
    assert annealed_weights(linear, 5) == {
        "reward/lambda/parallel_instantiation": pytest.approx(0.1),
        "reward/lambda/subagent_finish": pytest.approx(0.05),
    }


def test_the_critical_steps_penalty_charges_steps_past_the_free_ones_up_to_its_cap() -> None:
    spec = parl_spec(lambda_parallel=0.0, lambda_finish=0.0, critical_penalty=1.0)
    assert score_trajectory(spec, _record([], critical=10)).penalty == 0.0
    assert score_trajectory(spec, _record([], critical=15)).penalty == pytest.approx(0.1)
    assert score_trajectory(spec, _record([], critical=500)).penalty == pytest.approx(0.5)


def test_item_f1_is_r_perf_for_a_wide_task() -> None:
    gold = {
        "columns": ["name", "kind"],
        "key_columns": ["name"],
        "rows": [{"name": "a", "kind": "x"}, {"name": "b", "kind": "y"}],
    }
    record = Trajectory.model_validate({"id": "r", "answer": "| name | kind |\n|--|--|\n| a | x |", "gold_table": gold})
    result = score_trajectory(parl_spec(), record)
    assert result.terms["item_f1"] == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert result.terms["normalized_match"] == 0.0


def test_a_malformed_anneal_is_refused_naming_the_field() -> None:
    with pytest.raises(RewardSpecError, match=r"terms\[0\] \(parallel_instantiation\).anneal.steps"):
        validate_reward_spec({"terms": [{"type": "parallel_instantiation", "anneal": {"steps": 0}}]})
    with pytest.raises(RewardSpecError, match="schedule"):
        validate_reward_spec({"terms": [{"type": "subagent_finish", "anneal": {"schedule": "step"}}]})


def test_wide_tasks_are_verified_against_their_chunks(swarm_chunks: list[Chunk]) -> None:
    result = synthesize_wide(swarm_chunks, WideParams(num_tasks=3, min_rows=2, max_rows=4, seed=1))
    assert result.report["kept"] == 3 and result.tasks
    by_id = {c.chunk_id: c for c in swarm_chunks}
    for task in result.tasks:
        for row, chunk_id in zip(task["table"]["rows"], task["gold_chunk_ids"], strict=True):
            assert verify_wide_row(by_id[chunk_id], row) is None
            assert row["document"] == by_id[chunk_id].doc_id
    # a property has no parameters: it never gets a first_parameter cell
    properties = [r for t in result.tasks for r in t["table"]["rows"] if r["kind"] == "property"]
    assert all("first_parameter" not in r or r["first_parameter"] != "property" for r in properties)
    wrong = dict(result.tasks[0]["table"]["rows"][0], document="lib:nowhere")
    assert verify_wide_row(by_id[result.tasks[0]["gold_chunk_ids"][0]], wrong) == "cell_not_in_chunk"


def test_document_style_tasks_ask_for_every_entity_of_one_document(swarm_chunks: list[Chunk]) -> None:
    result = synthesize_wide(
        swarm_chunks, WideParams(num_tasks=2, style="document", min_rows=2, max_rows=2, columns=["kind"])
    )
    for task in result.tasks:
        documents = {chunk_id.split("#")[0] for chunk_id in task["gold_chunk_ids"]}
        assert len(documents) == 1 and len(task["table"]["rows"]) == 2
        assert f"document `{documents.pop()}` documents" in task["prompt"]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"columns": ["colour"]}, "unknown column"),
        ({"columns": ["kind", "kind"]}, "listed twice"),
        ({"min_rows": 5, "max_rows": 2}, "max_rows"),
    ],
)
def test_bad_wide_params_are_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WideParams(**params)
