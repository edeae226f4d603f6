"""The coding_agent harness (issue 17): every tool's result and error observations, commands in the real sandbox,
hidden tests after the episode, forking, self-summarisation (docs/methods.md C3) with a scripted policy, and the rollout
worker training every segment of a summarised chain.

The repository is a tiny package written here: `calc.ops.add` subtracts instead of adding; the hidden tests check
`add` (fail to pass) and two tests that already pass (pass to pass)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workers.coding.archive import content_hash, pack
from workers.coding.environment import CodingAgentEnv
from workers.coding.environment_summary import SUMMARY_HEADER, SUMMARY_PROMPT
from workers.coding.patches import make_patch
from workers.coding.task import RepoTask
from workers.coding.workspace import Snapshot, SnapshotError, Workspace
from workers.envs.base import EpisodeStateError, TaskFieldError
from workers.envs.checks import check_reward_compatible
from workers.envs.registry import ENVIRONMENTS, make_env
from workers.envs.toolcalls import format_tool_call
from workers.rewards.schema import coding_agent_spec, context1_spec
from workers.rewards.score import score_trajectory
from workers.trajectories import Trajectory

OPS = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
ADD_BUG, ADD_FIXED = "def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b"
FIXED = OPS.replace(ADD_BUG, ADD_FIXED)
REPO = {
    "calc/__init__.py": "",
    "calc/ops.py": OPS,
    "tests/test_ops.py": "from calc.ops import mul, sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n",
    "README.md": "A calculator.\n",
}
HIDDEN = {
    "files": {
        "tests/test_hidden.py": "from calc.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
        "def test_add_zero():\n    assert add(0, 0) == 0\n"
    },
    "fail_to_pass": ["tests/test_hidden.py::test_add"],
    "pass_to_pass": ["tests/test_hidden.py::test_add_zero", "tests/test_ops.py::test_sub"],
}


def _row(**extra: Any) -> dict[str, Any]:
    return {
        "id": "calc-add",
        "prompt": "add() gives the wrong result. Fix it.",
        "answer": None,
        "repo": {"files": dict(REPO)},
        "hidden_tests": HIDDEN,
        "reference_patch": make_patch({"calc/ops.py": OPS}, {"calc/ops.py": FIXED}),
        **extra,
    }


def _env(**params: Any) -> CodingAgentEnv:
    env = make_env("coding_agent", **{"summary_threshold_tokens": 0, **params})
    assert isinstance(env, CodingAgentEnv)
    env.reset(env.validate_task_row(_row()))
    return env


def call(name: str, **arguments: Any) -> str:
    return format_tool_call(name, arguments)


def _one(env: CodingAgentEnv, name: str, **arguments: Any) -> str:
    """One call as its own reply; the tool message it got back."""
    result = env.step(call(name, **arguments))
    assert not result.done and result.observation is not None
    return result.observation.messages[0]["content"]


# --- the class as the control plane sees it -----------------------------------------------------------------------


def test_it_is_registered_with_its_reward_and_scoring() -> None:
    assert ENVIRONMENTS["coding_agent"] is CodingAgentEnv
    assert CodingAgentEnv.score_field == "tests_passed" and CodingAgentEnv.default_metric == "pass@1"
    assert check_reward_compatible(CodingAgentEnv, coding_agent_spec()) == []
    problems = check_reward_compatible(CodingAgentEnv, context1_spec())
    assert problems and problems[0].startswith("terms[0] (f_beta): reads")
    assert make_env("coding_agent").max_turns == 30  # building one loads nothing


def test_task_rows_need_a_snapshot_or_inline_files_and_hidden_tests() -> None:
    row = _row()
    del row["repo"]
    with pytest.raises(TaskFieldError, match="missing field 'snapshot'") as caught:
        CodingAgentEnv.validate_task_row(row, index=4)
    assert caught.value.field == "snapshot" and "task row 4" in str(caught.value)
    with pytest.raises(TaskFieldError, match="missing field 'hidden_tests'"):
        CodingAgentEnv.validate_task_row({**_row(), "hidden_tests": None})
    with pytest.raises(TaskFieldError, match=r"field 'repo' must be \{\"files\""):
        CodingAgentEnv.validate_task_row({**_row(), "repo": {"files": {}}})
    with pytest.raises(TaskFieldError, match="hidden_tests.fail_to_pass") as bad:
        CodingAgentEnv.validate_task_row({**_row(), "hidden_tests": {**HIDDEN, "fail_to_pass": []}})
    assert bad.value.field == "hidden_tests.fail_to_pass"


def test_a_stored_task_row_loads_its_snapshot_from_storage_checked_by_hash(tmp_path: Path) -> None:
    archive = tmp_path / "snapshot.tar.gz"
    archive.write_bytes(pack(REPO))
    row = _row()
    del row["repo"]
    task = RepoTask(
        id="calc-add",
        instruction=row["prompt"],
        snapshot={"sha256": content_hash(REPO), "uri": str(archive), "file_count": len(REPO)},
        hidden_tests=HIDDEN,
        reference_patch=row["reference_patch"],
        family="repair",
    ).to_row()
    env = make_env("coding_agent", summary_threshold_tokens=0)
    assert isinstance(env, CodingAgentEnv)
    env.reset(env.validate_task_row(task))
    assert env.workspace.read_text("calc/ops.py") == OPS and env.trajectory_fields()["family"] == "repair"
    stale = {**task, "snapshot": {**task["snapshot"], "sha256": "0" * 64}}
    with pytest.raises(SnapshotError, match="not the 0000"):
        env.reset(env.validate_task_row(stale))


def test_bad_parameters_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="summary_threshold_tokens must be 0 .* or at least 1024"):
        make_env("coding_agent", summary_threshold_tokens=100)
    with pytest.raises(ValueError, match=r"max_read_lines must be an integer >= 10, got 0"):
        make_env("coding_agent", max_read_lines=0)
    with pytest.raises(ValueError, match=r"command_wall_seconds must be a number of seconds"):
        make_env("coding_agent", command_wall_seconds=-1)


# --- the tools ----------------------------------------------------------------------------------------------------


def test_list_read_and_search_show_the_repository() -> None:
    env = _env()
    listing = _one(env, "list_files")
    assert listing.splitlines()[0] == "4 file(s) in the repository:" and "calc/ops.py" in listing
    assert _one(env, "list_files", path="calc/") == "2 file(s) in 'calc':\n__init__.py\nops.py"
    read = _one(env, "read_file", path="calc/ops.py", start_line=4, end_line=6)
    assert read == "calc/ops.py (lines 4-6 of 10)\n4| \n5| def sub(a, b):\n6|     return a - b"
    found = _one(env, "search_code", pattern=r"return a \W b", path="calc")
    assert found.splitlines() == [
        "3 match(es) in 1 file(s):",
        "calc/ops.py:2: return a - b",
        "calc/ops.py:6: return a - b",
        "calc/ops.py:10: return a * b",
    ]
    assert _one(env, "search_code", pattern="nothing here") == "no match for 'nothing here'"


def test_long_reads_listings_and_searches_are_bounded_with_a_marker() -> None:
    env = _env(max_read_lines=10, max_search_matches=3, max_list_entries=10)
    env.workspace.write_text("big.py", "".join(f"x{i} = {i}\n" for i in range(50)))
    for i in range(12):
        env.workspace.write_text(f"pkg/m{i}.py", "")
    read = _one(env, "read_file", path="big.py", start_line=5)
    assert read.splitlines()[0] == "big.py (lines 5-14 of 50)"
    assert read.endswith("[... lines 15-50 not shown (at most 10 lines per read); read them with start_line=15]")
    found = _one(env, "search_code", pattern=r"^x\d+ =")
    assert found.startswith("50 match(es) in 1 file(s):") and found.endswith(
        "[... 47 more matches not shown; narrow the pattern or the path]"
    )
    listing = _one(env, "list_files")
    assert listing.startswith("17 files in the repository, too many to list; its entries:")
    assert "pkg/ (12 files)" in listing and "calc/ (2 files)" in listing


def test_tool_errors_say_what_went_wrong() -> None:
    env = _env()
    errors = {
        "outside": _one(env, "read_file", path="../etc/passwd"),
        "absolute": _one(env, "list_files", path="/etc"),
        "missing": _one(env, "read_file", path="calc/opz.py"),
        "directory": _one(env, "read_file", path="calc"),
        "past_end": _one(env, "read_file", path="calc/ops.py", start_line=99),
        "regex": _one(env, "search_code", pattern="(unclosed"),
        "slow_regex": _one(env, "search_code", pattern="(a|aa)+$", path="big.txt"),
    }
    assert errors["outside"].startswith("error: path '../etc/passwd' contains '..'")
    assert errors["absolute"].startswith("error: path '/etc' is absolute")
    assert errors["missing"] == "error: no file 'calc/opz.py' in the repository; did you mean calc/ops.py?"
    assert errors["directory"] == "error: 'calc' is a directory; list it with list_files"
    assert errors["past_end"] == "error: start_line 99 is past the end of calc/ops.py, which has 10 lines"
    assert errors["regex"].startswith("error: invalid regular expression: missing )")
    assert "escape special characters" in errors["regex"]
    assert errors["slow_regex"].startswith("error: no file or directory 'big.txt'")
    assert env.counts["tool_errors"] == len(errors) and env.counts["malformed_tool_calls"] == 0


def test_a_catastrophic_pattern_times_out_instead_of_hanging() -> None:
    env = _env()
    env.workspace.write_text("big.txt", "a" * 60 + "!\n")
    assert "took longer than" in _one(env, "search_code", pattern="(a|aa)+$")


def test_edit_file_replaces_one_exact_occurrence_and_explains_failures() -> None:
    env = _env()
    twice = _one(env, "edit_file", path="calc/ops.py", search="    return a - b\n", replace="    return a + b\n")
    assert twice == (
        "error: the search text matches 2 times in calc/ops.py (at lines 2, 6); include more surrounding lines in "
        "search so that it matches exactly once"
    )
    absent = _one(env, "edit_file", path="calc/ops.py", search="return a ** b", replace="x")
    assert absent.startswith("error: the search text was not found in calc/ops.py. It must match the file exactly")
    indented = _one(env, "edit_file", path="calc/ops.py", search="def add(a, b):\nreturn a - b", replace="x")
    assert "The same lines appear at line 1 with different indentation" in indented
    exists = _one(env, "edit_file", path="calc/ops.py", search="", replace="x")
    assert exists.startswith("error: calc/ops.py already exists; an empty search only creates a new file")
    nofile = _one(env, "edit_file", path="calc/nope.py", search="x", replace="y")
    assert nofile.startswith("error: no file 'calc/nope.py' to edit; to create it, call edit_file with an empty search")

    done = _one(env, "edit_file", path="calc/ops.py", search=ADD_BUG, replace=ADD_FIXED)
    assert done.startswith("edited calc/ops.py: replaced 2 line(s) at line 1 with 2 line(s)\n1| def add(a, b):")
    created = _one(env, "edit_file", path="calc/extra.py", search="", replace="X = 1\nY = 2\n")
    assert created == "created calc/extra.py (2 lines)"
    assert env.workspace.read_text("calc/ops.py") == FIXED
    assert env.workspace.changed_paths() == ["calc/extra.py", "calc/ops.py"]
    assert env.counts["tool_errors"] == 5 and env.counts["edit_file_calls"] == 7


def test_run_executes_in_the_sandbox_and_its_file_changes_are_recorded() -> None:
    env = _env()
    tests = _one(env, "run", command="python -m pytest -q -p no:cacheprovider tests/test_ops.py")
    assert tests.startswith("exit code: 0") and "2 passed" in tests
    sed = _one(env, "run", command="sed -i 's/return a \\* b/return b * a/' calc/ops.py && echo hi > notes.txt")
    assert sed.startswith("exit code: 0")
    assert sed.endswith("[files changed by the command: calc/ops.py (modified), notes.txt (created)]")
    assert env.workspace.read_text("notes.txt") == "hi\n"
    huge = _one(env, "run", command="python -c \"print('x' * 100000)\"")
    assert "characters cut ...]" in huge and len(huge) < env.max_output_chars + 500
    failing = _one(env, "run", command="exit 3")
    assert failing.startswith("exit code: 3")
    slow = _env(command_wall_seconds=1.0)
    timed_out = _one(slow, "run", command="sleep 30")
    assert timed_out.startswith("timeout: wall time limit 1 s exceeded")
    assert slow.counts["run_limit_hits"] == 1

    env.step(call("finish", message="done"))
    record = env.trajectory("t")
    assert record["files_edited_by_run"] == ["calc/ops.py", "notes.txt"]
    assert record["edited_files"] == ["calc/ops.py", "notes.txt"]
    run_turn = next(t for t in record["turns"] if t.get("command", "").startswith("sed"))
    assert run_turn["changed_files"] == {"calc/ops.py": "modified", "notes.txt": "created"}
    assert run_turn["exit_code"] == 0 and run_turn["outcome"] == "ok"


# --- the end of an episode ----------------------------------------------------------------------------------------


def test_hidden_tests_run_after_finish_and_fill_the_trajectory() -> None:
    env = _env()
    _one(env, "edit_file", path="calc/ops.py", search=ADD_BUG, replace=ADD_FIXED)
    result = env.step("Fixing it now.\n" + call("finish", message="add() adds now.") + call("list_files"))
    assert result.done
    record = env.trajectory("t")
    assert record["tests_passed"] == 1.0 and record["error"] is None
    hidden = record["hidden_tests"]
    assert hidden["resolved"] is True
    assert (hidden["fail_to_pass_passed"], hidden["fail_to_pass_total"]) == (1, 1)
    assert (hidden["pass_to_pass_passed"], hidden["pass_to_pass_total"]) == (2, 2)
    assert record["answer"] == "add() adds now." and record["finish_reason"] == "finish"
    assert record["diff"].startswith("diff --git a/calc/ops.py b/calc/ops.py")
    assert record["edited_files"] == ["calc/ops.py"] and record["files_edited_by_run"] == []
    assert record["turns"][-1] == {
        "role": "tool",
        "tool": "list_files",
        "content": "not run: finish ended the episode",
        "skipped": True,
    }
    assert "tests/test_hidden.py" not in env.workspace.files()  # the tests ran on a copy
    stats = record["length_stats"]
    assert stats["turns"] == 2 and stats["tool_calls"] == 2
    assert stats["final_message_tokens"] > 0 and stats["thinking_tokens"] == 0
    scored = score_trajectory(coding_agent_spec(), Trajectory.model_validate(record))
    assert scored.terms["hidden_tests"] == 1.0 and scored.terms["todo_left"] == 0.0
    metrics = env.episode_metrics(record)
    assert metrics["tests_passed"] == 1.0 and metrics["resolved"] == 1.0 and metrics["summaries"] == 0.0


def test_an_unsolved_task_gets_its_pass_fraction_and_max_turns_still_runs_the_tests() -> None:
    env = _env(max_turns=2)
    _one(env, "read_file", path="calc/ops.py")
    result = env.step("Let me think.\n" + call("list_files"))
    assert result.done and result.info["truncated"]
    record = env.trajectory("t")
    assert record["error"] == "no finish within max_turns=2" and record["finish_reason"] == "max_turns"
    assert record["tests_passed"] == pytest.approx(2 / 3) and record["hidden_tests"]["resolved"] is False
    assert record["hidden_tests"]["outcomes"]["tests/test_hidden.py::test_add"] != "passed"
    assert record["diff"] == "" and record["length_stats"]["thinking_tokens"] > 0


def test_a_reply_without_a_tool_call_is_the_final_message_and_malformed_calls_are_counted() -> None:
    env = _env()
    result = env.step('<tool_call>{"name": "read_file"}</tool_call>')
    assert result.observation is not None
    assert result.observation.messages[0]["content"].startswith("error: tool 'read_file' is missing required")
    env.step("Which behaviour do you want for add: a + b or something else?")
    record = env.trajectory("t")
    assert record["counts"]["malformed_tool_calls"] == 1 and record["finish_reason"] == "final_reply"
    assert record["answer"].startswith("Which behaviour")
    assert score_trajectory(coding_agent_spec(), Trajectory.model_validate(record)).terms["broken_tool_calls"] == 0.1
    assert [f.detector for f in env_findings(record)] == ["asks_instead_of_acting", "malformed_tool_calls"]


def env_findings(record: dict[str, Any]) -> list[Any]:
    from workers.detectors import run_detectors

    return run_detectors(record)


# --- forking ------------------------------------------------------------------------------------------------------


def test_fork_from_continues_an_episode_independently() -> None:
    parent = _env()
    _one(parent, "read_file", path="calc/ops.py")
    child = make_env("coding_agent", summary_threshold_tokens=0)
    assert isinstance(child, CodingAgentEnv)
    child.fork_from(parent)
    assert child.messages == parent.messages and child.counts == parent.counts
    _one(child, "edit_file", path="calc/ops.py", search=ADD_BUG, replace=ADD_FIXED)
    assert parent.workspace.read_text("calc/ops.py") == OPS  # the parent does not see the child's edit
    child.step(call("finish"))
    parent.step(call("finish"))
    assert child.trajectory("c")["tests_passed"] == 1.0
    assert parent.trajectory("p")["tests_passed"] == pytest.approx(2 / 3)
    with pytest.raises(EpisodeStateError, match="is done; fork it before it ends"):
        make_env("coding_agent").fork_from(parent)  # type: ignore[attr-defined]


def test_reset_can_start_from_a_given_workspace() -> None:
    shared = Workspace(Snapshot.from_files(REPO))
    shared.write_text("calc/ops.py", FIXED)
    envs = [make_env("coding_agent", summary_threshold_tokens=0) for _ in range(2)]
    for env in envs:
        assert isinstance(env, CodingAgentEnv)
        env.reset(env.validate_task_row(_row()), workspace=shared)
    envs[0].workspace.write_text("calc/ops.py", OPS)  # one sample's change stays its own
    assert envs[1].workspace.read_text("calc/ops.py") == FIXED and shared.read_text("calc/ops.py") == FIXED
    envs[1].step(call("finish"))
    record = envs[1].trajectory("t")
    assert record["tests_passed"] == 1.0 and record["edited_files"] == ["calc/ops.py"]  # diff vs the snapshot


# --- self-summarisation (docs/methods.md C3) --------------------------------------------------------------------------


def _summarising_env(**params: Any) -> CodingAgentEnv:
    env = make_env("coding_agent", summary_threshold_tokens=1024, max_summaries=1, **params)
    assert isinstance(env, CodingAgentEnv)
    env.reset(env.validate_task_row(_row()))
    env.workspace.write_text("data.py", "".join(f"VALUE_{i} = {i * 7919}  # a constant\n" for i in range(150)))
    return env


def test_summarisation_rewrites_the_context_and_the_chain_stays_one_trajectory() -> None:
    env = _summarising_env()
    system, task = env.messages
    result = env.step("Reading the data.\n" + call("read_file", path="data.py"))
    assert result.observation is not None and result.info["summary_requested"]
    assert result.observation.messages[-1] == {"role": "user", "content": SUMMARY_PROMPT}
    assert not env.view_changed

    summary = "The task is to fix add in calc/ops.py; data.py is irrelevant. Next: edit add."
    result = env.step(summary + "\n" + call("list_files"))  # a tool call in a summary is not run
    assert not result.done and env.view_changed and result.info["summary"]
    assert env.messages == [system, task, {"role": "user", "content": result.observation.messages[0]["content"]}]
    restart = env.messages[-1]["content"]
    assert restart.startswith(f"{SUMMARY_HEADER}\n{summary}") and env.counts["list_files_calls"] == 0

    _one(env, "edit_file", path="calc/ops.py", search=ADD_BUG, replace=ADD_FIXED)
    assert not env.view_changed
    env.step(call("finish", message="Fixed add."))
    record = env.trajectory("t")
    assert record["summaries"] == [{"turn": 2, "text": summary, "tokens": env._count(summary)}]
    assert len(record["segments"]) == 2 and record["segments"][0] > 1024
    assert record["tests_passed"] == 1.0 and record["length_stats"]["summary_tokens"] > 0
    marks = [
        (t["role"], bool(t.get("summary")), bool(t.get("summary_request")), "segment_start" in t)
        for t in record["turns"]
    ]
    assert (("user", False, True, False) in marks) and (("assistant", True, False, False) in marks)
    assert ("user", False, False, True) in marks
    metrics = env.episode_metrics(record)
    assert metrics["summaries"] == 1.0 and metrics["segments"] == 2.0
    assert metrics["segment_tokens_max"] == max(record["segments"])


def test_summaries_stop_at_max_summaries_and_a_huge_observation_is_cut_to_fit() -> None:
    env = _summarising_env(summary_headroom_tokens=256, max_output_chars=20_000, max_read_lines=500)
    result = env.step(call("read_file", path="data.py"))
    tool_message = result.observation.messages[0]["content"]  # type: ignore[union-attr]
    assert tool_message.endswith("[... cut: the context is full; a summary is requested next]")
    assert env._view_tokens() <= env.context_limit  # type: ignore[operator]
    env.step("summary: fix add")
    result = env.step(call("read_file", path="data.py"))  # over the threshold again, but max_summaries=1
    assert result.observation is not None and not result.info["summary_requested"]


def test_the_rollout_worker_trains_every_segment_of_a_summarised_chain() -> None:
    from tests.workers.jobs.test_flags_in_jobs import ScriptedBackend
    from workers.rl.rollout import RolloutWorker

    replies = [
        call("read_file", path="data.py"),
        "Summary: fix add in calc/ops.py by returning a + b.",
        call("edit_file", path="calc/ops.py", search=ADD_BUG, replace=ADD_FIXED),
        call("finish", message="Fixed add."),
    ]
    row = _row()
    row["repo"]["files"]["data.py"] = "".join(f"VALUE_{i} = {i * 7919}  # a constant\n" for i in range(150))
    worker = RolloutWorker(
        ScriptedBackend(replies),  # type: ignore[arg-type]
        environment="coding_agent",
        env_params={"summary_threshold_tokens": 1536, "max_summaries": 2},
        reward=coding_agent_spec().model_dump(mode="json"),
        max_new_tokens=64,
    )
    [sample] = worker.rollout([row], group_size=1, seed=0).samples
    assert sample.error is None and sample.terms["hidden_tests"] == 1.0
    assert len(sample.prior_segments) == 1 and sample.trajectory["summaries"][0]["turn"] == 2
    tokenizer = worker.backend.tokenizer
    # The summary's tokens are in the first segment's completion region and trained (loss mask 1) with the rest.
    first_ids, first_start = sample.prior_segments[0]
    summary_ids = tokenizer.encode(replies[1], add_special_tokens=False)
    first_completion = first_ids[first_start:]
    assert first_completion[-len(summary_ids) :] == summary_ids
    masks = sample.loss_mask
    assert sum(masks) == sum(len(tokenizer.encode(r, add_special_tokens=False)) for r in replies)
    assert len(masks) == len(first_completion) + len(sample.token_ids) - sample.completion_start
    # The second segment starts from the rewritten context: system, task and the summary.
    second_prompt = tokenizer.decode(sample.token_ids[: sample.completion_start])
    assert "Summary of your work so far:" in second_prompt and "VALUE_149" not in second_prompt
    assert sample.episode_metrics["summaries"] == 1.0 and sample.episode_metrics["segments"] == 2.0
