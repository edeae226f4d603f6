"""The trajectory page shows an agent-swarm episode as a timeline (stages, sub-agents as parallel bars with their
steps, the critical path marked, each sub-agent's conversation one click away) and a wide task's answer table
cell by cell against the gold table, from a record the swarm environment wrote."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from tests.apps.runs.test_trajectory_chain import _page, _stored
from workers.envs.registry import make_env
from workers.envs.toolcalls import format_tool_call
from workers.search.index import IndexConfig, SearchIndex
from workers.search.types import Chunk
from workers.swarm.environment import ASSIGN_TOOL, CREATE_TOOL

pytestmark = pytest.mark.django_db

CHUNKS = [
    Chunk("m:a#1", "m:a", 1, "## a.open(path, mode)\nOpen a path."),
    Chunk("m:b#1", "m:b", 1, "## b.close(handle)\nClose a handle."),
]


def _record() -> dict[str, Any]:
    env = make_env("swarm", index_uri="memory://page", subagent_runner="threads", subagent_max_steps=3)
    env.bind_index(SearchIndex.build(CHUNKS, IndexConfig(dense=False)))
    table = {
        "columns": ["name", "document"],
        "key_columns": ["name"],
        "rows": [{"name": "a.open", "document": "m:a"}, {"name": "b.close", "document": "m:b"}],
    }
    env.reset(
        env.validate_task_row(
            {"id": "w1", "prompt": "Tabulate a.open and b.close", "gold_chunk_ids": ["m:a#1"], "table": table}
        )
    )
    env.step(
        "\n".join(
            [
                format_tool_call(CREATE_TOOL, {"name": "lookup", "system_prompt": "Look up one item."}),
                format_tool_call(ASSIGN_TOOL, {"agent": "lookup", "prompt": "Find `a.open` and report: document."}),
                format_tool_call(ASSIGN_TOOL, {"agent": "lookup", "prompt": "Find `b.close` and report: document."}),
            ]
        )
    )
    env.step("| name | document |\n|---|---|\n| a.open | m:a |\n| b.close | m:x |")
    return env.trajectory("traj-1")


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_swarm_timeline_and_the_answer_table(client, users, run) -> None:  # type: ignore[no-untyped-def]
    _stored(run, _record())
    html = _page(client, users, run)

    swarm = html.split('id="swarm"', 1)[1].split("</section>", 1)[0]
    text = _text(swarm)
    assert "Swarm: 4 critical steps, 6 total, 2 sub-agents, 1.00 finished" in text
    assert "stage 1 · cost 3" in text and "stage 2 · cost 1" in text and "final answer" in text
    assert swarm.count('class="swarm-bar critical"') == 1  # one sub-agent per stage is on the critical path
    assert "lookup t1-0 : 2 steps" in text and "Find `a.open` and report: document." in swarm
    assert "name: a.open" in text  # the message back, and the conversation under it
    table = _text(html.split('id="wide-table"', 1)[1].split("</section>", 1)[0])
    assert "item-F1 0.750" in table and "answered: m:x" in table


def test_a_record_without_its_judgement_is_not_judged_in_the_web_request(client, users, run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from apps.rewards.services import reward_config_create

    def no_model(checkpoint: str) -> None:
        raise AssertionError("the page loaded a judge model")

    monkeypatch.setattr("workers.rewards.judge.frozen_backend", no_model)
    spec = {"terms": [{"type": "rubric_judge", "judge": "tiny-llama-smollm2-tokenizer"}]}
    config = reward_config_create(name="judged-page", description="", spec=spec, owner=users["operator"])
    run.reward_version = config.versions.get()
    run.save(update_fields=["reward_version"])
    _stored(run, _record())
    text = html.unescape(_text(_page(client, users, run)))
    assert "Not re-scored here: term 'rubric_judge': this record carries no judgement" in text


def test_a_table_missing_a_column_is_shown_scoring_zero_and_why(client, users, run) -> None:  # type: ignore[no-untyped-def]
    record = _record()
    record["answer"] = "| name |\n|---|\n| a.open |\n| b.close |"
    _stored(run, record)
    table = _text(html.unescape(_page(client, users, run)).split('id="wide-table"', 1)[1].split("</section>", 1)[0])
    assert "item-F1 0.000" in table
    assert "Scored 0: the table lacks column(s) document (WideSearch's required-columns rule" in table
