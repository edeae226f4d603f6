"""A job's preflight (workers.jobs.preflight): every Hub id or path the spec names is on the worker before any
compute starts, or the run fails at once naming the field, the model and the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.hub_standin import HubStandin, isolate_hub_client
from workers.jobs.preflight import model_fields, preflight_models
from workers.models import hub
from workers.models.hub import ModelUnavailable
from workers.models.registry import TINY_LLAMA, resolve_base_model
from workers.rl.config import TrainConfig
from workers.rl.config_sections import SFTConfig
from workers.specs import SFTSpec, TrainSpec


class Recorder:
    """Stands in for the ingest reporter: records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append((name, args))

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [args for name, args in self.calls if name == kind]


def train_spec(tmp_path: Path, **config: Any) -> TrainSpec:
    return TrainSpec(
        run_id=1,
        kind="train",
        ingest_url="http://127.0.0.1:9/",
        input_uri=f"file://{tmp_path}/tasks.jsonl",
        reward={"terms": [{"type": "exact_match"}]},
        output_prefix=f"file://{tmp_path}/out",
        config=TrainConfig.model_validate({"steps": 1, "prompts_per_step": 2, "group_size": 2, **config}),
    )


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    source = resolve_base_model(TINY_LLAMA)
    files = {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()}
    refused = isolate_hub_client(monkeypatch, tmp_path / "default-cache")
    with HubStandin() as server:
        server.add_repo("crucible-test/tiny", files)
        server.add_repo("crucible-test/gated", files, gated=True, token="hf_secret")
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("CRUCIBLE_MODEL_CACHE", str(tmp_path / "cache"))
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(hub, "_RESOLVED", {})
        yield server
    assert not refused


def test_a_hub_base_model_is_fetched_first_and_its_commit_and_card_go_into_the_summary(
    standin: HubStandin, tmp_path: Path
) -> None:
    reporter = Recorder()
    records = preflight_models(train_spec(tmp_path, base_model="crucible-test/tiny"), reporter)  # type: ignore[arg-type]
    [record] = records.values()
    assert list(records) == ["config.base_model"] and record["source"] == "hub"
    assert record["id"] == "crucible-test/tiny" and record["revision"] == "main" and len(record["commit"]) == 40
    assert record["card"]["chat_template"] and record["card"]["parameters"]
    assert reporter.of("summary") == [({"models": records},)]
    assert reporter.of("progress") == []  # the run's progress counts its steps: the download is told in the log
    logs = [line for (line,) in reporter.of("log")]
    assert any(line.startswith("model crucible-test/tiny: ") and " MB (model.safetensors)" in line for line in logs)
    assert any(f"commit {record['commit']} downloaded" in line for line in logs)
    # The next job on this node finds it in the cache.
    hub._RESOLVED.clear()
    again = preflight_models(train_spec(tmp_path, base_model="crucible-test/tiny"), Recorder())  # type: ignore[arg-type]
    assert again["config.base_model"]["from_cache"] and again["config.base_model"]["commit"] == record["commit"]


def test_a_builtin_model_needs_no_preflight_and_sends_nothing(tmp_path: Path) -> None:
    reporter = Recorder()
    assert preflight_models(train_spec(tmp_path, base_model=TINY_LLAMA), reporter) == {}  # type: ignore[arg-type]
    assert reporter.calls == []


def test_each_model_field_of_a_warm_up_is_checked(standin: HubStandin, tmp_path: Path) -> None:
    spec = SFTSpec(
        run_id=2,
        kind="sft",
        ingest_url="http://127.0.0.1:9/",
        input_uri=f"file://{tmp_path}/tasks.jsonl",
        reward={"terms": [{"type": "exact_match"}]},
        output_prefix=f"file://{tmp_path}/out",
        config=SFTConfig(teacher_model="crucible-test/tiny", base_model="/nowhere/on/this/node"),
    )
    assert model_fields(spec) == {
        "config.teacher_model": "crucible-test/tiny",
        "config.base_model": "/nowhere/on/this/node",
    }
    with pytest.raises(ModelUnavailable, match=r"^config\.base_model: model path '/nowhere/on/this/node': no such"):
        preflight_models(spec, Recorder())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"base_model": "crucible-test/gated"}, r"^config\.base_model: crucible-test/gated is a gated .* set HF_TOKEN"),
        ({"base_model": "crucible-test/missing"}, r"^config\.base_model: no model 'crucible-test/missing'"),
        (
            {"base_model": "crucible-test/tiny", "compute": {"cpus": 1, "memory_gb": 0.01}},
            r"^config\.compute\.memory_gb: crucible-test/tiny is too large .* asks for 0\.01",
        ),
    ],
)
def test_a_model_that_cannot_be_had_fails_the_job_before_any_compute(
    standin: HubStandin, tmp_path: Path, config: dict[str, Any], words: str
) -> None:
    reporter = Recorder()
    with pytest.raises(ModelUnavailable, match=words):
        preflight_models(train_spec(tmp_path, **config), reporter)  # type: ignore[arg-type]
    assert reporter.of("summary") == []


def test_a_path_that_is_not_a_causal_lm_is_refused(tmp_path: Path) -> None:
    (tmp_path / "encoder").mkdir()
    (tmp_path / "encoder" / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ModelUnavailable, match=r"config\.base_model: .*not a causal language model \(BertModel\)"):
        preflight_models(train_spec(tmp_path, base_model=str(tmp_path / "encoder")), Recorder())  # type: ignore[arg-type]
