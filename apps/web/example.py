"""The example run `make run` starts on a fresh installation, so the first screen shows the product working: a
short real GRPO run of SmolLM2-135M on the demo arithmetic tasks (the real trainer on Ray, its charts, trajectories
and checkpoints), its base model and every checkpoint evaluated on a held-out arithmetic benchmark (auto-eval), so
its page answers "did it learn?" with the paired difference (docs/did-it-learn.md), and a gate on that benchmark to
check the last checkpoint against. The slow e2e test measures how long it takes; idempotent."""

from __future__ import annotations

from apps.accounts.models import Role, User
from apps.benchmarks.models import Benchmark, BenchmarkVersion
from apps.benchmarks.services import benchmark_create, benchmark_rows_from_dataset, benchmark_version_create
from apps.datasets.models import DatasetVersion
from apps.gates.models import Gate
from apps.gates.services import gate_create
from apps.rewards.models import RewardConfigVersion
from apps.runs.models import Run
from apps.training.services import run_launch_train
from workers.envs.registry import arithmetic_tasks

EXAMPLE_TAG = "example"
EXAMPLE_BENCHMARK = "demo-arithmetic-heldout"
EXAMPLE_GATE = "arithmetic-demo"
EXAMPLE_CONFIG = {
    "base_model": "smollm2-135m-instruct",
    "environment": "exact_answer",
    "algorithm": "grpo",
    "steps": 12,
    "prompts_per_step": 4,
    "group_size": 8,
    "learning_rate": 1e-3,
    "lora": {"rank": 16, "alpha": 32},
    "checkpoint_every": 6,
    "sampling": {"max_new_tokens": 24},
    "env_params": {"answer_format": "last_number"},
}
"""Chosen so that a newcomer sees learning on 2 cores (measured in process, 2026-11-28, seed 0): SmolLM2-135M
sampled at temperature 1 gets about a fifth of the one-digit sums right, rambling past the 24-token budget; groups
of 8 hold right and wrong answers from the first step, and LoRA at 1e-3 takes the step reward from 0.19 to 0.8-0.97
within 10 steps by answering briefly ("9 + 0 = 9"). On 128 held-out sums and differences up to 20 (greedy, 24
tokens) the last checkpoint answered 0.45 against the base model's 0.34 (29 tasks gained, 14 lost, McNemar p =
0.03). LoRA keeps the optimizer state small; the learning rate is LoRA's usual range, not full fine-tuning's."""

EXAMPLE_HELDOUT_TASKS = 128
"""Held-out tasks: enough for a paired test to see a gain of about a tenth (32 could not: p = 0.1 at 64)."""


def _benchmark(admin: User, training: DatasetVersion) -> BenchmarkVersion:
    benchmark = Benchmark.objects.filter(name=EXAMPLE_BENCHMARK).first() or benchmark_create(
        name=EXAMPLE_BENCHMARK,
        environment="exact_answer",
        owner=admin,
        description=f"{EXAMPLE_HELDOUT_TASKS} sums and differences up to 20 that demo-arithmetic does not hold: the "
        "example run's held-out check (the contamination guard refuses a training run whose tasks a gating benchmark "
        "shares)",
    )
    version = BenchmarkVersion.objects.filter(benchmark=benchmark).order_by("-number").first()
    if version is None:
        seen = {row.get("prompt") for row in benchmark_rows_from_dataset(training)}
        fresh = [row for row in arithmetic_tasks(400, seed=101, difficulty=2) if row["prompt"] not in seen]
        unique = {row["prompt"]: {**row, "id": f"heldout-{row['id']}"} for row in fresh}
        tasks = list(unique.values())[:EXAMPLE_HELDOUT_TASKS]
        version, _ = benchmark_version_create(
            benchmark=benchmark,
            tasks=tasks,
            created_by=admin,
            env_params={"answer_format": "last_number"},
            notes="made by the example run (apps.web.example)",
        )
    return version


def start_example_run() -> str:
    """Start the example run unless one exists (any state); create its benchmark and gate first. Returns what it
    did, for the console."""
    admin = User.objects.filter(role=Role.ADMIN).order_by("pk").first()
    if admin is None:
        return "example run: no admin user yet (run crucible_demo first)"
    existing = Run.objects.filter(tags__contains=[EXAMPLE_TAG], kind="train").order_by("pk").first()
    if existing is not None:
        return f"example run: run {existing.pk} ({existing.status})"
    tasks = DatasetVersion.objects.filter(dataset__name="demo-arithmetic").order_by("-number").first()
    reward = RewardConfigVersion.objects.filter(config__name="exact-answer").order_by("-number").first()
    if tasks is None or reward is None:
        return "example run: the demo data is missing (run crucible_demo first)"
    version = _benchmark(admin, tasks)
    if not Gate.objects.filter(name=EXAMPLE_GATE).exists():
        gate_create(
            name=EXAMPLE_GATE,
            description="Example gate: a checkpoint ships if it answers at least a fifth of the held-out sums and "
            "differences and an approver agrees",
            rules=[{"type": "threshold", "benchmark": EXAMPLE_BENCHMARK, "metric": "pass@1", "op": ">=", "value": 0.2}],
            benchmark_versions=[version],
            requires_approval=True,
            max_new_tokens=24,
            owner=admin,
        )
    run = run_launch_train(
        created_by=admin,
        dataset_version=tasks,
        reward_version=reward,
        config=dict(EXAMPLE_CONFIG),
        name="Example: GRPO of SmolLM2-135M on one-digit sums",
        tags=[EXAMPLE_TAG],
        auto_eval=[version],
    )
    return (
        f"example run: run {run.pk} trains SmolLM2-135M with GRPO for {EXAMPLE_CONFIG['steps']} steps (minutes, "
        f"with its evals); it and its base model are evaluated on {EXAMPLE_BENCHMARK}, and its page says whether it "
        f"learned; check the last checkpoint against the gate {EXAMPLE_GATE}"
    )
