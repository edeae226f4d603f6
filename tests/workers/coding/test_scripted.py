"""The scripted coding agent (the SFT teacher for coding_agent): it solves tasks from their reference patch through
the real tools and sandbox, retries an ambiguous edit with more context, handles new, deleted and multi-hunk files,
writes a self-summary when asked, and its episodes come out as token-level samples for the SFT job."""

from __future__ import annotations

from typing import Any

import pytest

from workers.coding.environment import CodingAgentEnv
from workers.coding.patches import make_patch
from workers.coding.scripted import ScriptedCodingAgent, coding_teacher_for, run_episode
from workers.detectors import run_detectors
from workers.envs.registry import make_env
from workers.rewards.score import score_trajectory
from workers.rl.teacher import teacher_rollout
from workers.trajectories import Trajectory

ALL_OR_NOTHING = {"terms": [{"type": "hidden_tests", "mode": "all_or_nothing"}]}

OPS = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
REPO = {
    "calc/__init__.py": "",
    "calc/ops.py": OPS,
    "tests/test_ops.py": "from calc.ops import sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n",
}
HIDDEN = {
    "files": {"tests/test_hidden.py": "from calc.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"},
    "fail_to_pass": ["tests/test_hidden.py::test_add"],
    "pass_to_pass": ["tests/test_ops.py::test_sub"],
}


