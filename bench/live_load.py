"""Load: 20 browser viewers on live runs while 4 workers ingest, for 10 minutes (issue 16).

    python bench/live_load.py [--minutes 10] [--viewers 20] [--workers 4]

One daphne (the ASGI server `make run` starts) on loopback, a fresh PostgreSQL database `crucible_load`, Redis db 11.
Each worker is a real `workers.reporting.Reporter` feeding its own run at about 20 metric events/s (plus a log line
per second); the viewers are websocket clients spread over the runs (5 per run with the defaults), each checking
that it sees every metric event exactly once, in any order (by the sequence numbers the worker gave them).

Printed and written to bench/results/live_load.txt:
  latency      worker event made -> chart frame in a viewer: p50, p99, max (ms), over every delivery
  dropped      events a viewer never received (sequence-checked against what the workers sent and the server
               stored); duplicates: events a viewer received twice
  web RSS      the daphne process's resident memory after warm-up (1 minute) and at the end, and the growth
  load         the machine's load average at the start and end (2 shared cores: read the figures with it)
Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402

PG = os.environ.get("CRUCIBLE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
os.environ["DATABASE_URL"] = f"{PG}/crucible_load"
os.environ["REDIS_URL"] = os.environ.get("CRUCIBLE_BENCH_REDIS", "redis://127.0.0.1:6379/11")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("DJANGO_DEBUG", "0")  # as deployed: DEBUG keeps every query in memory (up to 9,000 each)
os.environ.setdefault("DJANGO_HTTPS", "0")  # served over plain http on loopback here

import logging  # noqa: E402

import psycopg  # noqa: E402

from controlplane import devstack  # noqa: E402

logging.getLogger("httpx").setLevel(logging.WARNING)


def recreate_database(name: str) -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def setup(runs: int) -> dict[str, object]:
    import django

    django.setup()
    from django.contrib.sessions.backends.db import SessionStore
    from django.core.management import call_command

    from apps.accounts.models import User
    from apps.runs.models import Run
    from apps.runs.services import ingest_token_for

    call_command("migrate", verbosity=0)
    user = User.objects.create_user(username="load", password="load-password", role="viewer")
    created = [Run.objects.create(kind="rescore", spec={}, created_by=user, ingest_nonce=f"l{i}") for i in range(runs)]
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.create()
    return {"runs": [(r.pk, ingest_token_for(r)) for r in created], "session": session.session_key}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Worker(threading.Thread):
    """A job's reporter: `rate` metric events per second carrying the time they were made, a log line a second."""

    def __init__(self, base: str, run: tuple[int, str], rate: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.run_id, self.token = run
        self.url = f"{base}/api/v1/runs/{self.run_id}/ingest/"
        self.rate = rate
        self.stop_event = stop
        self.metric_seqs: list[int] = []

    def run(self) -> None:
        from workers.reporting import Reporter

        reporter = Reporter(ingest_url=self.url, token=self.token, flush_seconds=0.1)
        step = 0
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            step += 1
            self.metric_seqs.append(reporter.metric(step, {"sent_at": time.time()}))
            if step % max(1, int(self.rate)) == 0:
                reporter.log(f"step {step}")
            next_at += 1 / self.rate
            time.sleep(max(0.0, next_at - time.monotonic()))
        reporter.close()


async def viewer(ws_base: str, base: str, run_id: int, session: str, stats: dict, stop: asyncio.Event) -> None:  # type: ignore[type-arg]
    import websockets

    headers = {"Cookie": f"sessionid={session}", "Origin": base}
    seen: dict[int, int] = {}
    async with websockets.connect(f"{ws_base}/ws/runs/{run_id}/", additional_headers=headers, max_size=None) as ws:
        await ws.send(json.dumps({"type": "resume", "after": 0}))
        while not stop.is_set():
            try:
                frame = await asyncio.wait_for(ws.recv(), timeout=1.0)
            except TimeoutError:
                continue
            if not isinstance(frame, str) or not frame.startswith("{"):
                continue
            now = time.time()
            body = json.loads(frame)
            for step, sent in body.get("series", {}).get("sent_at", []):
                seen[int(step)] = seen.get(int(step), 0) + 1
                if stats["measuring"]:
                    stats["latencies"].append((now - sent) * 1000)
        # drain what is still in flight after the workers stopped
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                frame = await asyncio.wait_for(ws.recv(), timeout=1.0)
            except TimeoutError:
                break
            if isinstance(frame, str) and frame.startswith("{"):
                for step, _ in json.loads(frame).get("series", {}).get("sent_at", []):
                    seen[int(step)] = seen.get(int(step), 0) + 1
    stats["seen"].append((run_id, seen))


async def main_async(args: argparse.Namespace, prepared: dict[str, object]) -> None:
    runs: list[tuple[int, str]] = prepared["runs"]  # type: ignore[assignment]
    session = str(prepared["session"])
    port = devstack.free_port()
    base, ws_base = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}"
    var = ROOT / "var" / "bench-load"
    env = {**os.environ, "CRUCIBLE_LOG_LEVEL": "WARNING"}
    with devstack.ProcessGroup(var / "log") as procs:
        web = procs.start(
            "daphne",
            [str(ROOT / ".venv/bin/daphne"), "-b", "127.0.0.1", "-p", str(port), "controlplane.asgi:application"],
            env=env,
        )
        devstack.wait_for_port("127.0.0.1", port, timeout=60)
        load_start = os.getloadavg()
        stats: dict = {"latencies": [], "seen": [], "measuring": False}  # type: ignore[type-arg]
        stop_viewers = asyncio.Event()
        viewers = [
            asyncio.create_task(viewer(ws_base, base, runs[i % len(runs)][0], session, stats, stop_viewers))
            for i in range(args.viewers)
        ]
        await asyncio.sleep(2)
        stop_workers = threading.Event()
        workers = [Worker(base, run, args.rate, stop_workers) for run in runs]
        for w in workers:
            w.start()
        warmup = min(60.0, args.minutes * 60 / 5)
        await asyncio.sleep(warmup)
        stats["measuring"] = True
        rss_start = rss_mb(web.pid)
        print(f"warm after {warmup:.0f}s: web RSS {rss_start:.0f} MB; measuring for {args.minutes} min", flush=True)
        await asyncio.sleep(args.minutes * 60 - warmup)
        stats["measuring"] = False
        stop_workers.set()
        for w in workers:
            await asyncio.to_thread(w.join)
        rss_end = rss_mb(web.pid)
        stop_viewers.set()
        await asyncio.gather(*viewers)
        load_end = os.getloadavg()

    sent = {w.run_id: len(w.metric_seqs) for w in workers}
    dropped = duplicates = deliveries = 0
    for run_id, seen in stats["seen"]:
        expected = set(range(1, sent[run_id] + 1))
        dropped += len(expected - set(seen))
        duplicates += sum(count - 1 for count in seen.values() if count > 1)
        deliveries += sum(seen.values())
    lat = sorted(stats["latencies"])

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(len(lat) * q))] if lat else float("nan")

    lines = [
        f"bench/live_load.py, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, {args.minutes} min, "
        f"{args.viewers} viewers, {args.workers} workers at {args.rate:.0f} metric events/s each",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| events sent (metric) | {sum(sent.values()):,} |",
        f"| deliveries to viewers | {deliveries:,} |",
        f"| worker -> browser latency | p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms, max {pct(1.0):.0f} ms |",
        f"| dropped / duplicated websocket messages | {dropped} / {duplicates} |",
        f"| web RSS after warm-up -> end | {rss_start:.0f} MB -> {rss_end:.0f} MB ({rss_end - rss_start:+.0f} MB) |",
        f"| load average (1 min) start -> end | {load_start[0]:.2f} -> {load_end[0]:.2f} |",
    ]
    text = "\n".join(lines) + "\n"
    out = ROOT / "bench" / "results" / ("live_load.txt" if args.minutes >= 10 else "live_load-short.txt")
    out.write_text(text)
    print("\n" + text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--viewers", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20.0, help="metric events per second per worker")
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)
    recreate_database("crucible_load")
    asyncio.run(main_async(args, setup(runs=args.workers)))


if __name__ == "__main__":
    main()
