"""Ingest throughput and latency: Crucible beside the MLflow tracking server, in one run, on this machine.

    python bench/ingest_vs_mlflow.py [--quick] [--rounds N] [--web-workers N]

Both servers run on loopback with PostgreSQL backends (fresh databases `crucible_bench` and `mlflow_bench`), each
as its production deployment runs it: Crucible under uvicorn with --web-workers processes (default 2, as
docker-compose.yml's CRUCIBLE_WEB_WORKERS) and DEBUG off; MLflow's `mlflow server` with its default 4 workers.
MLflow lives in its own virtualenv (/tmp/mlflow-bench-venv, created on first use) and is driven by
bench/_mlflow_client.py inside that virtualenv. The throughput measures run in alternating rounds (Crucible, MLflow,
MLflow, Crucible, ...); each row is the median of the rounds with the spread (min-max) and the ratio of medians.
Written to bench/results/latest.txt with the load average. Nothing here asserts on time.

What is measured (points = metric values persisted in PostgreSQL):
  batched x1   one client, batches of 1,000 points (Crucible: 1,000 metric events of one value each, so every
               point is also an event in the ingest ledger and is published to the run's websocket group)
  batched x4   four clients in parallel, each to its own run
  x4 encoded   the same, every request body encoded before the clock starts, on both sides (MLflow: the REST
               API's runs/log-batch with the body as its client would send it): the servers' throughput, without
               the load generator (four threads of one Python process, building 1,000-point batches) taking the
               cores and the GIL
  single       one point per HTTP request, one client
  read 100k    one metric's 100k-point series: Crucible's downsampled read (<= 1,000 buckets, min/mean/max)
               vs MLflow's get_metric_history (the full series)
  ws latency   worker POST -> chart frame in 20 open websocket viewers (p50/p99); MLflow has no live push
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402

PG = "postgresql://postgres@127.0.0.1:5432"
os.environ["DATABASE_URL"] = f"{PG}/crucible_bench"
os.environ["REDIS_URL"] = "redis://127.0.0.1:6379/12"
# The production settings that matter for speed (DEBUG off: no query log), plain http on loopback. The secret is set
# here, before Django loads, because run ingest tokens are signed with it on this side and checked by the server.
os.environ.update(DJANGO_DEBUG="0", DJANGO_HTTPS="0", DJANGO_SECRET_KEY="bench-only-" + "x" * 50)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
MLFLOW_VENV = Path("/tmp/mlflow-bench-venv")

import logging  # noqa: E402

import httpx  # noqa: E402
import psycopg  # noqa: E402

from controlplane import devstack  # noqa: E402

logging.getLogger("httpx").setLevel(logging.WARNING)


def recreate_database(name: str) -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def ensure_mlflow_venv() -> Path:
    python = MLFLOW_VENV / "bin" / "python"
    if not (MLFLOW_VENV / "bin" / "mlflow").exists():
        print("creating the MLflow virtualenv (one time)...", flush=True)
        subprocess.run(["python3.11", "-m", "venv", str(MLFLOW_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "mlflow", "psycopg2-binary"], check=True)
    return python


def setup_crucible(runs: int) -> dict[str, object]:
    import django

    django.setup()
    from django.contrib.sessions.backends.db import SessionStore
    from django.core.management import call_command

    from apps.accounts.models import User
    from apps.accounts.services import api_token_create
    from apps.runs.models import Run
    from apps.runs.services import ingest_token_for

    call_command("migrate", verbosity=0)
    user = User.objects.create_user(username="bench", password="bench-password", role="operator")
    _, api_token = api_token_create(user=user, name="bench", scopes=["read", "launch"])
    created = [Run.objects.create(kind="rescore", spec={}, created_by=user, ingest_nonce=f"n{i}") for i in range(runs)]
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.create()
    return {
        "runs": [(r.pk, ingest_token_for(r)) for r in created],
        "api_token": api_token,
        "session": session.session_key,
    }


def metric_events(start_seq: int, count: int, step0: int, name: str = "loss") -> list[dict[str, object]]:
    return [
        {"seq": start_seq + i, "kind": "metric", "step": step0 + i, "values": {name: 0.5 + (i % 97) / 1000}}
        for i in range(count)
    ]


def crucible_batched(
    base: str, runs: list[tuple[int, str]], batches: int, size: int = 1000, *, pre_encoded: bool = False
) -> float:
    """Points/s of `len(runs)` clients in parallel, each POSTing `batches` batches of `size` points to its own run.
    By default each batch is built and encoded in the timed loop, as MLflow's client does its batches; with
    `pre_encoded` every body is encoded before the clock starts (as `_mlflow_client.batched_raw` does MLflow's): the
    servers' throughput, without the load generator's JSON work competing for the cores."""
    errors: list[str] = []

    def body(b: int) -> bytes:
        return json.dumps({"events": metric_events(b * size + 1, size, b * size)}).encode()

    ready = {run_id: [body(b) for b in range(batches)] for run_id, _ in runs} if pre_encoded else {}

    def client(run_id: int, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        with httpx.Client(headers=headers, timeout=120) as http:
            for b in range(batches):
                content = ready[run_id][b] if pre_encoded else body(b)
                response = http.post(f"{base}/api/v1/runs/{run_id}/ingest/", content=content)
                if response.status_code != 200:
                    errors.append(f"{response.status_code} {response.text[:200]}")
                    return

    threads = [threading.Thread(target=client, args=run) for run in runs]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise SystemExit(f"ingest refused a batch: {errors[0]}")
    return len(runs) * batches * size / elapsed


def crucible_single(base: str, run: tuple[int, str], count: int) -> float:
    run_id, token = run
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        started = time.perf_counter()
        for i in range(count):
            http.post(
                f"{base}/api/v1/runs/{run_id}/ingest/", json={"events": metric_events(i + 1, 1, i, name="single")}
            ).raise_for_status()
        return count / (time.perf_counter() - started)


def crucible_read(base: str, run_id: int, api_token: str, repeats: int = 7) -> tuple[float, int]:
    times = []
    with httpx.Client(headers={"Authorization": f"Bearer {api_token}"}, timeout=60) as http:
        for _ in range(repeats):
            started = time.perf_counter()
            body = http.get(f"{base}/api/v1/runs/{run_id}/metrics/", params={"name": "loss", "max_points": 1000})
            body.raise_for_status()
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, len(body.json()["steps"])


async def websocket_latency(
    ws_base: str, base: str, run: tuple[int, str], session: str, viewers: int, events: int
) -> tuple[float, float, int]:
    import websockets

    run_id, token = run
    latencies: list[float] = []
    headers = {"Cookie": f"sessionid={session}", "Origin": base}
    sockets = [
        await websockets.connect(f"{ws_base}/ws/runs/{run_id}/", additional_headers=headers) for _ in range(viewers)
    ]
    done = asyncio.Event()

    async def viewer(socket) -> None:  # type: ignore[no-untyped-def]
        seen = 0
        while seen < events:
            frame = await socket.recv()
            if isinstance(frame, str) and frame.startswith("{"):
                now = time.time()
                for _, sent in json.loads(frame)["series"].get("sent_at", []):
                    latencies.append((now - sent) * 1000)
                    seen += 1

    tasks = [asyncio.create_task(viewer(s)) for s in sockets]
    await asyncio.sleep(0.5)

    def post_events() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            for i in range(events):
                event = {"seq": 10_000_000 + i, "kind": "metric", "step": i, "values": {"sent_at": time.time()}}
                http.post(f"{base}/api/v1/runs/{run_id}/ingest/", json={"events": [event]}).raise_for_status()
                time.sleep(0.02)
        done.set()

    await asyncio.gather(asyncio.to_thread(post_events), asyncio.wait_for(asyncio.gather(*tasks), timeout=120))
    for s in sockets:
        await s.close()
    ordered = sorted(latencies)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], len(ordered)


def run_mlflow(python: Path, uri: str, mode: str, **kwargs: object) -> dict[str, float]:
    args = [str(python), str(ROOT / "bench" / "_mlflow_client.py"), uri, mode, json.dumps(kwargs)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f}" if len(values) > 1 else "one round"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one round (about a minute)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds per measure (default 5; quick 1)")
    parser.add_argument("--web-workers", type=int, default=2, help="uvicorn worker processes for Crucible (default 2)")
    add_load_guard(parser)
    args = parser.parse_args()
    load_before = load_guard(args)
    rounds = args.rounds or (1 if args.quick else 5)
    batches = 8 if args.quick else 20
    singles = 50 if args.quick else 200
    read_points = 20_000 if args.quick else 100_000
    ws_events = 50 if args.quick else 200

    mlflow_python = ensure_mlflow_venv()
    mlflow_version = subprocess.run(
        [str(mlflow_python), "-c", "import mlflow; print(mlflow.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    recreate_database("crucible_bench")
    recreate_database("mlflow_bench")
    setup = setup_crucible(runs=10 * rounds + 3)  # per round 1 + 4 + 4 + 1; warm-up, read, websocket
    runs = list(setup["runs"])
    var = ROOT / "var" / "bench"
    port, mlflow_port = devstack.free_port(), devstack.free_port()
    base, mlflow_uri = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mlflow_port}"
    env = {**os.environ, "CRUCIBLE_LOG_LEVEL": "WARNING"}
    rows: list[tuple[str, str, str, str]] = []
    with devstack.ProcessGroup(var / "log") as procs:
        procs.start(
            "uvicorn",
            [
                str(ROOT / ".venv/bin/uvicorn"),
                "controlplane.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(args.web_workers),
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            env=env,
        )
        procs.start(
            "mlflow",
            [
                str(MLFLOW_VENV / "bin/mlflow"),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(mlflow_port),
                "--backend-store-uri",
                f"{PG.replace('postgresql', 'postgresql+psycopg2')}/mlflow_bench",
            ],
            env=env,
        )
        devstack.wait_for_port("127.0.0.1", port, timeout=60)
        devstack.wait_for_port("127.0.0.1", mlflow_port, timeout=120)
        time.sleep(2)
        # Warm every worker process of both servers (imports, connections) before anything is timed.
        warm = runs.pop()
        crucible_batched(base, [warm] * 4, 2)  # four connections reach every worker; repeats are duplicates
        run_mlflow(mlflow_python, mlflow_uri, "batched", clients=4, batches=2)

        def row(name: str, ours: list[float], theirs: list[float] | None, unit: str) -> None:
            a = statistics.median(ours)
            b = statistics.median(theirs) if theirs else None
            ratio = f"{a / b:.1f}x" if b else ""
            rows.append(
                (
                    name,
                    f"{a:,.0f} {unit} ({spread(ours)})",
                    f"{b:,.0f} {unit} ({spread(theirs)})" if theirs and b else "n/a",
                    ratio,
                )
            )
            print(f"  {name:<34} crucible {a:>10,.0f}  mlflow {b or 0:>10,.0f} {unit}  {ratio}", flush=True)

        print(f"measuring, {rounds} alternating rounds...", flush=True)
        measures = {
            "batched 1,000/request, 1 client": (
                lambda: crucible_batched(base, [runs.pop()], batches),
                lambda: run_mlflow(mlflow_python, mlflow_uri, "batched", clients=1, batches=batches)["points_per_s"],
            ),
            "batched 1,000/request, 4 clients": (
                lambda: crucible_batched(base, [runs.pop() for _ in range(4)], batches),
                lambda: run_mlflow(mlflow_python, mlflow_uri, "batched", clients=4, batches=batches)["points_per_s"],
            ),
            "batched 1,000/request, 4 clients, bodies pre-encoded": (
                lambda: crucible_batched(base, [runs.pop() for _ in range(4)], batches, pre_encoded=True),
                lambda: run_mlflow(mlflow_python, mlflow_uri, "batched_raw", clients=4, batches=batches)[
                    "points_per_s"
                ],
            ),
            "single point per request": (
                lambda: crucible_single(base, runs.pop(), singles),
                lambda: run_mlflow(mlflow_python, mlflow_uri, "single", count=singles)["points_per_s"],
            ),
        }
        figures: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in measures}
        for r in range(rounds):
            for name, (ours, theirs) in measures.items():
                # ABBA: Crucible first in even rounds, MLflow first in odd ones.
                if r % 2 == 0:
                    figures[name][0].append(ours())
                    figures[name][1].append(theirs())
                else:
                    figures[name][1].append(theirs())
                    figures[name][0].append(ours())
            latest = ", ".join(f"{a[-1]:,.0f}/{b[-1]:,.0f}" for a, b in figures.values())
            print(f"  round {r + 1} (crucible/mlflow points/s): {latest}", flush=True)
        for name, (ours_list, theirs_list) in figures.items():
            row(name, ours_list, theirs_list, "points/s")

        read_run = runs.pop()
        crucible_batched(base, [read_run], read_points // 1000)
        ours_ms, buckets = crucible_read(base, read_run[0], str(setup["api_token"]))
        theirs_ms = run_mlflow(mlflow_python, mlflow_uri, "read", points=read_points)["ms"]
        rows.append(
            (
                f"read {read_points // 1000}k-point series (ms)",
                f"{ours_ms:,.1f} ms ({buckets} buckets)",
                f"{theirs_ms:,.0f} ms (full)",
                f"{theirs_ms / ours_ms:.0f}x",
            )
        )
        print(f"  read: crucible {ours_ms:.1f} ms, mlflow {theirs_ms:.0f} ms", flush=True)

        p50, p99, n = asyncio.run(
            websocket_latency(
                base.replace("http", "ws"), base, runs.pop(), str(setup["session"]), viewers=20, events=ws_events
            )
        )
        rows.append(
            (
                "worker -> websocket, 20 viewers",
                f"p50 {p50:.1f} ms, p99 {p99:.1f} ms ({n} deliveries)",
                "n/a (no live push)",
                "",
            )
        )
        print(f"  websocket latency p50 {p50:.1f} ms p99 {p99:.1f} ms over {n} deliveries", flush=True)

    load_after = os.getloadavg()
    table = ["| measure | Crucible (spread) | MLflow (spread) | Crucible vs MLflow |", "| --- | --- | --- | --- |"]
    table += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    header = (
        f"bench/ingest_vs_mlflow.py{' --quick' if args.quick else ''}, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} cores, {rounds} alternating rounds, Crucible on uvicorn x{args.web_workers} (DEBUG off), "
        f"MLflow {mlflow_version} (mlflow server, 4 workers), load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after"
    )
    text = header + "\n\n" + "\n".join(table) + "\n"
    out = ROOT / "bench" / "results" / ("latest-quick.txt" if args.quick else "latest.txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print("\n" + text)


if __name__ == "__main__":
    main()