def _row(
    repo: dict[str, str], after: dict[str, str], hidden: dict[str, Any], *, deleted: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A task whose reference patch turns `repo` into `repo` updated with `after`, less the `deleted` files."""
    changed = {path: text for path, text in after.items() if repo.get(path) != text}
    before = {path: repo[path] for path in (*changed, *deleted) if path in repo}
    return {
        "id": "task",
        "prompt": "Something is off in calc. Fix it.",
        "answer": None,
        "repo": {"files": dict(repo)},
        "hidden_tests": hidden,
        "reference_patch": make_patch(before, changed),
    }


def _play(row: dict[str, Any], **params: Any) -> dict[str, Any]:
    env = make_env("coding_agent", **{"summary_threshold_tokens": 0, **params})
    assert isinstance(env, CodingAgentEnv)
    env.reset(env.validate_task_row(row))
    return run_episode(env, ScriptedCodingAgent.for_row(row))


def _tools(record: dict[str, Any]) -> list[str]:
    return [t["tool"] for t in record["turns"] if t["role"] == "assistant" and t.get("tool")]


def test_it_solves_a_task_end_to_end_through_the_real_tools() -> None:
    row = _row(REPO, {"calc/ops.py": OPS.replace("return a - b", "return a + b", 1)}, HIDDEN)
    record = _play(row)
    assert record["error"] is None and record["hidden_tests"]["resolved"] is True
    assert _tools(record) == ["list_files", "read_file", "edit_file", "run", "finish"]
    run_turn = next(t for t in record["turns"] if t["role"] == "tool" and t.get("tool") == "run")
    assert run_turn["command"] == "python -m pytest -q -x -p no:cacheprovider tests/test_ops.py"
    assert run_turn["exit_code"] == 0
    assert "`add` in calc/ops.py" in record["answer"] and "passes" in record["answer"]
    assert score_trajectory(_spec(), Trajectory.model_validate(record)).reward == 1.0
    assert run_detectors(record) == []
    assert record["counts"]["tool_errors"] == 0 and record["counts"]["malformed_tool_calls"] == 0


def _spec() -> Any:
    from workers.rewards.schema import validate_reward_spec

    return validate_reward_spec(ALL_OR_NOTHING)


BLOCKS = (
    "def first():\n    x = 1\n    y = 2\n    z = 3\n    return x + y + z\n\n\n"
    "def second():\n    x = 1\n    y = 2\n    z = 3\n    return x + y + z\n"
)


def test_an_ambiguous_hunk_is_retried_with_more_context() -> None:
    # The hunk changes second()'s return; its context (x, y, z and the end of the file) also fits first().
    repo = {"blocks.py": BLOCKS}
    after = {"blocks.py": BLOCKS[: BLOCKS.rindex("return x + y + z")] + "return 2 * (x + y + z)\n"}
    hidden = {
        "files": {
            "test_blocks.py": "from blocks import first, second\n\n\ndef test_second():\n"
            "    assert (first(), second()) == (6, 12)\n"
        },
        "fail_to_pass": ["test_blocks.py::test_second"],
    }
    record = _play(_row(repo, after, hidden))
    edits = [t for t in record["turns"] if t["role"] == "tool" and t.get("tool") == "edit_file"]
    assert edits[0]["content"].startswith("error: the search text matches 2 times in blocks.py")
    assert edits[1]["content"].startswith("edited blocks.py")
    assert record["edited_files"] == ["blocks.py"] and record["hidden_tests"]["resolved"] is True


def test_new_deleted_and_multi_hunk_files_all_go_through_the_tools() -> None:
    long = "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(20))
    repo = {"pkg/__init__.py": "", "pkg/long.py": long, "pkg/old.py": "GONE = True\n", "README.md": "x\n"}
    new_long = long.replace("return 2\n", "return -2\n").replace("return 17\n", "return -17\n")
    after = {"pkg/long.py": new_long, "pkg/extra.py": "from pkg.long import f2\n\nEXTRA = f2()\n"}
    hidden = {
        "files": {
            "tests/test_long.py": "import os\nfrom pkg.long import f2, f17\nfrom pkg.extra import EXTRA\n\n\n"
            "def test_it():\n    assert (f2(), f17(), EXTRA) == (-2, -17, -2)\n"
            "    assert not os.path.exists('pkg/old.py')\n"
        },
        "fail_to_pass": ["tests/test_long.py::test_it"],
    }
    row = _row(repo, after, hidden, deleted=("pkg/old.py",))
    record = _play(row)
    assert record["hidden_tests"]["resolved"] is True, record["hidden_tests"]
    assert record["edited_files"] == ["pkg/extra.py", "pkg/long.py", "pkg/old.py"]
    edit_lines = [t["args"].get("search", "") for t in record["turns"] if t.get("tool") == "edit_file" and "args" in t]
    # The new file first (files in patch order), then long.py's hunks bottom-up.
    assert edit_lines[0] == "" and "return 17" in edit_lines[1] and "return 2\n" in edit_lines[2]
    assert record["files_edited_by_run"] == ["pkg/old.py"]  # rm, through run
    assert run_detectors(record) == []  # one file by run, two by edit_file: not terminal-only


def test_it_writes_a_summary_when_asked_and_carries_on() -> None:
    big = "".join(f"VALUE_{i} = {i}  # padding to fill the context\n" for i in range(400))
    repo = {**REPO, "calc/ops.py": big + OPS}
    after = {"calc/ops.py": big + OPS.replace("return a - b", "return a + b", 1)}
    row = _row(repo, after, HIDDEN)
    record = _play(row, summary_threshold_tokens=1024, max_summaries=2)
    assert record["hidden_tests"]["resolved"] is True
    assert len(record["summaries"]) >= 1 and len(record["segments"]) == len(record["summaries"]) + 1
    text = record["summaries"][0]["text"]
    assert text.startswith("Task: Something is off in calc.") and "calc/ops.py" in text


def test_a_row_without_a_reference_patch_has_no_scripted_agent() -> None:
    row = _row(REPO, {"calc/ops.py": OPS.replace("return a - b", "return a + b", 1)}, HIDDEN)
    with pytest.raises(ValueError, match="has no reference_patch"):
        ScriptedCodingAgent.for_row({**row, "reference_patch": None})


def test_the_rollout_for_the_sft_job_gives_trained_samples_of_the_agent_replies() -> None:
    from workers.models.base import encode_chat
    from workers.models.registry import TINY_LLAMA, load_tokenizer, resolve_base_model

    tokenizer = load_tokenizer(resolve_base_model(TINY_LLAMA))
    row = _row(REPO, {"calc/ops.py": OPS.replace("return a - b", "return a + b", 1)}, HIDDEN)
    samples = teacher_rollout(
        coding_teacher_for(),
        tokenizer,
        lambda messages: encode_chat(tokenizer, messages),
        [row, {**row, "id": "no-patch", "reference_patch": None}],
        environment="coding_agent",
        env_params={"summary_threshold_tokens": 0},
        reward=ALL_OR_NOTHING,
    )
    [sample] = samples
    assert sample.reward == 1.0 and sample.error is None and sample.episode_metrics["resolved"] == 1.0
    assert len(sample.loss_mask) == len(sample.token_ids) - sample.completion_start
    assert sum(sample.loss_mask) > 0 and 0 in sample.loss_mask  # replies trained, observations not
    assert sample.num_turns == 5


def _located(row: dict[str, Any], function: str, path: str = "calc/ops.py") -> dict[str, Any]:
    return {
        **row,
        "prompt": f"{function}() in {path} is broken: test_add fails. Fix it.",
        "source": {"path": path, "function": function},
    }


def _play_searching(row: dict[str, Any], **params: Any) -> dict[str, Any]:
    env = make_env("coding_agent", **{"summary_threshold_tokens": 0, **params})
    assert isinstance(env, CodingAgentEnv)
    env.reset(env.validate_task_row(row))
    return run_episode(env, ScriptedCodingAgent.for_row(row, locate="search"))


def test_locating_by_search_uses_only_what_a_student_sees_and_edits_the_changed_line() -> None:
    """`scripted-coding-search`: search for the definition the instruction names, read from its line, edit the
    changed line alone (widened with lines it read when not unique), finish: no line number from the patch."""
    row = _located(_row(REPO, {"calc/ops.py": OPS.replace("return a - b", "return a + b", 1)}, HIDDEN), "add")
    record = _play_searching(row)
    assert record["hidden_tests"]["resolved"] is True, record["hidden_tests"]
    assert _tools(record) == ["search_code", "read_file", "edit_file", "edit_file", "finish"]
    calls = [t for t in record["turns"] if t["role"] == "assistant" and t.get("tool")]
    assert calls[0]["args"] == {"pattern": "def add\\(", "path": "calc/ops.py"}
    assert calls[1]["args"] == {"path": "calc/ops.py", "start_line": 1}  # the search's line, as much as it shows
    # "return a - b" is in both functions: the one-line edit is refused, then widened with the def line above it
    assert calls[2]["args"]["search"] == "    return a - b\n" and calls[2]["args"]["replace"] == "    return a + b\n"
    assert calls[3]["args"]["search"] == "def add(a, b):\n    return a - b\n"
    assert record["counts"]["malformed_tool_calls"] == 0


def test_locating_a_method_by_search_takes_the_definition_after_its_class() -> None:
    shapes = (
        "class Square:\n    def area(self, side):\n        return side * side\n\n\n"
        "class Rect:\n    def area(self, w, h):\n        return w + h\n"
    )
    repo = {"shapes.py": shapes}
    hidden = {
        "files": {
            "test_shapes.py": "from shapes import Rect\n\n\ndef test_area():\n    assert Rect().area(2, 3) == 6\n"
        },
        "fail_to_pass": ["test_shapes.py::test_area"],
    }
    row = _located(_row(repo, {"shapes.py": shapes.replace("w + h", "w * h")}, hidden), "Rect.area", "shapes.py")
    record = _play_searching(row)
    assert record["hidden_tests"]["resolved"] is True
    calls = [t for t in record["turns"] if t["role"] == "assistant" and t.get("tool")]
    assert [c["args"]["pattern"] for c in calls[:2]] == ["class Rect\\b", "def area\\("]
    assert calls[2]["args"]["start_line"] == 7  # Rect.area, not Square.area on line 2
    assert calls[3]["args"]["search"] == "        return w + h\n"


def test_locating_by_search_falls_back_to_the_patch_when_it_cannot_see_the_function() -> None:
    fixed = {"calc/ops.py": OPS.replace("return a - b", "return a + b", 1)}
    row = _row(REPO, fixed, HIDDEN)
    # the instruction does not name the function: nothing to search for, the patch's way from the start
    assert _tools(_play_searching({**row, "source": {"path": "calc/ops.py", "function": "add"}}))[0] == "list_files"
    # the instruction names a function the file does not define: one search, then the patch's way
    record = _play_searching(_located(row, "plus"))
    assert _tools(record)[:2] == ["search_code", "list_files"] and record["hidden_tests"]["resolved"] is True
    with pytest.raises(ValueError, match="locate must be"):
        ScriptedCodingAgent.for_row(row, locate="guess")


def test_locating_by_search_reads_on_from_the_last_line_shown_until_it_sees_the_change() -> None:
    body = "".join(f"    v{i} = {i}\n" for i in range(40))
    long = f"def total():\n{body}    return v0 - v1\n"
    hidden = {
        "files": {"test_long.py": "from long import total\n\n\ndef test_total():\n    assert total() == 1\n"},
        "fail_to_pass": ["test_long.py::test_total"],
    }
    row = _located(_row({"long.py": long}, {"long.py": long.replace("v0 - v1", "v0 + v1")}, hidden), "total", "long.py")
    record = _play_searching(row, max_output_chars=400)
    assert record["hidden_tests"]["resolved"] is True
    reads = [
        t["args"]["start_line"] for t in record["turns"] if t["role"] == "assistant" and t.get("tool") == "read_file"
    ]
    assert len(reads) >= 2 and reads[0] == 1 and reads == sorted(reads)
    shown = [t["content"] for t in record["turns"] if t["role"] == "tool" and t.get("tool") == "read_file"]
    last_shown = max(int(line.split("|")[0]) for line in shown[0].splitlines()[1:] if "|" in line)
    assert reads[1] == last_shown + 1
