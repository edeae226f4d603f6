"""Detectors in the execution plane: the rollout worker attaches findings to every scored episode, and the eval
and re-scoring jobs report them as flag events (through a real `Reporter` against a mock ingest endpoint)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from workers.detectors import DetectorConfig, detectors
from workers.envs.registry import arithmetic_tasks
from workers.models import make_backend
from workers.models.base import Generation, SamplingParams, encode_chat
from workers.models.registry import TINY_LLAMA, load_tokenizer, resolve_base_model
from workers.reporting import Reporter
from workers.rl.rollout import RolloutWorker

BROKEN_CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": 6 * 7}}</tool_call>'


class ScriptedBackend:
    """The tiny model's tokenizer with scripted replies: turn t of every episode answers `replies[t]`."""

    def __init__(self, replies: Sequence[str]) -> None:
        self._tokenizer = load_tokenizer(resolve_base_model(TINY_LLAMA))
        self.replies = list(replies)
        self.turn = 0

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def policy_version(self) -> int:
        return 0

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> list[int]:
        return encode_chat(self._tokenizer, messages, add_generation_prompt=add_generation_prompt)

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        text = self.replies[min(self.turn, len(self.replies) - 1)]
        self.turn += 1
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return [Generation(list(prompt), list(ids), [0.0] * len(ids), text, "stop", 0) for prompt in prompt_token_ids]


def _only(name: str, **params: Any) -> DetectorConfig:
    return DetectorConfig.model_validate(
        {other: {"enabled": other == name, **(params if other == name else {})} for other in detectors()}
    )


def test_every_scored_episode_carries_its_findings() -> None:
    worker = RolloutWorker(
        ScriptedBackend([BROKEN_CALL, "The answer is 42"]),  # type: ignore[arg-type]
        environment="calculator",
        env_params={"max_turns": 3},
        reward={"terms": [{"type": "exact_match"}]},
    )
    result = worker.rollout([{"id": "c1", "prompt": "What is 6 times 7?", "answer": 42}], group_size=2, seed=0)
    assert len(result.samples) == 2
    for sample in result.samples:
        [finding] = sample.findings
        assert finding.detector == "malformed_tool_calls" and finding.trajectory_id == sample.trajectory["id"]
        evidence_turn = sample.trajectory["turns"][finding.evidence["turn"]]
        assert evidence_turn["role"] == "tool" and evidence_turn["content"].startswith("error: invalid JSON")
        assert sample.malformed_tool_calls == 1


def test_the_run_specs_detector_settings_decide_what_is_flagged() -> None:
    clean = RolloutWorker(
        ScriptedBackend(["42"]),  # type: ignore[arg-type]
        environment="calculator",
        env_params={"max_turns": 3},
        reward={"terms": [{"type": "exact_match"}]},
        detectors={"malformed_tool_calls": {"enabled": False}},
    )
    assert all(s.findings == [] for s in clean.rollout(arithmetic_tasks(2, seed=1), group_size=2, seed=0).samples)
    with pytest.raises(ValueError, match="unknown detector 'length'"):
        RolloutWorker(
            ScriptedBackend(["42"]),  # type: ignore[arg-type]
            environment="calculator",
            env_params={},
            reward={"terms": [{"type": "exact_match"}]},
            detectors={"length": {}},
        )


def test_the_tiny_model_rollout_is_flagged_by_a_one_character_length_limit() -> None:
    backend = make_backend("transformers", resolve_base_model(TINY_LLAMA))
    worker = RolloutWorker(
        backend,
        environment="exact_answer",
        env_params={},
        reward={"terms": [{"type": "exact_match"}]},
        max_new_tokens=4,
        detectors=_only("length_blowup", max_turn_chars=1, max_total_chars=1),
    )
    samples = worker.rollout(arithmetic_tasks(2, seed=0), group_size=2, seed=3).samples
    assert len(samples) == 4
    for sample in samples:
        reply = sample.trajectory["turns"][-1]["content"]
        expected = ["length_blowup"] if len(reply) > 1 else []
        assert [f.detector for f in sample.findings] == expected
        if sample.findings:
            assert sample.findings[0].evidence["span"] == [1, len(reply)]
    assert any(sample.findings for sample in samples)  # 4 tokens of a random model are more than 1 character


# --- the jobs report what the detectors found ---------------------------------------------------------------------


