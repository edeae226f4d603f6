"""Test data built through the services, so tests exercise the same paths users do."""

from __future__ import annotations

from apps.accounts.models import User
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.datasets.services import dataset_create, dataset_version_create
from apps.rewards.models import RewardConfigVersion
from apps.rewards.services import reward_config_create
from workers.rewards.schema import context1_spec


def trajectories_version(*, owner: User, data: bytes, name: str = "trajs") -> DatasetVersion:
    dataset = dataset_create(name=name, kind=DatasetKind.TRAJECTORIES, description="", owner=owner)
    return dataset_version_create(dataset=dataset, data=data, filename="t.jsonl", created_by=owner)


def context1_version(*, owner: User, name: str = "ctx1") -> RewardConfigVersion:
    config = reward_config_create(name=name, description="", spec=context1_spec().model_dump(mode="json"), owner=owner)
    return config.versions.get()


def tasks_version(*, owner: User, rows: list[dict[str, object]], name: str = "tasks") -> DatasetVersion:
    import json

    dataset = dataset_create(name=name, kind=DatasetKind.TASKS, description="", owner=owner)
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    return dataset_version_create(dataset=dataset, data=data, filename="tasks.jsonl", created_by=owner)


def exact_answer_version(*, owner: User, name: str = "exact") -> RewardConfigVersion:
    spec = {"terms": [{"type": "normalized_match"}]}
    return reward_config_create(name=name, description="", spec=spec, owner=owner).versions.get()


# --- benchmarks, evals and checkpoints ------------------------------------------------------------------------------

CODING_ROWS = [
    {
        "id": f"add-{n}",
        "prompt": f"Write add_{n}(x) returning x + {n}.",
        "code_prompt": f"def add_{n}(x):\n    '''x + {n}'''\n",
        "test": f"def check(candidate):\n    assert candidate(1) == {1 + n}\n",
        "entry_point": f"add_{n}",
        "difficulty": "easy" if n < 3 else "hard",
        "tags": ["arith", "even"] if n % 2 == 0 else ["arith"],
    }
    for n in range(12)
]


def coding_version(*, owner: User, name: str = "mini-coding", rows: list[dict[str, object]] | None = None):  # type: ignore[no-untyped-def]
    from apps.benchmarks.models import Benchmark
    from apps.benchmarks.services import benchmark_create, benchmark_version_create

    benchmark = Benchmark.objects.filter(name=name).first() or benchmark_create(
        name=name, environment="coding", owner=owner
    )
    version, _ = benchmark_version_create(benchmark=benchmark, tasks=rows or CODING_ROWS, created_by=owner)
    return version


def checkpoint_for(*, owner: User, tmp_path, step: int = 1, base_model: str = "tiny-llama-smollm2-tokenizer"):  # type: ignore[no-untyped-def]
    """A training run's checkpoint row whose file exists (content is not read by control-plane tests)."""
    from apps.runs.models import Checkpoint, Run

    path = tmp_path / f"ckpt-{step}-{owner.pk}.pt"
    path.write_bytes(b"checkpoint")
    run = Run.objects.create(kind="train", spec={"config": {"base_model": base_model}}, created_by=owner)
    return Checkpoint.objects.create(run=run, step=step, uri=f"file://{path}")


def finish_eval(evaluation, results: dict[str, tuple[int, int]], status: str = "succeeded") -> None:  # type: ignore[no-untyped-def]
    """Play an eval job's end: ingest one task_result event per task ((samples, passed)), then mark the run
    finished and run the success hook, as the reconcile loop and Celery would."""
    from apps.runs.models import Run
    from apps.runs.services import ingest_batch
    from workers.events import EVENTS_LIST

    events = EVENTS_LIST.validate_python(
        [
            {"seq": i, "kind": "task_result", "task_id": task, "samples": n, "passed": c, "score": c / n}
            for i, (task, (n, c)) in enumerate(results.items(), start=1)
        ]
    )
    if events:
        ingest_batch(run_id=evaluation.run_id, events=events, publish=False)
    Run.objects.filter(pk=evaluation.run_id).update(
        status=status, failure_reason="" if status == "succeeded" else "boom"
    )
    if status == "succeeded":
        play_lifecycle(evaluation.run_id, "succeeded")


def play_lifecycle(run_id: int, point: str, steps: list[int] | None = None) -> list[str]:
    """Run a lifecycle point's hooks in this process as the Celery tasks would (apps.runs.tasks.run_lifecycle):
    the owning app's hook, then each subscriber. Returns the subscribers' names."""
    from apps.runs.services import run_owner_hook, run_subscriber_hook

    names = run_owner_hook(run_id=run_id, point=point, steps=steps or [])  # type: ignore[arg-type]
    for name in names:
        run_subscriber_hook(run_id=run_id, point=point, name=name, steps=steps or [])  # type: ignore[arg-type]
    return names
