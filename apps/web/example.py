"""The example run `make run` starts on a fresh installation, so the first screen shows the product working: a
short real GRPO run of SmolLM2-135M on the demo arithmetic tasks (the real trainer on Ray, its charts, trajectories
and checkpoints), its base model and every checkpoint evaluated on a held-out arithmetic benchmark (auto-eval), so
its page answers "did it learn?" with the paired difference (docs/did-it-learn.md), and a gate on that benchmark to
check the last checkpoint against. The slow e2e test measures how long it takes; idempotent."""

from __future__ import annotations

import json

from apps.accounts.models import Role, User
from apps.benchmarks.models import Benchmark, BenchmarkVersion
from apps.benchmarks.services import benchmark_create, benchmark_rows_from_dataset, benchmark_version_create
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.services import dataset_create, dataset_version_create
from apps.gates.models import Gate
from apps.gates.services import gate_create
from apps.rewards.models import RewardConfigVersion
from apps.runs.models import Run
from apps.training.services import run_launch_train
from workers.rl.example_recipe import EXAMPLE_CONFIG, EXAMPLE_HELDOUT_TASKS, example_split

EXAMPLE_TAG = "example"
EXAMPLE_BENCHMARK = "demo-arithmetic-heldout"
EXAMPLE_GATE = "arithmetic-demo"
EXAMPLE_DATASET = "example-arithmetic"


def _training(admin: User) -> DatasetVersion:
    existing = DatasetVersion.objects.filter(dataset__name=EXAMPLE_DATASET).order_by("-number").first()
    if existing is not None:
        return existing
    dataset = Dataset.objects.filter(name=EXAMPLE_DATASET).first() or dataset_create(
        name=EXAMPLE_DATASET,
        kind=DatasetKind.TASKS,
        owner=admin,
        description="The example run's training tasks: one-digit sums, and sums and differences up to 20 that "
        f"{EXAMPLE_BENCHMARK} does not hold",
    )
    rows, _ = example_split()
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    return dataset_version_create(
        dataset=dataset, data=data, filename="tasks.jsonl", created_by=admin, notes="made by apps.web.example"
    )


def _benchmark(admin: User, training: DatasetVersion) -> BenchmarkVersion:
    benchmark = Benchmark.objects.filter(name=EXAMPLE_BENCHMARK).first() or benchmark_create(
        name=EXAMPLE_BENCHMARK,
        environment="exact_answer",
        owner=admin,
        description=f"{EXAMPLE_HELDOUT_TASKS} sums and differences up to 20 that {EXAMPLE_DATASET} does not hold: the "
        "example run's held-out check (the contamination guard refuses a training run whose tasks a gating benchmark "
        "shares)",
    )
    version = BenchmarkVersion.objects.filter(benchmark=benchmark).order_by("-number").first()
    if version is None:
        seen = {row.get("prompt") for row in benchmark_rows_from_dataset(training)}
        _, held_out = example_split()
        version, _ = benchmark_version_create(
            benchmark=benchmark,
            tasks=[row for row in held_out if row["prompt"] not in seen],
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
    reward = RewardConfigVersion.objects.filter(config__name="exact-answer").order_by("-number").first()
    if reward is None:
        return "example run: the demo data is missing (run crucible_demo first)"
    tasks = _training(admin)
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
        name="Example: GRPO of SmolLM2-135M on sums and differences",
        tags=[EXAMPLE_TAG],
        auto_eval=[version],
    )
    return (
        f"example run: run {run.pk} trains SmolLM2-135M with GRPO for {EXAMPLE_CONFIG['steps']} steps (minutes, "
        f"with its evals); it and its base model are evaluated on {EXAMPLE_BENCHMARK}, and its page says whether it "
        f"learned; check the last checkpoint against the gate {EXAMPLE_GATE}"
    )
