"""The simulator end to end, through the official `openai` client, against a stand-in OpenAI-compatible server that
returns scripted tool calls and a stand-in control plane recording feedback (tests/workers/simulator/standins.py).
The coding harness, its sandbox and the hidden tests are the real ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.workers.simulator.standins import KEY, Reply, StandIn, serving
from tests.workers.simulator.tasks import INSTRUCTIONS, QUESTION, TASK_OF, scripted, task_row, write_tasks
from workers.coding.environment import DEFAULT_SYSTEM_PROMPT, CodingAgentEnv
from workers.detectors.registry import run_detectors
from workers.envs.toolcalls import render_tool_prompt
from workers.jobs import simulate as simulate_job
from workers.simulator.runner import SimulationStopped, simulate
from workers.specs import JOB_SPECS, SimulateSpec


def _spec(standin: StandIn, tasks_uri: str, **fields: Any) -> SimulateSpec:
    return SimulateSpec.model_validate(
        {
            "run_id": 7,
            "kind": "simulate",
            "ingest_url": standin.ingest_url,
            "base_url": standin.base_url,
            "model_name": "crucible-policy",
            "feedback_url": standin.feedback_url,
            "tasks_uri": tasks_uri,
            "sessions": 1,
            "concurrency": 1,
            "max_turns": 4,
            "request_retries": 0,
            "feedback_wait_seconds": 5,
            "env_params": {"summary_threshold_tokens": 0},
            **fields,
        }
    )


def _table(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(summary["output_uri"].removeprefix("file://")).read_text().splitlines()]


def _signals(standin: StandIn, session_id: str) -> dict[str, dict[str, Any]]:
    return {body["signal"]: body for sid, body in standin.posted() if sid == session_id}


def test_a_session_that_fixes_the_task_posts_edit_kept_with_the_tests_passed(tmp_path: Path) -> None:
    with serving(StandIn(scripted({"calc-add": "fix"}))) as standin:
        summary = simulate(_spec(standin, write_tasks(tmp_path, "calc-add")), token=KEY)

    (row,) = _table(summary)
    assert row["signal"] == "edit_kept" and row["resolved"] is True and row["tests_passed"] == 1.0
    assert row["turns"] == 2 and row["finish_reason"] == "finish" and row["edited_files"] == ["calc/ops.py"]
    assert row["error"] is None and row["policy_versions"] == [3] and len(row["latency_ms"]) == 2
    posted = _signals(standin, row["session_id"])
    assert set(posted) == {"edit_kept", "tests_passed"}
    assert posted["tests_passed"]["value"] == 1.0 and posted["edit_kept"]["turn_index"] == 1
    assert len({body["event_id"] for _, body in standin.posted()}) == 2  # one id per event
    assert summary["edit_kept_rate"] == 1.0 and summary["errors"] == 0 and summary["policy_versions"] == [3]

    # What the server saw: the environment's prompt without its tool block, the tools as function schemas, the
    # session headers, and each tool result answering its call by id.
    (h1, first), (h2, second) = standin.requests
    assert first["messages"][0] == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    assert first["messages"][1] == {"role": "user", "content": INSTRUCTIONS["calc-add"]}
    assert first["tools"] == [tool.json_schema() for tool in CodingAgentEnv.tools]
    # What a server renders from those two (the prompt, a blank line, the tool block) is the environment's prompt.
    env_system = CodingAgentEnv().initial_messages(CodingAgentEnv.validate_task_row(task_row("calc-add")))[0]
    assert env_system["content"] == f"{DEFAULT_SYSTEM_PROMPT}\n\n{render_tool_prompt(CodingAgentEnv.tools)}"
    assert first["model"] == "crucible-policy" and first["max_tokens"] == 256
    assert h1["x-session-id"] == h2["x-session-id"] == row["session_id"]
    assert (h1["x-turn-index"], h2["x-turn-index"]) == ("0", "1")
    assert h1["x-task-type"] == "repair" and h1["authorization"] == f"Bearer {KEY}"
    assistant, read_result, edit_result = second["messages"][2:]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_1_0", "call_1_1"]
    assert read_result["tool_call_id"] == "call_1_0" and "def add(a, b):" in read_result["content"]
    assert edit_result["tool_call_id"] == "call_1_1" and edit_result["content"].startswith("edited calc/ops.py")


def test_a_wrong_edit_posts_a_dissatisfied_followup_with_the_tests_failed(tmp_path: Path) -> None:
    with serving(StandIn(scripted({"calc-mul": "wrong"}))) as standin:
        summary = simulate(_spec(standin, write_tasks(tmp_path, "calc-mul")), token=KEY)

    (row,) = _table(summary)
    assert row["signal"] == "dissatisfied_followup" and row["resolved"] is False and row["tests_passed"] == 0.0
    posted = _signals(standin, row["session_id"])
    assert set(posted) == {"dissatisfied_followup", "tests_failed"} and posted["tests_failed"]["value"] == 1.0
    assert standin.requests[0][0]["x-task-type"] == "repo_task"  # a task without a family
    assert summary["dissatisfied_rate"] == 1.0 and summary["edit_kept_rate"] == 0.0


def test_noise_flips_the_verdict_but_never_the_tests(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path, "calc-add", "calc-mul")
    with serving(StandIn(scripted({"calc-add": "fix", "calc-mul": "wrong"}))) as standin:
        summary = simulate(_spec(standin, tasks, sessions=2, noise=1.0), token=KEY)

    rows = {row["task_id"]: row for row in _table(summary)}
    assert rows["calc-add"]["signal"] == "dissatisfied_followup" and rows["calc-add"]["flipped"] is True
    assert rows["calc-mul"]["signal"] == "edit_kept" and rows["calc-mul"]["flipped"] is True
    assert set(_signals(standin, rows["calc-add"]["session_id"])) == {"dissatisfied_followup", "tests_passed"}
    assert set(_signals(standin, rows["calc-mul"]["session_id"])) == {"edit_kept", "tests_failed"}
    assert summary["flipped"] == 2


def test_a_user_who_tolerates_questions_accepts_one_and_the_detector_finds_the_session(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path, "calc-add")
    with serving(StandIn(scripted({"calc-add": "ask"}))) as standin:
        tolerant = simulate(
            _spec(standin, tasks, tolerates_questions=1.0, output_uri=f"file://{tmp_path}/a/s.jsonl"), token=KEY
        )
        strict = simulate(
            _spec(standin, tasks, tolerates_questions=0.0, output_uri=f"file://{tmp_path}/b/s.jsonl"), token=KEY
        )

    (row,) = _table(tolerant)
    assert row["asked_question"] is True and row["signal"] == "accepted" and row["tolerated_question"] is True
    assert set(_signals(standin, row["session_id"])) == {"accepted", "tests_failed"}
    assert row["finish_reason"] == "final_reply" and row["edited_files"] == [] and row["turns"] == 1
    assert tolerant["accepted_rate"] == 1.0 and tolerant["questions_asked"] == 1
    (other,) = _table(strict)
    assert other["asked_question"] is True and other["signal"] == "dissatisfied_followup"

    # The session's trajectory, as the client-side harness recorded it, is what asks_instead_of_acting flags.
    (record,) = [json.loads(line) for line in (tmp_path / "a/trajectories.jsonl").read_text().splitlines()]
    assert record["id"] == row["session_id"] and record["answer"] == QUESTION
    findings = run_detectors(record)
    assert [f.detector for f in findings] == ["asks_instead_of_acting"]


def test_choices_are_seeded_whatever_the_interleaving(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path, "calc-add", "calc-mul")
    policy = scripted({"calc-add": "fix", "calc-mul": "ask"})
    choice_fields = (
        "index",
        "task_id",
        "user",
        "tolerates_questions",
        "flipped",
        "signal",
        "asked_question",
        "resolved",
    )

    def play(seed: int, concurrency: int, name: str) -> list[tuple[Any, ...]]:
        fields = {"sessions": 6, "users": 3, "noise": 0.4, "tolerates_questions": 0.5, "seed": seed}
        with serving(StandIn(policy)) as standin:
            summary = simulate(
                _spec(
                    standin, tasks, concurrency=concurrency, output_uri=f"file://{tmp_path}/{name}/s.jsonl", **fields
                ),
                token=KEY,
            )
        rows = _table(summary)
        assert [r["index"] for r in rows] == list(range(6)) and summary["errors"] == 0
        by_user: dict[int, bool] = {}
        for r in rows:
            assert by_user.setdefault(r["user"], r["tolerates_questions"]) == r["tolerates_questions"]  # per user
        feedback = sorted(body["signal"] for _, body in standin.posted())
        return [tuple(r[f] for f in choice_fields) for r in rows] + [tuple(feedback)]

    first = play(5, concurrency=3, name="one")
    assert first == play(5, concurrency=1, name="two")
    assert first != play(6, concurrency=3, name="three")
    assert {row[1] for row in first[:-1]} == {"calc-add", "calc-mul"}  # each task played (3 times each)


def test_a_401_from_serving_stops_the_job_with_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRUCIBLE_INGEST_TOKEN", KEY)
    monkeypatch.setenv("CRUCIBLE_SPOOL_DIR", str(tmp_path / "spool"))
    with serving(StandIn(scripted({"calc-add": "fix"}), key="cri_someone_else")) as standin:
        spec = _spec(standin, write_tasks(tmp_path, "calc-add"), sessions=6, concurrency=2)
        with pytest.raises(
            SystemExit,
            match="simulation stopped: the serving endpoint refused the simulator's key "
            r"\(serving answered 401: invalid API key\)",
        ):
            simulate_job.run(spec)

    assert standin.posted() == []  # nothing was played, nothing posted
    kinds = [event["kind"] for event in standin.events]
    assert kinds[-1] == "end" and standin.events[-1]["outcome"] == "failed"
    assert "serving answered 401" in standin.events[-1]["error"]
    (summary,) = [event["data"] for event in standin.events if event["kind"] == "summary"]
    assert summary["sessions_ended"] <= 2 and "401" in summary["stopped_reason"]  # none started after the refusal


def test_a_403_from_the_feedback_endpoint_stops_the_simulation(tmp_path: Path) -> None:
    with serving(StandIn(scripted({"calc-add": "fix"}), feedback_key="cri_other")) as standin:
        with pytest.raises(SimulationStopped, match="refused the simulator's token when posting feedback") as caught:
            simulate(_spec(standin, write_tasks(tmp_path, "calc-add"), sessions=4), token=KEY)
    assert caught.value.summary["sessions_ended"] == 0 and len(standin.posted(403)) == 1


def test_serving_errors_and_timeouts_end_their_session_and_the_job_goes_on(tmp_path: Path) -> None:
    fixer = scripted({"calc-add": "fix"})

    def policy(body: dict[str, Any], headers: dict[str, str]) -> Reply:
        if TASK_OF[body["messages"][1]["content"]] == "calc-mul":
            return Reply(status=500, error="the replica crashed")
        return fixer(body, headers)

    tasks = write_tasks(tmp_path, "calc-add", "calc-mul")
    with serving(StandIn(policy)) as standin:
        summary = simulate(_spec(standin, tasks, sessions=2, concurrency=2), token=KEY)
    rows = {row["task_id"]: row for row in _table(summary)}
    assert rows["calc-mul"]["error"] == "serving answered 500: the replica crashed (turn 0)"
    assert rows["calc-mul"]["signal"] is None and rows["calc-add"]["signal"] == "edit_kept"
    assert summary["errors"] == 1 and summary["sessions_judged"] == 1
    assert {sid for sid, _ in standin.posted()} == {rows["calc-add"]["session_id"]}  # no feedback on an error

    slow = StandIn(lambda body, headers: Reply(content="late", delay=1.5))
    with serving(slow) as standin:
        summary = simulate(
            _spec(standin, tasks, request_timeout_seconds=0.3, output_uri=f"file://{tmp_path}/t/s.jsonl"), token=KEY
        )
    (row,) = _table(summary)
    assert row["error"].startswith("serving timed out after") and summary["errors"] == 1


def test_feedback_waits_for_a_session_the_control_plane_has_not_recorded_yet(tmp_path: Path) -> None:
    with serving(StandIn(scripted({"calc-add": "fix"}), feedback_404_first=True)) as standin:
        summary = simulate(_spec(standin, write_tasks(tmp_path, "calc-add")), token=KEY)
    (row,) = _table(summary)
    assert row["error"] is None and [f["status"] for f in row["feedback"]] == ["created", "created"]
    assert [code for _, _, code in standin.feedback] == [404, 201, 404, 201]


def test_the_job_reports_progress_metrics_the_table_and_a_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRUCIBLE_INGEST_TOKEN", KEY)
    monkeypatch.setenv("CRUCIBLE_SPOOL_DIR", str(tmp_path / "spool"))
    tasks = write_tasks(tmp_path, "calc-add", "calc-mul")
    with serving(StandIn(scripted({"calc-add": "fix", "calc-mul": "wrong"}))) as standin:
        summary = simulate_job.run(_spec(standin, tasks, sessions=2, concurrency=2))

    events = standin.events
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    progress = [(e["done"], e["total"]) for e in events if e["kind"] == "progress"]
    assert progress[0] == (0, 2) and progress[-1] == (2, 2)
    metrics = [e for e in events if e["kind"] == "metric"]
    assert [m["step"] for m in metrics] == [1, 2]
    last = metrics[-1]["values"]
    assert last["sim/edit_kept_rate"] == last["sim/dissatisfied_rate"] == 0.5 and last["sim/errors"] == 0
    assert last["sim/turns"] == 2 and last["sim/latency_ms_p50"] > 0
    artifacts = {e["name"]: e for e in events if e["kind"] == "artifact"}
    assert artifacts["sessions.jsonl"]["uri"] == f"{tasks.rsplit('/', 1)[0]}/simulate-run7/sessions.jsonl"
    assert artifacts["sessions.jsonl"]["meta"] == {"rows": 2}
    (reported,) = [e["data"] for e in events if e["kind"] == "summary"]
    assert reported == summary and summary["edit_kept_rate"] == 0.5 and summary["edit_kept_ci95"][0] < 0.5
    assert events[-1]["kind"] == "end" and events[-1]["outcome"] == "succeeded"
    assert SimulateSpec in JOB_SPECS and SimulateSpec.entrypoint == "workers.jobs.simulate"


def test_bad_input_is_refused_naming_the_field(tmp_path: Path) -> None:
    with serving(StandIn(scripted({}))) as standin:
        tasks = write_tasks(tmp_path, "calc-add")
        with pytest.raises(ValidationError, match="noise"):
            _spec(standin, tasks, noise=1.5)
        with pytest.raises(ValidationError, match="concurrency"):
            _spec(standin, tasks, concurrency=0)
        with pytest.raises(ValueError, match="env_params: .*max_read_lines"):
            simulate(_spec(standin, tasks, env_params={"max_read_lines": 1}), token=KEY)
        with pytest.raises(ValueError, match="env_params: max_turns is the spec's own"):
            simulate(_spec(standin, tasks, env_params={"max_turns": 3}), token=KEY)
        with pytest.raises(ValueError, match="base_url must be an http"):
            simulate(_spec(standin, tasks, base_url="localhost:8100/v1"), token=KEY)
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"id": "x", "prompt": "fix it", "hidden_tests": {"fail_to_pass": ["t.py::t"]}}\nnot json\n')
        with pytest.raises(ValueError, match=r"tasks_uri .*task row 1: missing field 'snapshot'.*line 2 is not JSON"):
            simulate(_spec(standin, f"file://{bad}"), token=KEY)
        empty = tmp_path / "empty.jsonl"
        empty.write_text("\n")
        with pytest.raises(ValueError, match="holds no tasks"):
            simulate(_spec(standin, f"file://{empty}"), token=KEY)
    assert standin.requests == []
