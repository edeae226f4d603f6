"""The session trainer job (`workers.jobs.session_train`, kind sessiontrain) end to end on the tiny model: recorded
sessions in, one checkpoint out that moves the policy towards the kept edit and away from the reverted one, loads
for evaluation, and keeps the structure of the checkpoint it started from. Through a real `Reporter` against a mock
ingest endpoint."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.workers.realtime.sessions import feedback, session, turn
from workers.jobs import session_train
from workers.jobs.evaluate import load_policy
from workers.models.registry import TINY_LLAMA, resolve_base_model
from workers.realtime.reward import default_session_reward_config
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.packing import completion_logprobs
from workers.session_records import SessionRecord
from workers.specs import EvalConfig, SessionTrainSpec

PROMPT = [1, 1130, 9690, 198, 4238, 314, 2]
KEPT = [2012, 2013, 2014, 2015]
REVERTED = [3012, 3013, 3014, 3015]
CONFIG = {
    "base_model": TINY_LLAMA,
    "algorithm": "grpo",
    "learning_rate": 1e-2,
    "loss": {"kl_coef": 0.0},
    "prompts_per_step": 1,
    "group_size": 2,
    "compute": {"cpus": 1, "memory_gb": 2},
}


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Every event the job's reporter sends, in order."""
    from workers.reporting import Reporter

    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.extend(json.loads(request.content)["events"])
        return httpx.Response(200, json={})

    def reporter_for(spec: Any) -> Reporter:
        client = httpx.Client(transport=httpx.MockTransport(handler))
        return Reporter(ingest_url="http://cp/api/v1/runs/1/ingest/", token="cri_x", client=client, flush_seconds=60)

    monkeypatch.setattr(session_train, "reporter_for", reporter_for)
    yield sent


@pytest.fixture(scope="module")
def base_logprobs() -> dict[str, list[float]]:
    """The base model's log-probabilities of both completions (what serving it recorded: on-policy)."""
    learner = Learner(resolve_base_model(TINY_LLAMA), TrainConfig.model_validate({"base_model": TINY_LLAMA}))
    out = {}
    for name, completion in (("kept", KEPT), ("reverted", REVERTED)):
        with torch.no_grad():
            (logp,) = completion_logprobs(learner.model, [PROMPT + completion], [len(PROMPT)])
        out[name] = logp.tolist()
    return out


def _sessions(base_logprobs: dict[str, list[float]]) -> list[SessionRecord]:
    return [
        session(
            "kept",
            turns=[turn(0, prompt=PROMPT, completion=KEPT, logprobs=base_logprobs["kept"])],
            signals=[feedback("edit_kept")],
        ),
        session(
            "reverted",
            turns=[turn(0, prompt=PROMPT, completion=REVERTED, logprobs=base_logprobs["reverted"])],
            signals=[feedback("edit_reverted")],
        ),
        session("silent", turns=[turn(0, prompt=PROMPT, completion=KEPT, logprobs=base_logprobs["kept"])]),
    ]


def _spec(tmp_path: Path, records: list[SessionRecord] | bytes, **fields: Any) -> SessionTrainSpec:
    rows = tmp_path / "sessions.jsonl"
    if isinstance(records, bytes):
        rows.write_bytes(records)
    else:
        rows.write_text("".join(r.model_dump_json() + "\n" for r in records))
    return SessionTrainSpec.model_validate(
        {
            "run_id": 1,
            "kind": "sessiontrain",
            "ingest_url": "http://cp/api/v1/runs/1/ingest/",
            "sessions_uri": f"file://{rows}",
            "reward": default_session_reward_config(),
            "output_prefix": f"file://{tmp_path}/out",
            "base_model": TINY_LLAMA,
            "config": CONFIG,
            **fields,
        }
    )


def _logp(model: Any, completion: list[int]) -> float:
    with torch.no_grad():
        (logp,) = completion_logprobs(model, [PROMPT + completion], [len(PROMPT)])
    return float(logp.sum())


