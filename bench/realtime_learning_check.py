"""Real-time RL learning check (issue 18) against a live `make run`: three cycles end to end, then a degraded one.

    make run                                   # in one terminal (its demo generates the repository tasks)
    python bench/realtime_learning_check.py [--var var] [--sessions 8] [--cycles 3]

What it does, through the same services the API calls:
1. Repository tasks: the train part of the demo's generated suite (`demo-repo-tasks-train`, else `demo-repo-tasks`;
   it waits for the demo's generation run). The simulated users play these.
2. A gate `rt-check-<stamp>` on two benchmarks: `no_regression` on pass@1 of 24 arithmetic tasks (exact_answer,
   the reply's last number; SmolLM2-135M answers some, so a broken model shows as a regression) and a `threshold`
   pass@1 >= 0 on four held-out repository tasks (reported, never blocking). No human approval.
3. Deploys a step-0 LoRA checkpoint of the base model (`--base-model`: SmolLM2-135M-Instruct, or a warmed-up
   model directory), serves the gate on Ray Serve, configures the loop. `--tasks` and `--held-out` name the users'
   tasks and the gate's coding benchmark when they are not the demo's.
4. Each cycle: a simulate run plays `--sessions` coding sessions through the `openai` client (hidden tests decide
   edit kept or a dissatisfied follow-up); the loop collects them, trains one epoch (Composer's loss, LoRA), gates
   and deploys by hot swap. Per cycle: edit-kept rate with its Wilson 95% interval, the phase breakdown, eval
   scores and the verdict.
5. A deliberately degraded cycle (learning rate 1.0): the gate must block it and serving must stay on the previous
   version (checked with a request through the `openai` client).

Figures are printed and written to bench/results/realtime_learning_check.{txt,json} (`--out`), with a
two-proportion test of the last normal cycle's edit-kept rate against the first's. It takes about 10 minutes
per cycle on 2 cores with the default sizes.

From a warmed-up coding model (issue 37): `bench/coding_learning_check.py ... --cache DIR --stop-after-sft` leaves
its generated tasks in DIR/tasks-*/ and its SFT model in DIR/sft; then

    python bench/realtime_learning_check.py --base-model DIR/sft --tasks-dir DIR/tasks-<hash> --task-count 12 \
        --sessions 12 --max-turns 6 --max-tokens 256

plays the same 12 train tasks every cycle and gates on held-out tasks of the same split.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--var", type=Path, default=ROOT / "var", help="the var dir of the make run to use")
    parser.add_argument("--sessions", type=int, default=8, help="simulated sessions per cycle")
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--max-turns", type=int, default=4, help="agent turns per simulated session")
    parser.add_argument("--max-tokens", type=int, default=160, help="max_tokens of each request")
    parser.add_argument("--learning-rate", type=float, default=2e-4, help="LoRA learning rate of a normal cycle")
    parser.add_argument("--arith-tasks", type=int, default=24)
    parser.add_argument("--port", type=int, default=8100, help="Ray Serve's HTTP port")
    parser.add_argument("--cycle-timeout", type=float, default=3600.0)
    parser.add_argument(
        "--base-model",
        default="smollm2-135m-instruct",
        help="the model served at the start: a built-in name or a local model directory (e.g. the SFT model that "
        "bench/coding_learning_check.py leaves in its --cache folder, one that solves some tasks)",
    )
    parser.add_argument(
        "--tasks",
        default="",
        help="the repo_tasks dataset the simulated users play (default: the demo's demo-repo-tasks-train)",
    )
    parser.add_argument(
        "--held-out", default="", help="the coding benchmark whose first 4 tasks the gate reports (default: the demo's)"
    )
    parser.add_argument(
        "--tasks-dir",
        type=Path,
        default=None,
        help="a folder of generated repo_task/v1 rows (tasks.jsonl, e.g. a tasks-* folder that "
        "bench/coding_learning_check.py leaves in its --cache): imported as the users' tasks (its train split) and "
        "the gate's coding benchmark (its held-out split, by the same task-id hash as that check's "
        "--held-out-percent)",
    )
    parser.add_argument("--held-out-percent", type=int, default=30, help="with --tasks-dir: the check's split")
    parser.add_argument(
        "--task-count",
        type=int,
        default=0,
        help="with --tasks-dir: the users play only the first N train tasks (by id), so that with --sessions N every "
        "cycle plays each of them once and cycles compare task for task (0: every train task)",
    )
    parser.add_argument("--eval-tasks", type=int, default=4, help="held-out coding tasks the gate reports")
    parser.add_argument(
        "--env-params",
        type=json.loads,
        default=None,
        help="coding_agent parameters of the users' sessions and the gate's coding benchmark, JSON (default "
        '{"summary_threshold_tokens": 0}; with --tasks-dir, bench/coding_learning_check.py\'s: '
        '{"max_calls_per_turn": 2, "max_output_chars": 1500, "summary_threshold_tokens": 0})',
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="the simulated sessions' sampling temperature")
    parser.add_argument("--out", type=Path, default=RESULTS / "realtime_learning_check.json")
    args = parser.parse_args()
    if args.env_params is None:
        args.env_params = {"summary_threshold_tokens": 0}
        if args.tasks_dir is not None:
            args.env_params.update(max_calls_per_turn=2, max_output_chars=1500)

    stack = json.loads((args.var / "stack.json").read_text())
    os.environ.update({k: v for k, v in stack.items() if k != "web"})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ["CRUCIBLE_PUBLIC_URL"] = stack.get("web", "http://127.0.0.1:8000")
    import django

    django.setup()

    import signal

    import openai

    from apps.accounts.models import User
    from apps.accounts.services import api_token_create
    from apps.benchmarks.models import BenchmarkVersion
    from apps.benchmarks.services import benchmark_create, benchmark_version_create
    from apps.datasets.models import DatasetVersion
    from apps.gates.models import Deployment
    from apps.gates.services import gate_create
    from apps.realtime.models import Cycle, CycleStatus, Loop
    from apps.realtime.selectors import cycle_signal_rates, median_cycle_seconds, phase_durations, served_version
    from apps.realtime.services.loops import loop_create as make_loop
    from apps.realtime.services.serving import serve_endpoint_url, serve_launch, simulate_launch
    from apps.rewards.services import reward_config_create
    from apps.runs.models import Checkpoint, Run
    from apps.runs.services import run_cancel
    from apps.runs.storage import storage_uri, worker_storage_options
    from workers.envs.registry import arithmetic_tasks
    from workers.models.registry import resolve_base_model
    from workers.realtime.reward import default_session_reward_config
    from workers.rl.config import TrainConfig
    from workers.rl.learner import Learner
    from workers.storage import write_checkpoint

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the serving run is stopped on the way out
    stamp = time.strftime("%Y%m%d-%H%M%S")
    user = User.objects.filter(username="rt-check").first() or User.objects.create_user(
        username="rt-check", password=os.urandom(16).hex(), role="admin"
    )

    # 1. Tasks the users bring.
    deadline = time.monotonic() + 1800
    tasks: DatasetVersion | None = None
    imported_held_out: list[dict[str, Any]] = []
    if args.tasks_dir is not None:
        tasks, imported_held_out = import_tasks(args, user, stamp)
    while tasks is None:
        for name in (args.tasks,) if args.tasks else ("demo-repo-tasks-train", "demo-repo-tasks"):
            tasks = DatasetVersion.objects.filter(dataset__name=name).order_by("-number").first()
            if tasks is not None:
                break
        if tasks is None:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"no repository tasks {args.tasks!r} after 30 minutes: import them (Coding tasks page)"
                    if args.tasks
                    else "no demo repository tasks after 30 minutes: is `make run` up with its demo?"
                )
            log("waiting for the demo's generated repository tasks…")
            time.sleep(15)
    log(f"users' tasks: {tasks} ({tasks.row_count} tasks)")
    held_out = (
        BenchmarkVersion.objects.filter(benchmark__name=args.held_out or "demo-coding-bench")
        .order_by("-number")
        .first()
    )

    # 2. The gate.
    arith = benchmark_create(name=f"rt-arith-{stamp}", environment="exact_answer", owner=user)
    arith_version, _ = benchmark_version_create(  # the reply's last number is its answer: SmolLM2 is chatty
        benchmark=arith,
        tasks=arithmetic_tasks(args.arith_tasks, seed=11),
        created_by=user,
        env_params={"answer_format": "last_number"},
    )
    versions = [arith_version]
    rules: list[dict[str, Any]] = [{"type": "no_regression", "benchmark": arith.name, "metric": "pass@1"}]
    rows: list[dict[str, Any]] = imported_held_out[: args.eval_tasks]
    if held_out is not None and not rows:
        rows = [json.loads(line) for line in held_out.tasks_file.read().splitlines() if line.strip()][: args.eval_tasks]
    if rows:
        coding = benchmark_create(name=f"rt-coding-{stamp}", environment="coding_agent", owner=user)
        coding_version, _ = benchmark_version_create(
            benchmark=coding,
            tasks=rows,
            created_by=user,
            env_params={**args.env_params, "max_turns": args.max_turns},
        )
        versions.append(coding_version)
        rules.append({"type": "threshold", "benchmark": coding.name, "metric": "pass@1", "value": 0.0})
    gate = gate_create(
        name=f"rt-check-{stamp}",
        rules=rules,
        benchmark_versions=versions,
        owner=user,
        requires_approval=False,
        max_new_tokens=args.max_tokens,
    )

    # 3. A step-0 LoRA checkpoint of the base model, deployed and served.
    base_model = str(resolve_base_model(args.base_model)) if Path(args.base_model).is_dir() else args.base_model
    config = TrainConfig.model_validate({"base_model": base_model, "lora": {"rank": 16}, "seed": 0})
    learner = Learner(str(resolve_base_model(base_model)), config, threads=2)
    run = Run.objects.create(
        kind="train", name=f"rt-check start {stamp}", spec={"config": config.model_dump(mode="json")},
        created_by=user, status="succeeded",
    )  # fmt: skip
    uri = storage_uri(f"runs/{run.pk}/checkpoints/step-000000.pt")
    write_checkpoint(uri, learner.checkpoint_bytes(data_position=0), worker_storage_options())
    del learner
    start = Checkpoint.objects.create(run=run, step=0, uri=uri)
    Deployment.objects.create(gate=gate, checkpoint=start, created_by=user, note="real-time check: the start")
    reward = reward_config_create(
        name=f"rt-check-{stamp}", description="session reward", spec=default_session_reward_config(), owner=user
    ).versions.get()
    serve = serve_launch(
        user=user,
        model_name="coder",
        gate=gate,
        http_port=args.port,
        options={"max_new_tokens": args.max_tokens, "threads": 1},
    )
    loop = make_loop(
        gate=gate,
        serve_run=serve,
        reward_version=reward,
        user=user,
        min_sessions=args.sessions,
        target_sessions=args.sessions,
        settle_seconds=5,
        training={
            "config": {
                "learning_rate": args.learning_rate,
                "prompts_per_step": 4,
                "group_size": 2,
                "compute": {"cpus": 2},
            }
        },
    )
    _, key = api_token_create(user=user, name=f"rt-check-{stamp}", scopes=["serve"])
    client = openai.OpenAI(base_url=serve_endpoint_url(serve), api_key=key, max_retries=0, timeout=300)
    log(f"gate {gate.name}, serving run {serve.pk} at {serve_endpoint_url(serve)}, loop {loop.pk}")

    def probe() -> int:
        reply = client.chat.completions.create(
            model="coder", messages=[{"role": "user", "content": "Say OK."}], max_tokens=2,
            extra_headers={"X-Session-Id": "rt-check-probe"},  # one session: collected once, by cycle 1
        )  # fmt: skip
        return int(reply.model_extra["policy_version"])

    deadline = time.monotonic() + 600
    while True:
        try:
            log(f"serving answers with policy version {probe()}")
            break
        except (openai.APIConnectionError, openai.APIStatusError) as exc:
            serve.refresh_from_db()
            if serve.is_terminal or time.monotonic() > deadline:
                raise SystemExit(f"serving did not come up: {exc}; {serve.failure_reason}\n{serve.log_tail[-2000:]}")
            time.sleep(3)
    # The probe's own session counts: collect the users' sessions only.
    Loop.objects.filter(pk=loop.pk).update(min_sessions=args.sessions + 1, target_sessions=args.sessions + 1)

    results: dict[str, Any] = {"gate": gate.name, "serve_run": serve.pk, "loop": loop.pk, "cycles": []}

    def play_cycle(number: int, *, degraded: bool) -> dict[str, Any]:
        if number == 2:  # the probe's session went with cycle 1
            Loop.objects.filter(pk=loop.pk).update(min_sessions=args.sessions, target_sessions=args.sessions)
        if degraded:
            training = dict(Loop.objects.get(pk=loop.pk).training)
            training["config"] = {**training["config"], "learning_rate": 1.0}
            Loop.objects.filter(pk=loop.pk).update(training=training)
        before = served_version(serve.pk)
        sim = simulate_launch(
            user=user,
            serve_run=serve,
            dataset_version=tasks,
            sessions=args.sessions,
            concurrency=2,
            options={
                "max_turns": args.max_turns,
                "max_tokens": args.max_tokens,
                "seed": number,
                "temperature": args.temperature,
                "env_params": args.env_params,
            },
        )
        started = time.monotonic()
        while True:
            cycle = Cycle.objects.filter(loop=loop, number=number).first()
            if cycle is not None and cycle.status != CycleStatus.RUNNING:
                break
            if time.monotonic() - started > args.cycle_timeout:
                raise SystemExit(f"cycle {number} did not end in {args.cycle_timeout:.0f} s: {cycle and cycle.reason}")
            time.sleep(5)
        sim.refresh_from_db()
        rates = cycle_signal_rates(cycle)
        verdict = (
            cycle.gate_check.decision.final_verdict
            if cycle.gate_check and hasattr(cycle.gate_check, "decision")
            else None
        )
        row = {
            "cycle": number,
            "degraded": degraded,
            "status": cycle.status,
            "reason": cycle.reason,
            "sessions": cycle.sessions,
            "turns": cycle.turns,
            "tokens": cycle.tokens,
            "on_policy_share": cycle.on_policy_share,
            "feedback_share": cycle.feedback_share,
            "reward_mean": cycle.reward_mean,
            "edit_kept": rates["edit_kept"],
            "dissatisfied": rates["dissatisfied_followup"],
            "phases": {p["phase"]: p["seconds"] for p in phase_durations(cycle)},
            "seconds": cycle.seconds,
            "eval": cycle.eval_deltas,
            "verdict": verdict,
            "served_before": before,
            "served_after": served_version(serve.pk),
            "checkpoint": cycle.checkpoint_id,
            "simulate_summary": {
                k: sim.summary.get(k)
                for k in ("edit_kept_rate", "tests_passed_mean", "latency_ms_p50", "latency_ms_p95", "turns_mean")
            },
        }
        if degraded:
            row["probe_policy_version"] = probe()
        kept = rates["edit_kept"]
        log(
            f"cycle {number}{' (degraded)' if degraded else ''}: {cycle.status}; edit kept {kept['hits']}/{kept['n']} "
            f"[{kept['low']:.2f}, {kept['high']:.2f}]; phases "
            + ", ".join(f"{k} {v:.0f}s" for k, v in row["phases"].items() if v is not None)
            + f"; eval {json.dumps(cycle.eval_deltas)}; serving {before} -> {row['served_after']}"
        )
        return row

    try:
        for number in range(1, args.cycles + 1):
            results["cycles"].append(play_cycle(number, degraded=False))
        results["cycles"].append(play_cycle(args.cycles + 1, degraded=True))
    finally:
        Loop.objects.filter(pk=loop.pk).update(paused=True)
        run_cancel(run=Run.objects.get(pk=serve.pk), user=user)

    results["median_cycle_seconds"] = median_cycle_seconds(Loop.objects.get(pk=loop.pk))
    results["load_average"] = os.getloadavg()
    degraded = results["cycles"][-1]
    results["degraded_blocked"] = degraded["status"] == CycleStatus.BLOCKED
    results["serving_stayed"] = (
        degraded["served_after"] == degraded["served_before"] == degraded.get("probe_policy_version")
    )
    normal = [c for c in results["cycles"] if not c["degraded"]]
    results["first_vs_last"] = rise_test(normal[0]["edit_kept"], normal[-1]["edit_kept"]) if len(normal) > 1 else None
    results["command"] = " ".join(sys.argv)
    results["base_model"] = args.base_model
    results["users_tasks"] = str(tasks)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))
    lines = [
        f"Real-time RL learning check ({time.strftime('%Y-%m-%d')}): {args.base_model} (LoRA 16), "
        f"{args.sessions} simulated sessions per cycle on {tasks}, {args.max_turns} turns, {args.max_tokens} tokens "
        f"per reply, temperature {args.temperature}",
        "| cycle | status | sessions | edit kept [95% CI] | reward | on-policy | collect s | train s | eval+gate s "
        "| deploy s | total s | eval (candidate / baseline) | serving |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in results["cycles"]:
        kept = c["edit_kept"]
        ph = c["phases"]
        evals = "; ".join(
            f"{name.split('-')[1]} {d['candidate']} / {d['baseline']}" for name, d in (c["eval"] or {}).items()
        )

        def sec(name: str, ph: dict[str, Any] = ph) -> str:
            return f"{ph[name]:.0f}" if ph.get(name) is not None else "–"

        lines.append(
            f"| {c['cycle']}{' (lr 1.0)' if c['degraded'] else ''} | {c['status']} | {c['sessions']} | "
            f"{kept['hits']}/{kept['n']} [{kept['low']:.2f}, {kept['high']:.2f}] | "
            f"{c['reward_mean'] if c['reward_mean'] is None else round(c['reward_mean'], 3)} | "
            f"{c['on_policy_share'] if c['on_policy_share'] is None else round(c['on_policy_share'], 2)} | "
            f"{sec('collect')} | {sec('train')} | {sec('evaluate')} | {sec('deploy')} | "
            f"{c['seconds']:.0f} | {evals} | {c['served_before']} → {c['served_after']} |"
        )
    lines.append(
        f"median cycle time (deployed cycles): {results['median_cycle_seconds']} s; degraded candidate blocked: "
        f"{results['degraded_blocked']}; serving stayed on the previous version: {results['serving_stayed']}; "
        f"load average {', '.join(f'{x:.1f}' for x in results['load_average'])}"
    )
    if (rise := results["first_vs_last"]) is not None:
        lines.append(
            f"edit kept, first normal cycle vs last: {rise['first']} -> {rise['last']}, difference "
            f"{rise['difference']:+.3f}; two-proportion z {rise['z']:.2f}, one-sided p (a rise) {rise['p_rise']:.3f}, "
            f"two-sided p {rise['p_two_sided']:.3f}; Fisher exact one-sided p {rise['fisher_p_rise']:.3f}"
        )
    text = "\n".join(lines) + "\n"
    args.out.with_suffix(".txt").write_text(text)
    print(text)


def rise_test(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """The edit-kept rate of the last normal cycle against the first's (`hits` of `n` sessions each): the pooled
    two-proportion z test (one-sided for a rise, and two-sided) and Fisher's exact test (one-sided)."""
    import math

    from scipy import stats

    h1, n1, h2, n2 = first["hits"], first["n"], last["hits"], last["n"]
    p1, p2 = h1 / n1 if n1 else 0.0, h2 / n2 if n2 else 0.0
    pooled = (h1 + h2) / (n1 + n2) if n1 + n2 else 0.0
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2)) if n1 and n2 else 0.0
    z = (p2 - p1) / se if se else 0.0
    _, fisher = stats.fisher_exact([[h2, n2 - h2], [h1, n1 - h1]], alternative="greater")
    return {
        "first": f"{h1}/{n1}",
        "last": f"{h2}/{n2}",
        "difference": p2 - p1,
        "z": z,
        "p_rise": float(stats.norm.sf(z)) if se else 1.0,
        "p_two_sided": float(2 * stats.norm.sf(abs(z))) if se else 1.0,
        "fisher_p_rise": float(fisher),
    }


