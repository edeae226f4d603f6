"""The reporter's spool on disk: every event a reporter makes, appended as it is made and acknowledged once the
control plane stored it (`Spool`), and the replay of what a killed reporter left unacknowledged (`replay_spools`,
with the same sequence numbers, so the control plane keeps exactly one copy). `workers.reporting` holds the
reporter that writes it and describes the delivery guarantees.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import time
import uuid
from pathlib import Path
from typing import IO, Any

import httpx

log = logging.getLogger(__name__)

DEFAULT_MAX_SPOOL_BYTES = 512 * 1024 * 1024


def spool_dir() -> Path:
    """Where reporters on this node spool unacknowledged events (CRUCIBLE_SPOOL_DIR; ~/.crucible/spool)."""
    configured = os.environ.get("CRUCIBLE_SPOOL_DIR")
    return Path(configured) if configured else Path.home() / ".crucible" / "spool"


class Spool:
    """One reporter's events on disk: a header line, one line per event as it is made, and `ack` lines for what
    the control plane stored. The reporter holds an exclusive lock on the file while it lives, so a replay never
    touches a spool whose reporter is still running."""

    def __init__(self, directory: Path, *, ingest_url: str, token: str, max_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = re.sub(r"[^A-Za-z0-9]+", "-", ingest_url).strip("-")[-80:]
        name = f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        # Made under a name replay ignores, locked, given its header, then renamed: a replay running beside a new
        # reporter never sees an unlocked or empty spool (the lock belongs to the file, so it survives the rename).
        staging = directory / f"{name}.new"
        fd = os.open(staging, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        self._file: IO[str] = os.fdopen(fd, "a", encoding="utf-8")
        fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._header = json.dumps({"ingest_url": ingest_url, "token": token, "pid": os.getpid()}) + "\n"
        self._file.write(self._header)
        self._file.flush()
        self.path = directory / f"{name}.jsonl"
        os.rename(staging, self.path)
        self.max_bytes = max_bytes
        self.size = len(self._header)
        self.overflowed = 0

    def add(self, event: dict[str, Any]) -> None:
        line = json.dumps(event) + "\n"
        if self.size + len(line) > self.max_bytes:
            if self.overflowed == 0:
                log.warning(
                    "event spool %s is over %d bytes: further events are kept in memory only", self.path, self.max_bytes
                )
            self.overflowed += 1
            return
        self._file.write(line)
        self._file.flush()  # to the OS at once: a SIGKILL right after loses nothing (fsync waits for sync())
        self.size += len(line)

    def ack(self, seqs: list[int]) -> None:
        line = json.dumps({"ack": ranges(seqs)}) + "\n"
        self._file.write(line)
        self.size += len(line)

    def sync(self) -> None:
        """To the OS (a killed process loses nothing) and to the disk (a lost machine loses little)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def reset(self) -> None:
        """Everything made so far is stored: start the file again from its header."""
        self._file.flush()
        os.truncate(self.path, len(self._header))
        self.size = len(self._header)

    def release(self) -> None:
        """Keep the file for a replay; closing it drops the lock."""
        self._file.flush()
        self._file.close()

    def remove(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


def ranges(seqs: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for seq in sorted(seqs):
        if out and seq == out[-1][1] + 1:
            out[-1][1] = seq
        else:
            out.append([seq, seq])
    return out


SPOOL_MAX_AGE_SECONDS = 7 * 24 * 3600


def replay_spools(
    directory: Path,
    *,
    client: httpx.Client | None = None,
    chunk: int = 1000,
    max_age: float = SPOOL_MAX_AGE_SECONDS,
) -> dict[str, int]:
    """Send what dead reporters left unacknowledged in `directory`; returns counts (files, events, left).

    A spool whose reporter still runs is locked and skipped. A spool the control plane refuses for good (the run
    was deleted, the token is not its run's) is removed with an error line; one it cannot reach yet stays for the
    next replay, up to `max_age` seconds (a week) after it was last written: then it is removed with an error line
    (its control plane is gone for good). The control plane keeps one copy per (run, seq), so replaying what it
    already has is harmless."""
    counts = {"files": 0, "events": 0, "left": 0}
    if not directory.is_dir():
        return counts
    own_client = client is None
    http = client or httpx.Client(timeout=30.0)
    try:
        for path in sorted(directory.glob("*.jsonl")):
            counts["files"] += 1
            try:
                if time.time() - path.stat().st_mtime > max_age and _unlocked(path):
                    log.error(
                        "spool %s is older than %.0f days; its control plane never came back; removed",
                        path,
                        max_age / 86400,
                    )
                    path.unlink(missing_ok=True)
                    continue
                sent = _replay_one(path, http, chunk)
            except (OSError, ValueError) as exc:
                log.error("spool %s could not be replayed: %s", path, exc)
                counts["left"] += 1
                continue
            if sent is None:
                counts["left"] += 1
            else:
                counts["events"] += sent
    finally:
        if own_client:
            http.close()
    return counts


def _unlocked(path: Path) -> bool:
    with open(path, encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True


def _replay_one(path: Path, http: httpx.Client, chunk: int) -> int | None:
    with open(path, encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # its reporter is alive
        lines = handle.read().splitlines()
    if not lines:
        path.unlink(missing_ok=True)
        return 0
    header = json.loads(lines[0])
    events: dict[int, dict[str, Any]] = {}
    acked: set[int] = set()
    for line in lines[1:]:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the kill
        if "ack" in record:
            acked.update(seq for lo, hi in record["ack"] for seq in range(lo, hi + 1))
        else:
            events[record["seq"]] = record
    unsent = [events[seq] for seq in sorted(events) if seq not in acked]
    headers = {"Authorization": f"Bearer {header['token']}"}
    for start in range(0, len(unsent), chunk):
        try:
            response = http.post(header["ingest_url"], json={"events": unsent[start : start + chunk]}, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("spool %s: the control plane did not answer (%s); kept for the next replay", path, exc)
            return None
        if response.status_code >= 500 or response.status_code in (408, 429):
            return None
        if response.status_code >= 300:
            log.error("spool %s refused (%d): %s; removed", path, response.status_code, response.text[:300])
            break
    path.unlink(missing_ok=True)
    if unsent:
        log.info("replayed %d events a killed reporter left in %s", len(unsent), path)
    return len(unsent)