def test_one_update_moves_the_policy_towards_kept_edits_and_writes_a_checkpoint_that_loads(
    tmp_path: Path, events: list[dict[str, Any]], base_logprobs: dict[str, list[float]]
) -> None:
    summary = session_train.run(_spec(tmp_path, _sessions(base_logprobs)))

    assert {k: summary[k] for k in ("sessions", "used", "dropped", "turns", "steps", "baseline")} == {
        "sessions": 3,
        "used": 2,
        "dropped": 1,
        "turns": 2,
        "steps": 1,
        "baseline": "batch_mean",
    }
    assert summary["on_policy_share"] == 1.0 and summary["tokens"] == 2 * (len(PROMPT) + 4)
    # both turns pay the same C4 length cost (x = 4 tokens · 0.001 + 1 turn · 0.01, cost x/(1+x), weight 0.1), so the
    # batch mean is 0 minus it and the advantages are ±1
    assert summary["reward_mean"] == pytest.approx(-0.1 * (0.014 / 1.014))
    uri = summary["checkpoint_uri"]
    assert uri == f"file://{tmp_path}/out/checkpoints/step-000001.pt"
    assert Path(uri.removeprefix("file://") + ".sha256").is_file()

    kinds = [e["kind"] for e in events]
    assert kinds.count("metric") == 1 and kinds[-2:] == ["summary", "end"]
    [metric] = [e for e in events if e["kind"] == "metric"]
    assert metric["values"]["advantage_abs_mean"] == pytest.approx(1.0)
    assert metric["values"]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # the recorded log-probs: on-policy
    [checkpoint] = [e for e in events if e["kind"] == "checkpoint"]
    assert (checkpoint["step"], checkpoint["uri"]) == (1, uri)
    assert [e for e in events if e["kind"] == "end"][0]["outcome"] == "succeeded"
    last = [e for e in events if e["kind"] == "progress"][-1]
    assert (last["done"], last["total"]) == (1, 1)

    # The checkpoint loads as evaluation loads it, and the kept edit became likelier, the reverted one less likely.
    policy = load_policy(
        EvalConfig(base_model=TINY_LLAMA, checkpoint_uri=uri, environment="exact_answer", threads=1), {}
    )
    base = sum(base_logprobs["kept"]), sum(base_logprobs["reverted"])
    assert _logp(policy.model, KEPT) > base[0] + 1.0
    assert _logp(policy.model, REVERTED) < base[1] - 1.0


def test_it_keeps_the_checkpoints_lora_structure_and_takes_the_specs_optimiser_settings(
    tmp_path: Path, events: list[dict[str, Any]], base_logprobs: dict[str, list[float]]
) -> None:
    lora = {"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]}
    deployed = Learner(
        resolve_base_model(TINY_LLAMA), TrainConfig.model_validate({**CONFIG, "lora": lora, "learning_rate": 0.5})
    )
    start = tmp_path / "deployed.pt"
    start.write_bytes(deployed.checkpoint_bytes(data_position=0))

    summary = session_train.run(
        _spec(tmp_path, _sessions(base_logprobs), checkpoint_uri=f"file://{start}", policy_version=12)
    )

    payload = torch.load(
        io.BytesIO(Path(summary["checkpoint_uri"].removeprefix("file://")).read_bytes()), weights_only=False
    )
    assert payload["config"]["lora"]["rank"] == 2 and payload["config"]["base_model"] == TINY_LLAMA
    assert payload["trainable"] and all("lora_" in name for name in payload["trainable"])
    assert [group["lr"] for group in payload["optimizer"]["param_groups"]] == [1e-2]
    assert summary["on_policy_share"] == 0.0  # the turns were served by version 0, not the deployed 12
    logs = [line for e in events if e["kind"] == "log" for line in e["lines"]]
    assert any("LoRA rank 2" in line for line in logs)


def test_it_never_trains_on_nothing(tmp_path: Path, events: list[dict[str, Any]]) -> None:
    silent = [session("a"), session("b", signals=[feedback("text")])]
    with pytest.raises(SystemExit, match="no trainable session among 2: 2 dropped by the reward"):
        session_train.run(_spec(tmp_path, silent))
    [end] = [e for e in events if e["kind"] == "end"]
    assert end["outcome"] == "failed" and "no trainable session" in end["error"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"format": "session/v1"}\n', r"sessions.jsonl: line 1: field 'session_id': Field required"),
        (
            session("a").model_dump_json().encode() + b"\n\nnot json\n",
            r"sessions.jsonl: line 3: invalid JSON",
        ),
    ],
)
def test_a_malformed_row_fails_the_job_naming_its_line(
    tmp_path: Path, events: list[dict[str, Any]], data: bytes, message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        session_train.run(_spec(tmp_path, data))


def test_it_refuses_a_reward_without_feedback_and_tokens_from_another_model(
    tmp_path: Path, events: list[dict[str, Any]]
) -> None:
    rows = [session("a", signals=[feedback("edit_kept")])]
    with pytest.raises(SystemExit, match="needs a session_feedback term"):
        session_train.run(_spec(tmp_path, rows, reward={"terms": [{"type": "broken_tool_calls"}]}))
    with pytest.raises(SystemExit, match=r"reward: terms\[0\] \(session_feedback\).turn_decay"):
        session_train.run(_spec(tmp_path, rows, reward={"terms": [{"type": "session_feedback", "turn_decay": 2}]}))
    foreign = [session("a", turns=[turn(0, completion=[10**6])], signals=[feedback("edit_kept")])]
    with pytest.raises(SystemExit, match="token id 1000000 is outside the model's vocabulary"):
        session_train.run(_spec(tmp_path, foreign))
