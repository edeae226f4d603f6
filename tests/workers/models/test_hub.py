"""Models by Hub id (workers.models.hub): resolved through a stand-in of the Hub's HTTP API (tests.hub_standin),
never the internet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub_standin import HubStandin, isolate_hub_client
from workers.models import hub
from workers.models.hub import (
    HubRef,
    ModelUnavailable,
    classify_model_name,
    hub_config,
    model_card,
    parse_hub_id,
    resolve_hub_model,
)
from workers.models.registry import BUILTINS, TINY_LLAMA, model_name_problems, resolve_base_model

ROOT = Path(__file__).resolve().parents[3]
README = b"---\nlicense: apache-2.0\ntags: [test]\n---\n# A tiny model\n"


@pytest.fixture(scope="module")
def tiny_files() -> dict[str, bytes]:
    """The tiny model's files as a Hub repository holds them, with a model card and a file Crucible never fetches."""
    source = resolve_base_model(TINY_LLAMA)
    files = {p.name: p.read_bytes() for p in source.iterdir() if p.is_file() and p.name != "crucible-source.json"}
    return {**files, "README.md": README, "onnx/model.onnx": b"not fetched"}


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_files: dict[str, bytes]):  # type: ignore[no-untyped-def]
    refused = isolate_hub_client(monkeypatch, tmp_path / "default-cache")
    with HubStandin() as server:
        server.add_repo("crucible-test/tiny", tiny_files)
        server.add_repo("crucible-test/tiny", {**tiny_files, "README.md": README + b"v2\n"}, revision="v2")
        server.add_repo("crucible-test/gated", tiny_files, gated=True, token="hf_secret")
        bert = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 8}
        server.add_repo("crucible-test/encoder", {"config.json": json.dumps(bert).encode()})
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("CRUCIBLE_MODEL_CACHE", str(tmp_path / "cache"))
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_HOME"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(hub, "_RESOLVED", {})
        yield server
    assert not refused, f"requests tried to leave 127.0.0.1: {refused}"


def _file_gets(server: HubStandin) -> list[str]:
    return [path for method, path in server.requests if method == "GET" and "/resolve/" in path]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (TINY_LLAMA, "builtin"),
        ("/models/on-the-workers", "path"),
        ("./relative", "path"),
        ("~/models/x", "path"),
        ("org/name", "hub"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct@main", "hub"),
        ("org/name@refs/pr/1", "hub"),
        ("org/name@0123456789abcdef0123456789abcdef01234567", "hub"),
        ("gpt2", None),
        ("a/b/c", None),
        ("org/na me", None),
        ("org/-name", None),
        ("org/name@", None),
        ("", None),
    ],
)
def test_a_model_name_is_a_builtin_a_path_or_a_hub_id(name: str, kind: str | None) -> None:
    assert classify_model_name(name, frozenset(BUILTINS)) == kind


def test_a_hub_id_downloads_once_into_the_cache_and_records_its_commit(standin: HubStandin, tmp_path: Path) -> None:
    seen: list[tuple[int, int, str]] = []
    first = resolve_hub_model("crucible-test/tiny", progress=lambda done, total, name: seen.append((done, total, name)))
    assert first.path == tmp_path / "cache/hub/models--crucible-test--tiny/snapshots" / first.commit
    assert len(first.commit) == 40 and not first.from_cache
    assert (first.path / "config.json").is_file() and (first.path / "model.safetensors").is_file()
    assert not (first.path / "onnx").exists()  # only what a causal LM needs is fetched
    assert seen[-1][0] == seen[-1][1] > 0 and [s[0] for s in seen] == sorted(s[0] for s in seen)
    assert seen[-1][2] == "model.safetensors"  # the small files first, the weights last
    card = first.card
    assert card["license"] == "apache-2.0" and card["chat_template"] is True and card["context_length"] == 2048
    assert card["parameters"] and card["weights_bytes"] == (first.path / "model.safetensors").stat().st_size
    assert first.record()["commit"] == first.commit and first.record()["revision"] == "main"
    # Another process on the node (a fresh memo) finds it in the cache: it asks the Hub for the commit, fetches no file.
    gets = len(_file_gets(standin))
    hub._RESOLVED.clear()
    again = resolve_hub_model("crucible-test/tiny")
    assert again.from_cache and again.commit == first.commit and len(_file_gets(standin)) == gets
    # The resolution loads like any model directory.
    assert resolve_base_model("crucible-test/tiny") == first.path


