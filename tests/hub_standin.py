"""A local stand-in for the Hugging Face Hub's HTTP API, for tests that must never reach the internet.

`HubStandin` serves model repositories registered with `add_repo` from a `ThreadingHTTPServer` on 127.0.0.1, and
answers the requests that huggingface_hub 2.4's `snapshot_download`, `hf_hub_download` and
`HfApi.model_info`/`repo_info` make (and a plain `httpx.get` of a `/resolve/` URL)::

    GET  /api/models/{repo_id}                          model info of "main"  (`?blobs=true`: sizes and blob ids)
    GET  /api/models/{repo_id}/revision/{revision}      model info of a branch, tag or full commit sha
    GET  /api/models/{repo_id}/tree/{revision}[/{dir}]  tree listing (`?recursive=true`), one page, no Link header
    HEAD /{repo_id}/resolve/{revision}/{path}           file metadata: X-Repo-Commit, ETag, Content-Length
    GET  /{repo_id}/resolve/{revision}/{path}           file content, with the same headers

`repo_id` is `org/name` (or a bare `name`); revisions may be URL-quoted (the client sends `refs%2Fpr%2F1`).

What the client calls (huggingface_hub 2.4):

- `snapshot_download(repo, revision=r)`: `GET /api/models/{repo}/revision/{r}` (skipped when `r` is a 40-hex sha),
  then `GET /api/models/{repo}/tree/{sha}?recursive=true&expand=false` unless `<cache>/models--org--name/trees/
  {sha}.json` is already cached, then `hf_hub_download(revision=sha)` per file. A file already in
  `snapshots/{sha}/` makes no request at all, so a second snapshot_download with the same cache makes exactly one
  request (the model info) and no HEAD or GET under `/resolve/`.
- `hf_hub_download(repo, name, revision=r)`: `HEAD /{repo}/resolve/{r}/{name}` (no redirect here, so the download
  URL is the same) and, when the blob `blobs/{etag}` is not cached, `GET` of the same URL. Range is only sent to
  resume a broken download and a 200 answer is accepted, so Range is not supported. No X-Xet-Hash header is sent,
  so hf_xet is never used.
- `HfApi().model_info(repo, revision=r, files_metadata=True)`: `GET /api/models/{repo}/revision/{r}?blobs=true`
  (`GET /api/models/{repo}?blobs=true` when no revision is given).

Errors are answered like the real Hub, and hf_raise_for_status maps them by X-Error-Code:

- unknown repo: 404, `X-Error-Code: RepoNotFound` -> `RepositoryNotFoundError`;
- gated repo, file requested without `Authorization: Bearer <token>`: 401 (or 403 for a wrong token),
  `X-Error-Code: GatedRepo` -> `GatedRepoError` (a subclass of `RepositoryNotFoundError`). As on the real Hub, the
  model info and tree of a gated repo are public: only `/resolve/` is gated;
- unknown revision: 404, `X-Error-Code: RevisionNotFound` -> `RevisionNotFoundError`;
- missing file: 404, `X-Error-Code: EntryNotFound` and `X-Repo-Commit` -> `RemoteEntryNotFoundError` (a subclass of
  both `HfHubHTTPError` and `EntryNotFoundError`).

Pointing huggingface_hub at the stand-in: the library reads its environment once, at import time
(`constants.ENDPOINT`, `constants.HUGGINGFACE_CO_URL_TEMPLATE`, `HF_HUB_OFFLINE`, `HF_HUB_DISABLE_TELEMETRY`), so
setting `HF_ENDPOINT` after import changes nothing. What works at call time:

- pass `endpoint=hub.endpoint` to `snapshot_download`, `hf_hub_download` and `HfApi(endpoint=...)` (product code
  that reads `os.environ["HF_ENDPOINT"]` at call time must pass it on like this); or
- monkeypatch both `constants.ENDPOINT` and `constants.HUGGINGFACE_CO_URL_TEMPLATE` (to
  `hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"`). Patching `ENDPOINT` alone is not enough:
  `hf_hub_url` builds file URLs from the template, so `hf_hub_download` would still go to huggingface.co, even
  with `endpoint=` (it only swaps a URL prefix equal to `constants.ENDPOINT`).

Also monkeypatch `constants.HF_HUB_DISABLE_TELEMETRY = True` (the env var is read at import; with telemetry on, the
first request builds a user agent that fetches `{constants.ENDPOINT}/api/agent-harnesses` once per process) and
`constants.HF_HUB_DISABLE_IMPLICIT_TOKEN = True` (so no locally saved token is sent). Offline mode is the same:
`HF_HUB_OFFLINE=1` set after import is ignored (requests are still made); `constants.HF_HUB_OFFLINE = True` makes
every request raise `OfflineModeIsEnabled`, and then `snapshot_download`/`hf_hub_download` return what is cached or
raise `LocalEntryNotFoundError`, as `local_files_only=True` does. See
tests/workers/test_hub_standin.py for a fixture that does this and refuses any connection off 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_DATE = "2024-01-01T00:00:00.000Z"


class OffLoopbackConnection(RuntimeError):
    """Raised instead of connecting off 127.0.0.1 (not an OSError, so no client retries or falls back on it)."""


def isolate_hub_client(monkeypatch: Any, cache: Path) -> list[object]:
    """Refuse every lookup and connection off 127.0.0.1 for the rest of the test, and configure huggingface_hub's
    import-time constants as a worker started with `HF_HUB_DISABLE_TELEMETRY=1` would have them (no telemetry, no
    locally saved token, online, `cache` as its default cache). Returns the list of refused attempts: a test
    asserts it stays empty."""
    from huggingface_hub import constants

    refused: list[object] = []
    getaddrinfo, connect = socket.getaddrinfo, socket.socket.connect

    def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in LOOPBACK:
            refused.append(host)
            raise OffLoopbackConnection(f"lookup of {host!r}")
        return getaddrinfo(host, *args, **kwargs)

    def guarded_connect(self: socket.socket, address: Any) -> None:
        if isinstance(address, tuple) and address[0] not in LOOPBACK:
            refused.append(address)
            raise OffLoopbackConnection(f"connection to {address!r}")
        connect(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return refused


_ROUTE_WORDS = {"revision", "tree", "resolve"}


@dataclass
class _Repo:
    gated: bool = False
    token: str | None = None
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag name -> commit sha
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit sha -> {path: content}


class _HubError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def _blob_id(content: bytes) -> str:
    """The git blob sha1 of a file, which the Hub uses as the ETag of a file not stored with LFS."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[-1].lower() in ("1", "true")