def import_tasks(args: argparse.Namespace, user: Any, stamp: str) -> tuple[Any, list[dict[str, Any]]]:
    """--tasks-dir's rows as a repo_tasks dataset of the users' tasks (the train split, the first --task-count by
    id) and the held-out split's rows (for the gate's coding benchmark)."""
    import hashlib

    from apps.datasets.services import dataset_create, repo_tasks_version_create

    def held_out(task_id: str) -> bool:  # bench/coding_learning_check.py's split
        return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 100 < args.held_out_percent

    rows = [json.loads(line) for line in (args.tasks_dir / "tasks.jsonl").read_text().splitlines() if line.strip()]
    train = sorted((r for r in rows if not held_out(r["id"])), key=lambda r: r["id"])
    test = sorted((r for r in rows if held_out(r["id"])), key=lambda r: r["id"])
    if args.task_count:
        train = train[: args.task_count]
    if not train or not test:
        raise SystemExit(f"{args.tasks_dir}: {len(train)} train and {len(test)} held-out tasks")
    dataset = dataset_create(name=f"rt-check-tasks-{stamp}", kind="repo_tasks", owner=user)
    data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in train).encode()
    version = repo_tasks_version_create(
        dataset=dataset, data=data, created_by=user, notes=f"{len(train)} train tasks of {args.tasks_dir}"
    )
    log(f"imported {len(train)} train tasks of {args.tasks_dir} ({len(test)} held out)")
    return version, test


if __name__ == "__main__":
    main()