def test_a_revision_resolves_to_its_own_commit_and_a_commit_to_itself(standin: HubStandin) -> None:
    main = resolve_hub_model("crucible-test/tiny")
    v2 = resolve_hub_model("crucible-test/tiny@v2")
    assert v2.commit != main.commit and v2.record()["revision"] == "v2"
    assert b"v2" in (v2.path / "README.md").read_bytes()
    pinned = resolve_hub_model(f"crucible-test/tiny@{v2.commit}")
    assert pinned.commit == v2.commit and pinned.from_cache


def test_two_processes_asking_at_once_download_the_weights_once(standin: HubStandin, tmp_path: Path) -> None:
    script = "from workers.models.hub import resolve_hub_model; print(resolve_hub_model('crucible-test/tiny').commit)"
    env = {**__import__("os").environ}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    commits = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(commits) == 1
    weights = [path for path in _file_gets(standin) if path.endswith("/model.safetensors")]
    assert len(weights) == 1, standin.requests


def test_a_gated_model_needs_a_token_from_the_environment(standin: HubStandin, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelUnavailable, match="gated repository .* set HF_TOKEN"):
        resolve_hub_model("crucible-test/gated")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(ModelUnavailable, match="gated repository .* HF_TOKEN has no access"):
        resolve_hub_model("crucible-test/gated")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert (resolve_hub_model("crucible-test/gated").path / "model.safetensors").is_file()


def test_an_unknown_model_a_bad_revision_and_an_encoder_are_refused_with_the_reason(standin: HubStandin) -> None:
    with pytest.raises(ModelUnavailable, match=r"no model 'crucible-test/tinny' on http://127\.0\.0\.1:\d+: check"):
        resolve_hub_model("crucible-test/tinny")
    with pytest.raises(ModelUnavailable, match="has no revision 'v9'"):
        resolve_hub_model("crucible-test/tiny@v9")
    with pytest.raises(ModelUnavailable, match=r"not a causal language model \(BertModel\)"):
        resolve_hub_model("crucible-test/encoder")


def test_offline_the_cache_serves_and_a_model_missing_from_it_names_the_cache_and_the_switch(
    standin: HubStandin, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    online = resolve_hub_model("crucible-test/tiny")
    hub._RESOLVED.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(standin.requests)
    offline = resolve_hub_model("crucible-test/tiny")
    assert offline.path == online.path and offline.commit == online.commit and offline.from_cache
    assert len(standin.requests) == before  # nothing asked of the Hub
    with pytest.raises(ModelUnavailable) as raised:
        resolve_hub_model("crucible-test/gated")
    assert str(tmp_path / "cache" / "hub") in str(raised.value) and "HF_HUB_OFFLINE" in str(raised.value)


def test_an_unreachable_hub_falls_back_to_the_cache(standin: HubStandin, monkeypatch: pytest.MonkeyPatch) -> None:
    online = resolve_hub_model("crucible-test/tiny")
    hub._RESOLVED.clear()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    assert resolve_hub_model("crucible-test/tiny").commit == online.commit
    with pytest.raises(ModelUnavailable, match="could not be reached"):
        resolve_hub_model("crucible-test/v2-never-fetched")


def test_the_launch_check_reads_the_config_and_leaves_what_it_cannot_tell_to_the_workers(
    standin: HubStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = hub_config(HubRef("crucible-test/tiny"))
    assert config is not None and config["num_hidden_layers"] == 2
    assert hub_config(parse_hub_id("crucible-test/tiny@v2")) is not None
    assert hub_config(HubRef("crucible-test/gated")) is None  # the workers may hold a token
    assert model_name_problems("crucible-test/tiny") == []
    [problem] = model_name_problems("crucible-test/tinny")
    assert "no model 'crucible-test/tinny'" in problem
    [problem] = model_name_problems("crucible-test/tiny@v9")
    assert "no revision 'v9'" in problem
    [problem] = model_name_problems("crucible-test/encoder")
    assert "not a causal language model" in problem
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert hub_config(HubRef("crucible-test/tinny")) is None  # unreachable: no 400 for what may exist
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_name_problems("crucible-test/tinny") == []
    assert not [path for _, path in standin.requests if "/tinny/" in path and "9" in path]


def test_a_model_card_reads_a_directory_without_a_hub(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "n_positions": 512}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4000)
    card = model_card(tmp_path, {})
    assert card == {
        "architecture": "LlamaForCausalLM",
        "context_length": 512,
        "chat_template": False,
        "license": "",
        "weights_bytes": 4000,
        "parameters": 1000,
    }
