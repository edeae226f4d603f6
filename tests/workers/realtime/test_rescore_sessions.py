"""Re-scoring stored sessions with a new session reward version is the existing re-scoring job: it reads
`session/v1` rows beside plain trajectory rows, scores each session per turn, and leaves sessions the reward drops
out of every mean."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.workers.realtime.sessions import feedback, session, turn
from workers.jobs import rescore
from workers.reporting import Reporter
from workers.trajectories import parse_trajectories_jsonl

REWARD_V2 = {"terms": [{"type": "session_feedback", "turn_decay": 0.5}, {"type": "broken_tool_calls"}]}


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.extend(json.loads(request.content)["events"])
        return httpx.Response(200, json={})

    def reporter_for(spec: Any) -> Reporter:
        client = httpx.Client(transport=httpx.MockTransport(handler))
        return Reporter(ingest_url="http://cp/api/v1/runs/1/ingest/", token="cri_x", client=client, flush_seconds=60)

    monkeypatch.setattr(rescore, "reporter_for", reporter_for)
    yield sent


def _inline_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray is outside the project: its tasks run inline here (an object ref is the computed value)."""
    ref = SimpleNamespace
    monkeypatch.setattr(rescore.ray, "init", lambda **kwargs: None)
    monkeypatch.setattr(rescore.ray, "put", lambda value: ref(value=value))
    monkeypatch.setattr(rescore.ray, "wait", lambda pending, num_returns: (pending[:1], pending[1:]))
    monkeypatch.setattr(rescore.ray, "get", lambda refs: [r.value for r in refs])

    def remote(reward: Any, rows: list[dict[str, Any]], detectors: Any) -> Any:
        return ref(value=rescore.score_shard(reward.value, rows, detectors.value))

    monkeypatch.setattr(rescore, "_score_shard_remote", SimpleNamespace(remote=remote))


def _input(tmp_path: Path) -> Path:
    rows = [
        session(
            "kept",
            turns=[turn(0), turn(1, content="<tool_call>{")],
            signals=[feedback("edit_kept", turn_index=1)],
        ).model_dump_json(),
        session("silent", turns=[turn(0)]).model_dump_json(),
        json.dumps({"id": "plain", "turns": [{"role": "assistant", "content": "4"}]}),
    ]
    source = tmp_path / "sessions.jsonl"
    source.write_text("\n".join(rows) + "\n")
    return source


def _spec(tmp_path: Path, source: Path) -> rescore.RescoreSpec:
    return rescore.RescoreSpec(
        run_id=1,
        kind="rescore",
        ingest_url="http://cp/api/v1/runs/1/ingest/",
        input_uri=f"file://{source}",
        output_uri=f"file://{tmp_path}/scores.jsonl",
        reward=REWARD_V2,
        shard_size=1,
    )


def _check(tmp_path: Path, summary: dict[str, Any], events: list[dict[str, Any]]) -> None:
    scores = {
        row["trajectory_id"]: row for row in map(json.loads, (tmp_path / "scores.jsonl").read_text().splitlines())
    }
    kept = scores["kept@7"]
    # credits [0.5, 1] (decay 0.5), one malformed call 0.1 on every turn; the session: mean credit 0.75 − 0.1
    assert kept["turn_rewards"] == [pytest.approx(0.4), pytest.approx(0.9)]
    assert kept["reward"] == pytest.approx(0.65) and kept["dropped"] is False
    assert scores["silent@7"]["reward"] is None and scores["silent@7"]["dropped"] is True
    # a plain trajectory row is read beside them; it has no feedback either, so this reward drops it too
    assert scores["plain"]["dropped"] is True and "turn_rewards" not in scores["plain"]
    assert summary["trajectories"] == 3 and summary["dropped"] == 2
    assert summary["reward_mean"] == pytest.approx(0.65)
    reported = {e["trajectory_id"]: e for e in events if e["kind"] == "trajectory"}
    assert reported["silent@7"]["reward"] is None and reported["kept@7"]["num_turns"] == 2
    last = [e for e in events if e["kind"] == "metric"][-1]["values"]
    assert last["reward_mean"] == pytest.approx(0.65) and last["dropped"] == 2.0


def test_the_rescoring_job_rescoring_sessions_with_a_new_reward_version(
    tmp_path: Path, events: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _inline_ray(monkeypatch)
    summary = rescore.run(_spec(tmp_path, _input(tmp_path)))
    _check(tmp_path, summary, events)


@pytest.mark.slow
def test_the_rescoring_job_rescoring_sessions_on_a_local_ray(tmp_path: Path, events: list[dict[str, Any]]) -> None:
    import ray

    try:
        summary = rescore.run(_spec(tmp_path, _input(tmp_path)))
    finally:
        ray.shutdown()
    _check(tmp_path, summary, events)


def test_a_malformed_session_row_is_a_line_error_of_the_input(tmp_path: Path, events: list[dict[str, Any]]) -> None:
    bad = json.loads(session("a").model_dump_json())
    bad["turns"][0]["logprobs"] = []
    from workers.realtime.samples import trajectory_from_row

    parsed = parse_trajectories_jsonl(
        (json.dumps({"id": "ok"}) + "\n" + json.dumps(bad) + "\n").encode(), convert=trajectory_from_row
    )
    [error] = parsed.errors
    assert error.line == 2 and error.message.startswith("field 'turns[0]': Value error, logprobs has 0 values")
    source = tmp_path / "bad.jsonl"
    source.write_text(json.dumps(bad) + "\n")
    with pytest.raises(SystemExit, match="first: line 1: field 'turns\\[0\\]'"):
        rescore.run(_spec(tmp_path, source))
