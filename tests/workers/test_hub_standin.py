"""The Hub stand-in, exercised through huggingface_hub's real client functions, with no connection off 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import huggingface_hub
import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.hub_standin import HubStandin, isolate_hub_client

FILES = {"config.json": b'{"model_type": "tiny"}', "weights/model.safetensors": b"\x00" * 256}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubStandin]:
    """A running stand-in; huggingface_hub configured as the product does, and any non-loopback connection refused."""
    refused = isolate_hub_client(monkeypatch, tmp_path / "default-cache")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with HubStandin() as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.endpoint)
        yield standin
    assert not refused, f"requests tried to leave 127.0.0.1: {refused}"


def _downloads(hub: HubStandin) -> list[str]:
    return [path for method, path in hub.requests if method == "GET" and "/resolve/" in path]


def test_snapshot_download_returns_the_snapshot_of_the_commit(hub: HubStandin, tmp_path: Path) -> None:
    sha = hub.add_repo("org/tiny", FILES)

    folder = Path(snapshot_download("org/tiny", cache_dir=tmp_path / "hf", endpoint=hub.endpoint))

    assert folder == tmp_path / "hf" / "models--org--tiny" / "snapshots" / sha
    assert (folder / "config.json").read_bytes() == FILES["config.json"]
    assert (folder / "weights" / "model.safetensors").read_bytes() == FILES["weights/model.safetensors"]
    assert sorted(_downloads(hub)) == [
        f"/org/tiny/resolve/{sha}/config.json",
        f"/org/tiny/resolve/{sha}/weights/model.safetensors",
    ]


def test_a_second_snapshot_download_with_the_same_cache_downloads_nothing(hub: HubStandin, tmp_path: Path) -> None:
    hub.add_repo("org/tiny", FILES)
    first = snapshot_download("org/tiny", cache_dir=tmp_path, endpoint=hub.endpoint)
    before = len(hub.requests)

    second = snapshot_download("org/tiny", cache_dir=tmp_path, endpoint=hub.endpoint)

    assert second == first
    assert hub.requests[before:] == [("GET", "/api/models/org/tiny/revision/main")]


def test_files_from_a_directory_and_a_second_revision(hub: HubStandin, tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "weights").mkdir(parents=True)
    for name, content in FILES.items():
        (source / name).write_bytes(content)
    main = hub.add_repo("org/tiny", source)
    v2 = hub.add_repo("org/tiny", {"config.json": b'{"model_type": "tiny", "v": 2}'}, revision="v2")
    cache = tmp_path / "hf"

    assert main == hub.add_repo("org/tiny", FILES)  # deterministic: same files, same sha
    assert len(v2) == 40 and v2 != main
    assert Path(snapshot_download("org/tiny", cache_dir=cache, endpoint=hub.endpoint)).name == main
    folder = Path(snapshot_download("org/tiny", revision="v2", cache_dir=cache, endpoint=hub.endpoint))
    assert folder.name == v2
    assert (folder / "config.json").read_bytes() == b'{"model_type": "tiny", "v": 2}'
    assert not (folder / "weights").exists()
    by_sha = snapshot_download("org/tiny", revision=v2, cache_dir=tmp_path / "other", endpoint=hub.endpoint)
    assert Path(by_sha).name == v2


def test_hf_hub_download_and_a_quoted_revision(hub: HubStandin, tmp_path: Path) -> None:
    sha = hub.add_repo("org/tiny", FILES, revision="refs/pr/1")

    path = hf_hub_download("org/tiny", "config.json", revision="refs/pr/1", cache_dir=tmp_path, endpoint=hub.endpoint)

    assert Path(path).read_bytes() == FILES["config.json"]
    assert Path(path).parent.name == sha
    assert ("HEAD", "/org/tiny/resolve/refs/pr/1/config.json") in hub.requests


def test_model_info_returns_the_sha_and_siblings(hub: HubStandin) -> None:
    sha = hub.add_repo("org/tiny", FILES)
    v2 = hub.add_repo("org/tiny", {"config.json": b"{}"}, revision="v2")
    api = HfApi(endpoint=hub.endpoint)

    info = api.model_info("org/tiny", revision="main", files_metadata=True)

    assert (info.id, info.sha, info.gated) == ("org/tiny", sha, False)
    assert {(s.rfilename, s.size) for s in info.siblings or []} == {
        ("config.json", len(FILES["config.json"])),
        ("weights/model.safetensors", 256),
    }
    assert api.model_info("org/tiny").sha == sha
    assert api.model_info("org/tiny", revision="v2").sha == v2


def test_plain_httpx_get_of_a_resolve_url(hub: HubStandin) -> None:
    sha = hub.add_repo("org/tiny", FILES)

    response = httpx.get(f"{hub.endpoint}/org/tiny/resolve/main/config.json")

    assert response.status_code == 200
    assert response.content == FILES["config.json"]
    assert response.headers["X-Repo-Commit"] == sha


def test_gated_repo_needs_the_token(hub: HubStandin, tmp_path: Path) -> None:
    sha = hub.add_repo("org/gated", FILES, gated=True, token="hf_secret")

    with pytest.raises(GatedRepoError):
        snapshot_download("org/gated", cache_dir=tmp_path / "a", endpoint=hub.endpoint)
    with pytest.raises(GatedRepoError):
        hf_hub_download("org/gated", "config.json", cache_dir=tmp_path / "b", endpoint=hub.endpoint, token="wrong")
    assert httpx.get(f"{hub.endpoint}/org/gated/resolve/main/config.json").status_code == 401
    assert _downloads(hub) == ["/org/gated/resolve/main/config.json"]  # only the plain httpx GET reached a file

    folder = snapshot_download("org/gated", cache_dir=tmp_path / "c", endpoint=hub.endpoint, token="hf_secret")
    assert Path(folder).name == sha
    assert HfApi(endpoint=hub.endpoint).model_info("org/gated").gated == "manual"


def test_unknown_repo_revision_and_file(hub: HubStandin, tmp_path: Path) -> None:
    hub.add_repo("org/tiny", FILES)

    with pytest.raises(RepositoryNotFoundError) as missing_repo:
        snapshot_download("org/absent", cache_dir=tmp_path, endpoint=hub.endpoint)
    assert not isinstance(missing_repo.value, GatedRepoError)
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.endpoint).model_info("org/absent")
    with pytest.raises(RevisionNotFoundError):
        snapshot_download("org/tiny", revision="no-such-branch", cache_dir=tmp_path, endpoint=hub.endpoint)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("org/tiny", "config.json", revision="nope", cache_dir=tmp_path, endpoint=hub.endpoint)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("org/tiny", "absent.json", cache_dir=tmp_path, endpoint=hub.endpoint)


def test_offline_lookups_use_only_the_cache(hub: HubStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add_repo("org/tiny", FILES)
    cached = snapshot_download("org/tiny", cache_dir=tmp_path / "warm", endpoint=hub.endpoint)
    before = len(hub.requests)

    with pytest.raises(LocalEntryNotFoundError):
        snapshot_download("org/tiny", cache_dir=tmp_path / "cold", endpoint=hub.endpoint, local_files_only=True)
    assert snapshot_download("org/tiny", cache_dir=tmp_path / "warm", local_files_only=True) == cached
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(LocalEntryNotFoundError):
        snapshot_download("org/tiny", cache_dir=tmp_path / "cold", endpoint=hub.endpoint)
    assert snapshot_download("org/tiny", cache_dir=tmp_path / "warm", endpoint=hub.endpoint) == cached
    assert hub.requests[before:] == []


def test_patched_constants_route_calls_without_endpoint(hub: HubStandin, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other way in: patch ENDPOINT *and* the URL template (ENDPOINT alone sends files to huggingface.co)."""
    sha = hub.add_repo("solo", FILES)
    constants = huggingface_hub.constants
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )

    assert Path(snapshot_download("solo")).name == sha
    assert HfApi().model_info("solo").sha == sha
    assert ("GET", f"/solo/resolve/{sha}/config.json") in hub.requests