class HubStandin:
    """A local Hub serving registered model repositories; use as `with HubStandin() as hub:`."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []  # (method, URL-decoded path without the query), in order
        self._repos: dict[str, _Repo] = {}
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("HubStandin is not running; use it as a context manager")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubStandin:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.hub = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-standin", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def add_repo(
        self,
        repo_id: str,
        files_dir: Path | dict[str, bytes],
        *,
        revision: str = "main",
        gated: bool = False,
        token: str | None = None,
    ) -> str:
        """Register `revision` (a branch or tag) of model `repo_id` holding the given files; return its commit sha.

        `files_dir` is a directory (its files, recursively, by relative path) or a `{path: content}` mapping. The
        sha is the sha1 of the repo id, revision and files, so it is deterministic. Another call for the same repo
        adds (or replaces) a revision; `gated` and `token` apply to the whole repo, the latest call wins.
        """
        if isinstance(files_dir, dict):
            files = dict(files_dir)
        else:
            files = {p.relative_to(files_dir).as_posix(): p.read_bytes() for p in files_dir.rglob("*") if p.is_file()}
        digest = hashlib.sha1(f"{repo_id}\0{revision}\0".encode())
        for path in sorted(files):
            digest.update(b"%s\0%d\0%s" % (path.encode(), len(files[path]), files[path]))
        sha = digest.hexdigest()
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo())
            repo.gated, repo.token = gated, token
            repo.refs[revision] = sha
            repo.commits[sha] = dict(sorted(files.items()))
        return sha

    # The handler calls the methods below; they raise _HubError for an error answer.

    def _log(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))

    def _split_repo_id(self, segments: list[str]) -> tuple[str, list[str]]:
        """Split `[org, name, *rest]` or `[name, *rest]` into the repo id and the rest, preferring known repos."""
        with self._lock:
            known = set(self._repos)
        two = "/".join(segments[:2])
        if len(segments) >= 2 and (two in known or (segments[0] not in known and segments[1] not in _ROUTE_WORDS)):
            return two, segments[2:]
        return (segments[0] if segments else ""), segments[1:]

    def _commit(self, repo_id: str, revision: str, authorization: str | None, *, gate: bool) -> tuple[str, _Repo]:
        with self._lock:
            repo = self._repos.get(repo_id)
        if repo is None:
            raise _HubError(404, "RepoNotFound", "Repository not found")
        if gate and repo.gated and (repo.token is None or authorization != f"Bearer {repo.token}"):
            status = 401 if authorization is None else 403
            message = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            raise _HubError(status, "GatedRepo", message)
        sha = revision if revision in repo.commits else repo.refs.get(revision)
        if sha is None:
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha, repo

    def _model_info(self, repo_id: str, revision: str, blobs: bool) -> dict[str, object]:
        sha, repo = self._commit(repo_id, revision, None, gate=False)
        files = repo.commits[sha]
        siblings: list[dict[str, object]] = []
        for path, content in files.items():
            sibling: dict[str, object] = {"rfilename": path}
            if blobs:
                sibling.update(size=len(content), blobId=_blob_id(content))
            siblings.append(sibling)
        return {
            "_id": sha[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0] if "/" in repo_id else None,
            "sha": sha,
            "lastModified": _DATE,
            "createdAt": _DATE,
            "private": False,
            "disabled": False,
            "gated": "manual" if repo.gated else False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(len(c) for c in files.values()),
        }

    def _tree(self, repo_id: str, revision: str, directory: str, recursive: bool) -> list[dict[str, object]]:
        sha, repo = self._commit(repo_id, revision, None, gate=False)
        files = repo.commits[sha]
        prefix = f"{directory.strip('/')}/" if directory.strip("/") else ""
        if prefix and not any(path.startswith(prefix) for path in files):
            raise _HubError(404, "EntryNotFound", f"{directory} does not exist on {revision}", {"X-Repo-Commit": sha})
        entries: dict[str, dict[str, object]] = {}
        for path, content in files.items():
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix) :].split("/")
            for depth in range(1, len(parts)) if recursive else range(1, min(len(parts), 2)):
                folder = prefix + "/".join(parts[:depth])
                oid = hashlib.sha1(f"{sha}\0{folder}".encode()).hexdigest()
                entries.setdefault(folder, {"type": "directory", "oid": oid, "path": folder})
            if recursive or len(parts) == 1:
                entries[path] = {"type": "file", "oid": _blob_id(content), "size": len(content), "path": path}
        return list(entries.values())

    def _file(self, repo_id: str, revision: str, path: str, authorization: str | None) -> tuple[str, bytes]:
        sha, repo = self._commit(repo_id, revision, authorization, gate=True)
        content = repo.commits[sha].get(path)
        if content is None:
            raise _HubError(404, "EntryNotFound", f"{path} does not exist on {revision}", {"X-Repo-Commit": sha})
        return sha, content


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: HubStandin


class _Handler(BaseHTTPRequestHandler):
    server_version = "HubStandin/1.0"

    def do_GET(self) -> None:  # the names http.server dispatches to
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output quiet; hub.requests is the log

    def _dispatch(self) -> None:
        hub = cast(_Server, self.server).hub
        url = urlsplit(self.path)
        segments = [unquote(s) for s in url.path.split("/")[1:]]
        query = parse_qs(url.query)
        hub._log(self.command, "/" + "/".join(segments))
        try:
            if segments[:2] == ["api", "models"] and self.command == "GET":
                repo_id, rest = hub._split_repo_id(segments[2:])
                if not rest:
                    self._send_json(hub._model_info(repo_id, "main", _flag(query, "blobs")))
                elif rest[0] == "revision" and len(rest) == 2:
                    self._send_json(hub._model_info(repo_id, rest[1], _flag(query, "blobs")))
                elif rest[0] == "tree" and len(rest) >= 2:
                    self._send_json(hub._tree(repo_id, rest[1], "/".join(rest[2:]), _flag(query, "recursive")))
                else:
                    raise _HubError(404, "", "Not found")
                return
            repo_id, rest = hub._split_repo_id(segments)
            if len(rest) < 3 or rest[0] != "resolve":
                raise _HubError(404, "", "Not found")
            sha, content = hub._file(repo_id, rest[1], "/".join(rest[2:]), self.headers.get("Authorization"))
            headers = {"X-Repo-Commit": sha, "ETag": f'"{_blob_id(content)}"'}
            self._send(200, content, "application/octet-stream", headers)
        except _HubError as error:
            headers = {"X-Error-Message": error.message, **error.headers}
            if error.code:
                headers["X-Error-Code"] = error.code
            self._send(error.status, json.dumps({"error": error.message}).encode(), "application/json", headers)

    def _send_json(self, data: object) -> None:
        self._send(200, json.dumps(data).encode(), "application/json", {})

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
