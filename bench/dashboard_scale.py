"""Dashboard pages at the issue's scale: 10k runs, 1M trajectory summaries, 10M metric points in PostgreSQL.

    python bench/dashboard_scale.py [--scale 0.01] [--requests 200] [--reuse]

Seeds a fresh database `crucible_bench_scale` (migrated, then filled with COPY: secondary indexes of the two big
tables are dropped before the load and built after it, foreign-key triggers are off during the load, then VACUUM
ANALYZE so chart reads are index-only), and measures server time in process: Django's test Client, a logged-in
viewer, `time.perf_counter` around each request, 20 warm-up requests, then `--requests` timed ones (p50/p95).
Each row also gives its SQL query count. Nothing here asserts on time; the chart rows assert their point count.

The data: run N (the newest, so it is on page 1 of the list) is the long one, with 1M metric points (5 series of
200k steps: reward_mean, loss, kl, entropy, response_length); the other 9,999 runs share the other 9M points as
reward_mean and loss series of 450 steps each. 100 trajectory summaries per run. Ten owners, five kinds, five
statuses, tags drawn from eight words.

Peer (same invocation, same URL, same template): the runs list with N+1 sparklines, one downsampling query per
run through the run page's own per-series selector (`metric_series(max_points=50)`), instead of the one
query for the whole page. `--scale 0.01` is a quick run (100 runs, 10k trajectories, 100k points).
Results: bench/results/dashboard_scale.{txt,json} (dashboard_scale-quick.* below scale 1).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402

PG = "postgresql://postgres@127.0.0.1:5432"
DB = "crucible_bench_scale"
os.environ["DATABASE_URL"] = f"{PG}/{DB}"
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("DJANGO_DEBUG", "0")  # as deployed: no query log, no debug templates
os.environ.setdefault("DJANGO_HTTPS", "0")  # served over plain http on loopback here

import psycopg  # noqa: E402

KINDS = ["train", "rescore", "eval", "datagen", "sft"]
STATUSES = ["succeeded", "failed", "running", "stopped", "pending"]
TAG_WORDS = ["baseline", "ctx1", "grpo", "cispo", "ablation", "lora", "search", "coding"]
LONG_SERIES = ["reward_mean", "loss", "kl", "entropy", "response_length"]
SHORT_SERIES = ["reward_mean", "loss"]
OWNERS = 10
START = datetime(2026, 1, 1, tzinfo=UTC)
T0 = START.isoformat()


def recreate_database() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')


def sizes(scale: float) -> dict[str, int]:
    runs = max(10, round(10_000 * scale))
    points = round(10_000_000 * scale)
    long_points = points // 10  # one run holds a tenth: 1M at full scale
    short_steps = (points - long_points) // (runs - 1) // len(SHORT_SERIES)
    return {
        "runs": runs,
        "trajectories_per_run": 100,
        "long_steps": long_points // len(LONG_SERIES),
        "short_steps": short_steps,
    }


def curve(run: int, step: int, steps: int, series: str) -> float:
    """A learning-curve-looking value: rising (reward) or falling (loss) with some deterministic wobble."""
    x = step / max(steps, 1)
    wobble = 0.05 * math.sin(step * 0.37 + run)
    if series == "reward_mean":
        return 0.2 + 0.6 * (1 - math.exp(-4 * x)) * (0.5 + (run % 7) / 12) + wobble
    return 2.0 * math.exp(-3 * x) + 0.1 + wobble


def _defaults_of_unlisted(table: str, listed: list[str]) -> tuple[list[str], str]:
    """The NOT NULL columns of `table`'s model that `listed` leaves out, and their model defaults as the COPY text to
    append to each line: migrations keep adding such columns (their defaults live in Django, not in the table), and
    the seed should not break each time one does."""
    from django.apps import apps as django_apps

    from apps.runs.services.metrics import copy_text

    model = next(m for m in django_apps.get_models() if m._meta.db_table == table)
    fields = [f for f in model._meta.concrete_fields if not (f.column in listed or f.null or f.primary_key)]
    defaults = [f.get_default() for f in fields]
    cells = [copy_text(json.dumps(v) if isinstance(v, (dict, list)) else v) for v in defaults]
    return [f.column for f in fields], "".join(f"\t{cell}" for cell in cells)


def copy_rows(cursor: psycopg.Cursor, table: str, columns: list[str], lines: object, chunk: int = 1 << 22) -> None:
    """COPY text-format lines of `columns` into `table`, buffered into ~4 MB writes; the table's other NOT NULL
    columns get their model defaults (`_defaults_of_unlisted`)."""
    extra, suffix = _defaults_of_unlisted(table, columns)
    sql = f"COPY {table} ({', '.join(columns + extra)}) FROM STDIN"
    with cursor.copy(sql) as copy:
        buf = io.StringIO()
        for line in lines:  # type: ignore[attr-defined]
            buf.write(line.replace("\n", suffix + "\n") if suffix else line)  # a chunk may hold many lines
            if buf.tell() > chunk:
                copy.write(buf.getvalue())
                buf = io.StringIO()
        copy.write(buf.getvalue())


def seed(n: dict[str, int], owner_ids: list[int]) -> dict[str, float]:
    from apps.runs.services.metrics import METRIC_POINT_COLUMNS

    runs, long_id = n["runs"], n["runs"]
    timings: dict[str, float] = {}
    with psycopg.connect(f"{PG}/{DB}", autocommit=True) as conn, conn.cursor() as cur:
        # The load is ours and consistent: skip foreign-key triggers, build secondary indexes once at the end.
        cur.execute("SET session_replication_role = replica")
        cur.execute("SET maintenance_work_mem = '1GB'")
        saved = {}
        for table in ("runs_metricpoint", "runs_trajectorysummary"):
            cur.execute(
                "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.tablename = %s AND i.indexname NOT IN "
                "(SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass)",
                [table, table],
            )
            saved[table] = cur.fetchall()
            for name, _ in saved[table]:
                cur.execute(f'DROP INDEX "{name}"')

        started = time.perf_counter()

        def run_lines():  # type: ignore[no-untyped-def]
            for i in range(1, runs + 1):
                kind = "train" if i == long_id else KINDS[i % len(KINDS)]
                status = "running" if i == long_id else STATUSES[(i // 5) % len(STATUSES)]
                tags = json.dumps([TAG_WORDS[i % 8], TAG_WORDS[(i // 8) % 8]]) if i % 3 else "[]"
                steps = n["long_steps"] if i == long_id else n["short_steps"]
                created = (START + timedelta(minutes=i)).isoformat()  # the long run (the last id) is the newest
                yield (
                    f"{i}\t{kind}\t{TAG_WORDS[i % 8]}-{kind}-{i:05d}\t{{}}\t{status}\t{tags}\t\t\tn{i}\t"
                    f"{steps}\t{steps}\t0\t0\t0\t0\t\t\t{{}}\t{owner_ids[i % len(owner_ids)]}\t{created}\t{created}\n"
                )

        copy_rows(
            cur,
            "runs_run",
            "id kind name spec status tags ray_job_id ray_address ingest_nonce progress_done progress_total last_seq"
            " progress_seq log_seq ingest_batches failure_reason log_tail summary created_by_id created_at"
            " submitted_at".split(),
            run_lines(),
        )
        cur.execute("SELECT setval(pg_get_serial_sequence('runs_run', 'id'), %s)", [runs])
        timings["runs"] = time.perf_counter() - started

        started = time.perf_counter()

        def trajectory_lines():  # type: ignore[no-untyped-def]
            per = n["trajectories_per_run"]
            for run in range(1, runs + 1):
                for t in range(per):
                    reward = ((run * 7919 + t * 104729) % 1000) / 1000
                    yield (
                        f'{run}\ttraj-{t}\ttask-{t % 37}\t{t}\t{reward}\t{{"f_beta": {reward}}}\t{1 + t % 6}'
                        f"\t\t\t{T0}\n"
                    )

        copy_rows(
            cur,
            "runs_trajectorysummary",
            "run_id trajectory_id task_id step reward terms num_turns error storage_uri created_at".split(),
            trajectory_lines(),
        )
        timings["trajectories"] = time.perf_counter() - started

        started = time.perf_counter()

        def metric_lines():  # type: ignore[no-untyped-def]
            for run in range(1, runs + 1):
                names, steps = (LONG_SERIES, n["long_steps"]) if run == long_id else (SHORT_SERIES, n["short_steps"])
                for name in names:
                    head = f"{run}\t"
                    tail = f"\t{name}\t"
                    yield "".join(f"{head}{s}{tail}{curve(run, s, steps, name):.5f}\t{T0}\n" for s in range(steps))

        copy_rows(cur, "runs_metricpoint", METRIC_POINT_COLUMNS, metric_lines())
        timings["metric_points"] = time.perf_counter() - started

        started = time.perf_counter()
        for table in saved:
            for _, definition in saved[table]:
                cur.execute(definition)
        timings["indexes"] = time.perf_counter() - started
        started = time.perf_counter()
        cur.execute("SET session_replication_role = origin")
        cur.execute("VACUUM ANALYZE")  # the visibility map makes chart reads index-only scans
        timings["vacuum_analyze"] = time.perf_counter() - started
        counts = {}
        for table in ("runs_run", "runs_trajectorysummary", "runs_metricpoint"):
            cur.execute(f"SELECT count(*) FROM {table}")
            counts[table] = cur.fetchone()[0]  # type: ignore[index]
    return {**timings, **{f"rows_{k}": v for k, v in counts.items()}}


def measure(client, path: str, requests: int, check=None) -> dict[str, float | int]:  # type: ignore[no-untyped-def]
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(20):
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    queries = len(ctx.captured_queries)  # now: the next request's request_started signal clears the log
    extra = check(response) if check else {}
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        client.get(path)
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return {
        "p50_ms": statistics.median(times),
        "p95_ms": times[max(0, math.ceil(0.95 * len(times)) - 1)],
        "queries": queries,
        **extra,
    }


def chart_points(response) -> dict[str, int]:  # type: ignore[no-untyped-def]
    series = response.json()["series"]
    longest = max((len(s["steps"]) for s in series), default=0)
    total = sum(len(s["steps"]) for s in series)
    # The bound: a few thousand points whatever the run's length (<= 1,000 buckets a series here).
    assert longest <= 1000 and total <= 5000, (longest, total)
    return {"points_returned": total, "points_stored": sum(s["count"] for s in series)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of 10k runs / 1M trajectories / 10M points")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--reuse", action="store_true", help="measure the database a previous run seeded")
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)
    n = sizes(args.scale)

    import django

    if not args.reuse:
        recreate_database()
    django.setup()
    from django.core.management import call_command
    from django.test import Client

    from apps.accounts.models import User
    from apps.runs import selectors, selectors_list

    seeding: dict[str, float] = {}
    if not args.reuse:
        call_command("migrate", verbosity=0)
        owners = [User.objects.create_user(username=f"owner{i}", role="operator") for i in range(OWNERS)]
        User.objects.create_user(username="viewer", role="viewer")
        print(f"seeding {n} ...", flush=True)
        started = time.perf_counter()
        seeding = seed(n, [u.pk for u in owners])
        # COPY bypasses ingest, which keeps the metric roll-ups: build them as the migration does for old data.
        from apps.runs.services import metric_rollups_rebuild

        rollups_started = time.perf_counter()
        metric_rollups_rebuild()
        seeding["rollups"] = time.perf_counter() - rollups_started
        seeding["total"] = time.perf_counter() - started
        print(json.dumps(seeding, indent=1), flush=True)
    else:
        # A database seeded by an older run: bring its schema up to date and rebuild its roll-ups.
        call_command("migrate", verbosity=0)
        from apps.runs.services import metric_rollups_rebuild

        rollups_started = time.perf_counter()
        metric_rollups_rebuild()
        print(f"roll-ups rebuilt in {time.perf_counter() - rollups_started:.1f}s", flush=True)

    client = Client()
    client.force_login(User.objects.get(username="viewer"))
    long_id = n["runs"]
    typical_id = n["runs"] // 2
    last_page = math.ceil(n["runs"] / selectors_list.RUNS_PER_PAGE)
    rows = {
        "runs list, page 1": "/",
        "runs list, filtered (kind+status+tag)": "/?kind=train&status=succeeded&tag=grpo",
        "runs list, name search": "/?q=lora-eval-0",
        f"runs list, last page ({last_page})": f"/?page={last_page}",
        "run page, the long run": f"/runs/{long_id}/",
        "chart.json, the long run": f"/runs/{long_id}/chart.json",
        "chart.json, a typical run": f"/runs/{typical_id}/chart.json",
    }
    results: dict[str, dict[str, float | int]] = {}
    for label, path in rows.items():
        results[label] = measure(client, path, args.requests, chart_points if "chart" in path else None)
        print(f"{label:40} {results[label]}", flush=True)

    # The peer: the same page with one downsampling query per run (N+1), through the run page's selector.
    ours = selectors_list.run_sparklines

    def n_plus_one(*, run_ids: list[int], name: str = "reward_mean", points: int = 50):  # type: ignore[no-untyped-def]
        out = {}
        for run_id in run_ids:
            series = selectors.metric_series(run_id=run_id, name=name, max_points=points)
            if series["steps"]:
                out[run_id] = list(zip(series["steps"], series["mean"], strict=True))
        return out

    selectors_list.run_sparklines = n_plus_one  # type: ignore[assignment]
    try:
        peer = {
            "runs list, page 1": measure(client, "/", args.requests),
            "runs list, filtered (kind+status+tag)": measure(
                client, "/?kind=train&status=succeeded&tag=grpo", args.requests
            ),
        }
    finally:
        selectors_list.run_sparklines = ours
    # The chart's peer: the same request downsampled from the points, as before roll-ups (a huge bucket size
    # makes metric_series take its point-scan path).
    rollup_steps = selectors.ROLLUP_STEPS
    selectors.ROLLUP_STEPS = 1 << 62
    try:
        peer["chart.json, the long run"] = measure(
            client, f"/runs/{long_id}/chart.json", max(20, args.requests // 4), chart_points
        )
    finally:
        selectors.ROLLUP_STEPS = rollup_steps

    lines = [
        f"# bench/dashboard_scale.py --scale {args.scale} --requests {args.requests}{' --reuse' if args.reuse else ''}",
        f"# data: {n['runs']:,} runs, {n['runs'] * n['trajectories_per_run']:,} trajectory summaries, "
        f"{n['long_steps'] * len(LONG_SERIES) + (n['runs'] - 1) * n['short_steps'] * len(SHORT_SERIES):,} metric "
        f"points (long run {long_id}: {n['long_steps'] * len(LONG_SERIES):,})",
    ]
    if seeding:
        lines.append(
            "# seeding (COPY): " + ", ".join(f"{k} {v:.1f}s" for k, v in seeding.items() if not k.startswith("rows_"))
        )
    lines += [
        f"# server time, in-process Django test Client, {args.requests} requests after 20 warm-up; ms",
        "",
        f"| {'request':40} | p50 ms | p95 ms | queries | peer p50 | peer p95 | peer queries | peer/ours p50 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, r in results.items():
        p = peer.get(label)
        peer_cols = (
            f"{p['p50_ms']:8.1f} | {p['p95_ms']:8.1f} | {p['queries']:12} | {p['p50_ms'] / r['p50_ms']:12.1f}x"
            if p
            else f"{'':8} | {'':8} | {'':12} | {'':13}"
        )
        note = f" ({r['points_returned']:,} of {r['points_stored']:,} points)" if "points_returned" in r else ""
        lines.append(
            f"| {label + note:40} | {r['p50_ms']:6.1f} | {r['p95_ms']:6.1f} | {r['queries']:7} | {peer_cols} |"
        )
    lines += [
        "",
        "peer: the same list page with N+1 sparklines (metric_series(max_points=50) per run); for chart.json, the",
        "same request downsampled from every point (the path before roll-ups).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    stem = "dashboard_scale" if args.scale >= 1 else "dashboard_scale-quick"
    out = ROOT / "bench" / "results"
    (out / f"{stem}.txt").write_text(text)
    (out / f"{stem}.json").write_text(
        json.dumps({"args": vars(args), "sizes": n, "seeding": seeding, "ours": results, "peer": peer}, indent=1)
    )


if __name__ == "__main__":
    main()
