"""`crucible.init` and `Run`: report a training run that runs outside Crucible (TRL, verl, a team's own loop).

A run is created through the API (`POST /api/v1/external-runs/`, an API token with the `launch` scope) and then
reports through the same ingest endpoint, reporter and spool on disk as Crucible's own Ray jobs
(`workers.reporting`): metrics and events are batched, retried, and kept on disk until the control plane has
stored them, so a restarted web server loses nothing, and a process killed during an outage leaves them to the
next reporter on the machine, which replays them. Trajectories go up as a JSONL file of the stored format
(`workers.trajectories`) and are run through Crucible's trajectory detectors here, on the trainer's machine; their
flags reach the review queue like a native run's.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from pydantic import ValidationError

from workers.detectors.registry import default_detector_config, run_detectors
from workers.reporting import DEFAULT_OUTAGE_SECONDS, Reporter, report_flags
from workers.spool import replay_spools, spool_dir
from workers.trajectories import Trajectory, describe_validation_error

DEFAULT_URL = "http://127.0.0.1:8000"
_RECORD_EXTRAS = ("reward", "terms", "completion_tokens", "step", "messages")
"""Keys a logged trajectory may carry beside the stored format: its reward and terms, its token count, its step
and `messages` (OpenAI chat messages, read as `turns`)."""


class CrucibleError(RuntimeError):
    """The server refused a request (the message is its reason), or could not be reached for too long."""


def init(
    project: str,
    name: str = "",
    config: Mapping[str, Any] | None = None,
    *,
    base_model: str = "",
    tags: Iterable[str] = (),
    url: str | None = None,
    token: str | None = None,
    outage_seconds: float | None = None,
) -> Run:
    """Create a run in Crucible for a training run happening here, and return it to report through.

    `url` and `token` default to `CRUCIBLE_URL` and `CRUCIBLE_TOKEN` (the CLI's). `base_model` is what the run
    fine-tunes (a Hub id, a path or a built-in name): evals of its checkpoints and the run page name it."""
    base = (url or os.environ.get("CRUCIBLE_URL") or DEFAULT_URL).rstrip("/")
    api_token = token or os.environ.get("CRUCIBLE_TOKEN", "")
    if not api_token:
        raise CrucibleError("no API token: pass token= or set CRUCIBLE_TOKEN (Settings → API tokens, scope launch)")
    outage = outage_seconds if outage_seconds is not None else _env_float("CRUCIBLE_INGEST_OUTAGE_SECONDS")
    body = {
        "project": project,
        "name": name,
        "config": json.loads(json.dumps(dict(config or {}), default=str)),  # any value: shown as text
        "base_model": base_model,
        "tags": list(tags),
        "client_id": str(uuid.uuid4()),  # a retried create returns the run the first attempt made
    }
    client = httpx.Client(timeout=30.0)
    reply = _with_retries(
        lambda: client.post(
            f"{base}/api/v1/external-runs/", json=body, headers={"Authorization": f"Bearer {api_token}"}
        ),
        outage,
        what="create the run",
    )
    created = reply.json()
    return Run(
        run_id=int(created["id"]),
        page_url=str(created["url"]),
        ingest_url=f"{base}/api/v1/runs/{created['id']}/ingest/",
        files_url=f"{base}/api/v1/runs/{created['id']}/ingest/files/",
        ingest_token=str(created["ingest_token"]),
        outage_seconds=outage,
        client=client,
    )


class Run:
    """One external run: `log`, `log_trajectories`, `log_checkpoint`, then `finish` (or use it as a context
    manager: an exception inside fails the run with its message)."""

    def __init__(
        self,
        *,
        run_id: int,
        page_url: str,
        ingest_url: str,
        files_url: str,
        ingest_token: str,
        outage_seconds: float = DEFAULT_OUTAGE_SECONDS,
        client: httpx.Client | None = None,
        detectors: Mapping[str, Any] | None = None,
    ) -> None:
        self.id, self.url = run_id, page_url
        self._files_url, self._token = files_url, ingest_token
        self._client = client or httpx.Client(timeout=30.0)
        self._outage = outage_seconds
        self._detectors = detectors if detectors is not None else default_detector_config()
        directory = spool_dir()
        # What an earlier process on this machine left unsent (killed during an outage) goes first, in the background.
        threading.Thread(target=replay_spools, args=(directory,), name="crucible-sdk-replay", daemon=True).start()
        self._reporter = Reporter(
            ingest_url=ingest_url, token=ingest_token, spool_dir=directory, outage_seconds=outage_seconds
        )
        self._step = 0
        self._finished = False

    # --- reporting ------------------------------------------------------------------------------------------------
    def log(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Scalar metrics at `step` (default: one past the last step logged). Values that are not finite numbers
        (NaN, None, text) are left out, so one bad value never drops the others."""
        step = self._next_step(step)
        values = {str(k)[:100]: float(v) for k, v in metrics.items() if _finite(v)}
        if values:
            self._reporter.metric(step, values)

    def log_trajectories(self, trajectories: Iterable[Mapping[str, Any]], step: int | None = None) -> str:
        """Sampled episodes in Crucible's stored format (`id`, `task_id`, `turns` or `messages`, ...) with their
        `reward`, `terms` (reward by term) and `completion_tokens`. They are checked here (a bad one is a
        ValueError naming it and its field; nothing is sent), uploaded as one file, listed on the run, and run
        through the trajectory detectors, whose flags go to the review queue. Returns the file's URI."""
        step = self._next_step(step, advance=False)
        records, extras = [], []
        for index, raw in enumerate(trajectories):
            record, extra = _split(dict(raw), index, step)
            try:
                Trajectory.model_validate(record)
            except ValidationError as exc:
                raise ValueError(
                    f"trajectory {index} ({record.get('id')!r}): {describe_validation_error(exc)}"
                ) from None
            records.append(record)
            extras.append(extra)
        if not records:
            return ""
        body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode()
        name = f"step-{step:08d}-{hashlib.sha256(body).hexdigest()[:16]}.jsonl"
        uri = str(self._upload(name, body)["uri"])
        for record, extra in zip(records, extras, strict=True):
            self._reporter.trajectory(
                trajectory_id=record["id"],
                task_id=str(record.get("task_id", "")),
                step=step,
                reward=extra.get("reward"),
                terms={k: float(v) for k, v in (extra.get("terms") or {}).items() if _finite(v)},
                num_turns=sum(1 for t in record.get("turns", []) if t.get("role") == "assistant"),
                completion_tokens=int(extra.get("completion_tokens") or 0),
                error=record.get("error"),
                storage_uri=uri,
            )
            report_flags(self._reporter, run_detectors(record, self._detectors), step=step)  # after its trajectory
        return uri

    def log_checkpoint(
        self, path_or_uri: str | os.PathLike[str], step: int, metrics: Mapping[str, float] | None = None
    ) -> str:
        """A checkpoint the trainer saved, as a model directory (config.json and weights: what TRL and any
        transformers Trainer write) by path or URI. Evals and gates load it from there, so it must be reachable
        from the Ray workers (a shared filesystem, or object storage)."""
        text = os.fspath(path_or_uri)
        uri = text if "://" in text else "file://" + str(Path(text).expanduser().resolve())
        if uri.startswith("file://") and not (Path(uri.removeprefix("file://")) / "config.json").is_file():
            raise ValueError(f"{text}: not a model directory (no config.json); log the folder the trainer saved")
        self._reporter.checkpoint(step, uri, {k: float(v) for k, v in (metrics or {}).items() if _finite(v)})
        return uri

    def summary(self, data: Mapping[str, Any]) -> None:
        """Figures about the whole run (shown in its summary table)."""
        self._reporter.summary(json.loads(json.dumps(dict(data), default=str)))

    def finish(self, error: str = "") -> None:
        """End the run: succeeded, or failed with `error`. Waits for every event to be stored (at most the outage
        window, then what is left stays in the spool for the next reporter on this machine)."""
        if self._finished:
            return
        self._finished = True
        self._reporter.end("failed" if error else "succeeded", error[:2000])
        self._reporter.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.finish(f"{kind.__name__}: {exc}" if kind is not None else "")

    # --- helpers --------------------------------------------------------------------------------------------------
    def _next_step(self, step: int | None, *, advance: bool = True) -> int:
        if step is None:
            step = self._step + (1 if advance else 0)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        self._step = max(self._step, step)
        return step

    def _upload(self, name: str, body: bytes) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": "application/x-ndjson"}
        reply = _with_retries(
            lambda: self._client.put(self._files_url + name, content=body, headers=headers),
            self._outage,
            what=f"upload {name}",
        )
        answer: dict[str, Any] = reply.json()
        return answer


def _split(raw: dict[str, Any], index: int, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the stored record, the event's extras) of one logged trajectory."""
    extra = {k: raw.pop(k) for k in _RECORD_EXTRAS if k in raw}
    if "messages" in extra and "turns" not in raw:
        raw["turns"] = [_turn(m) for m in extra.pop("messages")]
    raw.setdefault("id", f"step{step}-{index}-{uuid.uuid4().hex[:8]}")
    return raw, extra


def _turn(message: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message as a stored turn; an assistant message's first tool call becomes the turn's tool."""
    content = message.get("content") or ""
    turn: dict[str, Any] = {
        "role": str(message.get("role", "user")),
        "content": content if isinstance(content, str) else json.dumps(content),
    }
    calls = message.get("tool_calls") or []
    if calls:
        function = calls[0].get("function", {})
        arguments = function.get("arguments") or {}
        turn["tool"] = str(function.get("name", ""))
        turn["args"] = (
            json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else dict(arguments or {})
        )
    return turn


def _finite(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and value == value and abs(value) != float("inf")
    )


def _env_float(name: str) -> float:
    raw = os.environ.get(name, "")
    return float(raw) if raw.strip() else DEFAULT_OUTAGE_SECONDS


def _with_retries(send: Any, outage_seconds: float, *, what: str) -> httpx.Response:
    """`send()` until it answers below 500, retrying refused connections and 5xx answers with backoff for up to
    `outage_seconds` (a web server restarting); a 4xx is a CrucibleError with the server's reason."""
    deadline, wait = time.monotonic() + outage_seconds, 0.5
    while True:
        try:
            reply: httpx.Response = send()
            if reply.status_code < 500:
                if reply.status_code >= 400:
                    raise CrucibleError(f"could not {what}: {reply.status_code} {_reason(reply)}")
                return reply
            problem = f"{reply.status_code} {_reason(reply)}"
        except httpx.TransportError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if time.monotonic() + wait > deadline:
            raise CrucibleError(f"could not {what} within {outage_seconds:g} s: {problem}")
        time.sleep(wait)
        wait = min(wait * 2, 10.0)


def _reason(reply: httpx.Response) -> str:
    try:
        body = reply.json()
    except ValueError:
        return reply.text[:300]
    return json.dumps(body)[:500] if not isinstance(body, dict) or "detail" not in body else str(body["detail"])
