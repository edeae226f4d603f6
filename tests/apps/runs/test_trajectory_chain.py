"""The trajectory page shows a self-summarised chain (docs/methods.md C3, issue 17): each segment as a block
with its tokens, each summary marked where the context was rewritten, the hidden tests' outcome, the final diff, the
files edited through `run` and the length statistics; records of other environments render as before."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.runs.models import TrajectorySummary
from apps.runs.storage import storage_uri
from apps.training.templatetags.trajectory_chain import coding_outcome, trajectory_chain
from workers.coding.patches import make_patch
from workers.envs.registry import make_env
from workers.envs.toolcalls import format_tool_call

pytestmark = pytest.mark.django_db


def _turn(role: str, content: str, **marks: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **marks}


def _chain_record() -> dict[str, Any]:
    """A coding-agent record as `CodingAgentEnv.trajectory` writes it, by hand: two summaries, three segments."""
    return {
        "id": "traj-1",
        "task_id": "calc-add",
        "env": "coding_agent",
        "answer": "Fixed add.",
        "turns": [
            _turn("system", "You are a coding agent."),
            _turn("user", "add() gives the wrong result. Fix it."),
            _turn("assistant", "Reading.", tool="read_file", args={"path": "data.py"}),
            _turn("tool", "data.py (lines 1-150 of 150)", tool="read_file"),
            _turn("user", "Your context is almost full. Write a summary.", summary_request=True),
            _turn("assistant", "FIRST-SUMMARY-REPLY", summary=True),
            _turn("user", "Summary of your work so far:\nadd is in calc/ops.py", segment_start=1),
            _turn("assistant", "Reading ops.", tool="read_file", args={"path": "calc/ops.py"}),
            _turn("tool", "calc/ops.py (lines 1-11 of 11)", tool="read_file"),
            _turn("user", "Your context is almost full. Write a summary.", summary_request=True),
            _turn("assistant", "SECOND-SUMMARY-REPLY", summary=True),
            _turn("user", "Summary of your work so far:\nadd subtracts; fix it", segment_start=2),
            _turn("assistant", "sed", tool="run", args={"command": "sed -i s/a - b/a + b/ calc/ops.py"}),
            _turn("tool", "exit 0", tool="run"),
            _turn("assistant", "done", tool="finish", args={"message": "Fixed add."}),
            _turn("tool", "finished", tool="finish"),
        ],
        "counts": {"turns": 7, "tool_calls": 4, "summaries": 2},
        "tests_passed": 0.5,
        "hidden_tests": {
            "outcomes": {
                "tests/test_hidden.py::test_add": "passed",
                "tests/test_hidden.py::test_add_zero": "failed",
            },
            "fail_to_pass_passed": 1,
            "fail_to_pass_total": 1,
            "pass_to_pass_passed": 0,
            "pass_to_pass_total": 1,
            "fraction": 0.5,
            "resolved": False,
            "detail": "1 of 2 hidden tests failed",
            "seconds": 0.61,
        },
        "diff": "diff --git a/calc/ops.py b/calc/ops.py\n-    return a - b\n+    return a + b\n",
        "edited_files": ["calc/ops.py"],
        "files_edited_by_run": ["calc/ops.py"],
        "files_edited_by_tool": [],
        "length_stats": {
            "thinking_tokens": 11,
            "tool_call_tokens": 84,
            "tool_output_tokens": 1037,
            "final_message_tokens": 3,
            "summary_tokens": 22,
            "tool_calls": 4,
            "turns": 7,
        },
        "summaries": [
            {"turn": 2, "text": "add is in calc/ops.py", "tokens": 6},
            {"turn": 4, "text": "add subtracts; fix it", "tokens": 5},
        ],
        "segments": [2004, 1516, 812],
        "finish_reason": "finish",
        "family": "repair",
    }


def _stored(run, record: dict[str, Any], trajectory_id: str = "traj-1") -> TrajectorySummary:  # type: ignore[no-untyped-def]
    name = default_storage.save(f"runs/{run.pk}/trajectories/step-000001.jsonl", ContentFile(json.dumps(record) + "\n"))
    return TrajectorySummary.objects.create(
        run=run,
        trajectory_id=trajectory_id,
        task_id=str(record.get("task_id", "t1")),
        step=1,
        reward=0.5,
        num_turns=3,
        storage_uri=storage_uri(name),
    )


def _page(client, users, run, trajectory_id: str = "traj-1") -> str:  # type: ignore[no-untyped-def]
    client.force_login(users["viewer"])
    response = client.get(f"/runs/{run.pk}/trajectories/{trajectory_id}/")
    assert response.status_code == 200
    return response.content.decode()


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_chain_shows_each_segment_with_its_tokens_and_each_summary_where_the_context_was_rewritten(
    client, users, run
) -> None:
    _stored(run, _chain_record())
    html = _page(client, users, run)
    chain = html.split('id="chain"', 1)[1].split("</section>", 1)[0]
    text = _text(chain)

    assert "Chain: 3 segments, 2 summaries" in text
    positions = [
        text.index(marker)
        for marker in (
            "Segment 1 · 2004 tokens",
            "FIRST-SUMMARY-REPLY",
            "Summary #1 (6 tokens) , written at reply 2: the context was rewritten here add is in calc/ops.py",
            "Segment 2 · 1516 tokens",
            "SECOND-SUMMARY-REPLY",
            "Summary #2 (5 tokens) , written at reply 4: the context was rewritten here add subtracts; fix it",
            "Segment 3 · 812 tokens",
            "sed -i",
        )
    ]
    assert positions == sorted(positions)  # the blocks and their separators in chain order
    assert chain.count('class="summary-mark"') == 2 and chain.count('class="segment"') == 3
    assert "summary requested" in text and "the model's summary" in text
    assert "context restarted from the summary" in text
    assert 'id="turns"' not in html  # the chain replaces the flat list


def test_a_coding_trajectory_shows_its_hidden_tests_diff_files_and_length(client, users, run) -> None:
    _stored(run, _chain_record())
    html = _page(client, users, run)
    hidden = _text(html.split('id="hidden-tests"', 1)[1].split("</section>", 1)[0])
    assert "Hidden tests: not resolved" in hidden
    assert "0.500 of the hidden tests pass · fail-to-pass 1/1 · pass-to-pass 0/1" in hidden
    assert "ended by finish" in hidden and "family repair" in hidden
    assert hidden.index("test_add_zero failed") < hidden.index("test_add passed")  # failures first
    diff = html.split('id="final-diff"', 1)[1].split("</section>", 1)[0]
    assert '<pre class="diff">diff --git a/calc/ops.py b/calc/ops.py\n-    return a - b\n+    return a + b' in diff
    files = _text(html.split('id="edited-files"', 1)[1].split("</section>", 1)[0])
    assert "Edited through run rather than the edit tool: calc/ops.py" in files
    length = _text(html.split('id="length-stats"', 1)[1].split("</section>", 1)[0])
    assert "thinking tokens 11" in length and "tool-output tokens 1037" in length and "turns 7" in length


def test_a_record_the_coding_agent_wrote_renders_its_chain(client, users, run) -> None:
    """The field names and turn marks the environment writes (not a hand-built copy): one summary, two segments,
    the hidden tests run in the sandbox."""
    ops = "def add(a, b):\n    return a - b\n"
    fixed = "def add(a, b):\n    return a + b\n"
    env = make_env("coding_agent", summary_threshold_tokens=1024, max_summaries=1)
    row = {
        "id": "calc-add",
        "prompt": "add() gives the wrong result. Fix it.",
        "answer": None,
        "repo": {"files": {"calc/__init__.py": "", "calc/ops.py": ops}},
        "hidden_tests": {
            "files": {
                "tests/test_hidden.py": "from calc.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
            },
            "fail_to_pass": ["tests/test_hidden.py::test_add"],
            "pass_to_pass": [],
        },
        "reference_patch": make_patch({"calc/ops.py": ops}, {"calc/ops.py": fixed}),
    }
    env.reset(env.validate_task_row(row))
    env.workspace.write_text("data.py", "".join(f"VALUE_{i} = {i * 7919}  # a constant\n" for i in range(150)))  # type: ignore[attr-defined]
    env.step(format_tool_call("read_file", {"path": "data.py"}))  # over the threshold: a summary is asked for
    env.step("ENV-WRITTEN-SUMMARY: add is in calc/ops.py")
    env.step(format_tool_call("edit_file", {"path": "calc/ops.py", "search": "a - b", "replace": "a + b"}))
    env.step(format_tool_call("finish", {"message": "Fixed add."}))
    record = env.trajectory("traj-1")
    assert len(record["segments"]) == 2 and len(record["summaries"]) == 1

    _stored(run, record)
    html = _page(client, users, run)
    text = _text(html)
    assert "Chain: 2 segments, 1 summary" in text
    assert f"Segment 1 · {record['segments'][0]} tokens" in text
    assert "Summary #1" in text and "ENV-WRITTEN-SUMMARY: add is in calc/ops.py" in text
    assert "Hidden tests: resolved" in text and "tests/test_hidden.py::test_add passed" in text
    assert "+    return a + b" in html


def test_a_trajectory_of_another_environment_keeps_its_flat_turns(client, users, run) -> None:
    env = make_env("exact_answer")
    env.reset(env.validate_task_row({"id": "q1", "prompt": "What is 2 + 2?", "answer": "4"}))
    env.step("4")
    _stored(run, env.trajectory("traj-1"))
    html = _page(client, users, run)
    assert 'id="turns"' in html and "What is 2 + 2?" in html
    for coding_only in ('id="chain"', 'id="hidden-tests"', 'id="final-diff"', 'id="length-stats"'):
        assert coding_only not in html


def test_the_tags_tolerate_records_without_or_with_odd_fields() -> None:
    assert trajectory_chain({"turns": [{"role": "user", "content": "hi"}]}) is None
    assert trajectory_chain(None) is None and coding_outcome("not a record") is None
    assert coding_outcome({"turns": [], "edited_files": []}) is None
    # segments stored without any marked turns still show as blocks, with their tokens
    chain = trajectory_chain({"segments": [10, 20], "summaries": [{"turn": 1, "text": "s"}], "turns": ["junk"]})
    assert chain is not None
    assert [(s["number"], s["tokens"], s["turns"]) for s in chain["segments"]] == [(1, 10, []), (2, 20, [])]
    assert chain["segments"][0]["summary"] == {"number": 1, "turn": 1, "text": "s", "tokens": None}
    outcome = coding_outcome({"diff": "", "hidden_tests": {"outcomes": "bad", "fraction": "x"}})
    assert outcome is not None and outcome["diff"] == "" and outcome["hidden"]["outcomes"] == []
    assert outcome["hidden"]["fraction"] is None and outcome["length"] == []