@pytest.fixture
def ingested(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Every event the jobs' reporter sends, in order; each job module's `reporter_for` gives that reporter."""
    events: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        events.extend(json.loads(request.content)["events"])
        return httpx.Response(200, json={})

    def reporter_for(spec: Any) -> Reporter:
        client = httpx.Client(transport=httpx.MockTransport(handler))
        return Reporter(ingest_url="http://cp/api/v1/runs/1/ingest/", token="cri_x", client=client, flush_seconds=60)

    for module in ("workers.jobs.evaluate", "workers.jobs.rescore"):
        monkeypatch.setattr(f"{module}.reporter_for", reporter_for)
    yield events


def _kinds_in_order(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events if e["kind"] in ("trajectory", "flag")]


def test_the_eval_job_reports_each_attempts_flags_after_its_trajectory(
    ingested: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.jobs import evaluate

    monkeypatch.setattr(evaluate, "load_policy", lambda config, opts: ScriptedBackend([BROKEN_CALL, "42"]))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "c1", "prompt": "What is 6 times 7?", "answer": 42}) + "\n")
    spec = evaluate.EvalSpec(
        run_id=1,
        kind="eval",
        ingest_url="http://cp/api/v1/runs/1/ingest/",
        config=evaluate.EvalConfig(base_model=TINY_LLAMA, environment="calculator", env_params={"max_turns": 3}, k=2),
        tasks_uri=f"file://{tasks}",
        reward={"terms": [{"type": "exact_match"}]},
        output_prefix=f"file://{tmp_path}/out",
    )
    evaluate.run(spec)
    assert _kinds_in_order(ingested) == ["trajectory", "flag", "trajectory", "flag"]
    flags = [e for e in ingested if e["kind"] == "flag"]
    trajectories = [e["trajectory_id"] for e in ingested if e["kind"] == "trajectory"]
    assert [f["trajectory_id"] for f in flags] == trajectories
    assert {(f["detector"], f["detector_version"], f["step"]) for f in flags} == {("malformed_tool_calls", "1", 0)}
    [metric] = [e for e in ingested if e["kind"] == "metric"]
    assert metric["values"]["flags/rate"] == 1.0 and metric["values"]["flags/malformed_tool_calls"] == 1.0


class PerAttemptBackend(ScriptedBackend):
    """Attempt i of a batch answers `replies[i]` (every turn), so the k attempts at one task differ."""

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for i, prompt in enumerate(prompt_token_ids):
            text = self.replies[i % len(self.replies)]
            ids = self._tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(list(prompt), list(ids), [0.0] * len(ids), text, "stop", 0))
        return out


def test_the_eval_job_scores_search_attempts_fused_as_context1_kx(
    ingested: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.jobs import evaluate
    from workers.search.environment import SearchEnv
    from workers.search.index import IndexConfig, SearchIndex
    from workers.search.index_store import save_index
    from workers.search.types import Chunk

    chunks = [Chunk(f"d{i}#0", f"d{i}", 0, f"Passage {i} about topic number {i}.") for i in range(3)]
    index_uri = f"file://{tmp_path}/index"
    save_index(SearchIndex.build(chunks, IndexConfig(dense=False)), index_uri)
    # Each attempt finds one gold chunk and one wrong one (0.5 recall alone); RRF puts d0 (in both) and d1 (first
    # in one) above d2 in the fused top two: 1.0.
    replies = [
        "<Document id=d0#0></Document><Document id=d2#0></Document>",
        "<Document id=d1#0></Document><Document id=d0#0></Document>",
    ]
    monkeypatch.setattr(evaluate, "load_policy", lambda config, opts: PerAttemptBackend(replies))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "prompt": "Find topics 0 and 1", "gold_chunk_ids": ["d0#0", "d1#0"]}))
    spec = evaluate.EvalSpec(
        run_id=1,
        kind="eval",
        ingest_url="http://cp/api/v1/runs/1/ingest/",
        config=evaluate.EvalConfig(
            base_model=TINY_LLAMA, environment="search", env_params={"index_uri": index_uri}, k=2
        ),
        tasks_uri=f"file://{tasks}",
        reward=SearchEnv.eval_reward(),
        output_prefix=f"file://{tmp_path}/out",
    )
    metrics = evaluate.run(spec)["eval"]["metrics"]
    assert metrics["ensemble_2x/output_recall"] == 1.0
    assert metrics["mean_score"] < 1.0  # no single attempt had both


def test_the_rescore_job_reports_flags_and_writes_them_beside_the_scores(
    ingested: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.jobs import rescore

    # Ray is outside the project: its tasks run inline here (an object ref is the computed value).
    ref = SimpleNamespace
    monkeypatch.setattr(rescore.ray, "init", lambda **kwargs: None)
    monkeypatch.setattr(rescore.ray, "put", lambda value: ref(value=value))
    monkeypatch.setattr(rescore.ray, "wait", lambda pending, num_returns: (pending[:1], pending[1:]))
    monkeypatch.setattr(rescore.ray, "get", lambda refs: [r.value for r in refs])

    def remote(reward: Any, rows: list[dict[str, Any]], detectors: Any) -> Any:
        return ref(value=rescore.score_shard(reward.value, rows, detectors.value))

    monkeypatch.setattr(rescore, "_score_shard_remote", SimpleNamespace(remote=remote))
    rows = [
        {
            "id": "broken",
            "answer": "4",
            "gold_answers": ["4"],
            "turns": [
                {"role": "assistant", "content": '<tool_call>{"name": calculate}</tool_call>'},
                {"role": "tool", "content": "error: invalid JSON in <tool_call> block"},
                {"role": "assistant", "content": "4"},
            ],
        },
        {"id": "clean", "answer": "4", "gold_answers": ["4"], "turns": [{"role": "assistant", "content": "4"}]},
    ]
    source, output = tmp_path / "in.jsonl", tmp_path / "scores.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    spec = rescore.RescoreSpec(
        run_id=1,
        kind="rescore",
        ingest_url="http://cp/api/v1/runs/1/ingest/",
        input_uri=f"file://{source}",
        output_uri=f"file://{output}",
        reward={"terms": [{"type": "exact_match"}]},
        shard_size=1,
    )
    summary = rescore.run(spec)
    assert summary["flag_counts"] == {"malformed_tool_calls": 1}
    assert _kinds_in_order(ingested) == ["trajectory", "flag", "trajectory"]
    [flag] = [e for e in ingested if e["kind"] == "flag"]
    assert (flag["trajectory_id"], flag["detector"], flag["evidence"]["turn"]) == ("broken", "malformed_tool_calls", 1)
    written = {row["trajectory_id"]: row for row in map(json.loads, output.read_text().splitlines())}
    assert [f["detector"] for f in written["broken"]["flags"]] == ["malformed_tool_calls"]
    assert written["clean"]["flags"] == []
    rates = [e["values"]["flags/rate"] for e in ingested if e["kind"] == "metric"]
    assert rates[-1] == 0.5
