"""The fault drill against a live `make run` (issue 16): kill its processes during a real training run, count
what survives. The same drill as tests/faults/test_kills.py (`controlplane.faultdrill`).

    make run            # in one terminal
    python bench/fault_drill.py [--var var]

It reads the stack from var/stack.json and the supervised processes from var/pids.json (both written by
`make run`), creates a user `fault-drill`, a small arithmetic task set and an exact-answer reward, launches a GRPO run
on the tiny model and, in turn: SIGKILLs the Celery worker, the embedded Redis (when `make run` started one) and
daphne; then stops daphne just before a checkpoint is written and SIGKILLs the job's driver; then resumes the run.
Figures are printed and written to bench/results/fault_drill.txt. Kill only a stack you can spare.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--var", type=Path, default=ROOT / "var", help="the var dir of the make run to drill")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    stack = json.loads((args.var / "stack.json").read_text())
    os.environ.update({k: v for k, v in stack.items() if k != "web"})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.conf import settings

    from apps.accounts.models import User
    from apps.accounts.services import api_token_create
    from apps.datasets.models import DatasetKind
    from apps.datasets.services import dataset_create, dataset_version_create
    from apps.rewards.services import reward_config_create
    from controlplane import faultdrill
    from workers.envs.registry import arithmetic_tasks

    user = User.objects.filter(username="fault-drill").first() or User.objects.create_user(
        username="fault-drill", password=os.urandom(16).hex(), role="operator"
    )
    _, token = api_token_create(user=user, name=f"drill-{int(time.time())}", scopes=["read", "launch"])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dataset = dataset_create(name=f"drill-tasks-{stamp}", kind=DatasetKind.TASKS, description="fault drill", owner=user)
    rows = "".join(json.dumps(row) + "\n" for row in arithmetic_tasks(16, seed=3)).encode()
    version = dataset_version_create(dataset=dataset, data=rows, filename="tasks.jsonl", created_by=user)
    exact = {"terms": [{"type": "normalized_match"}]}
    reward = reward_config_create(name=f"drill-exact-{stamp}", description="fault drill", spec=exact, owner=user)
    reward_version = reward.versions.get()

    def pid_of(name: str) -> int | None:
        pids = json.loads((args.var / "pids.json").read_text())
        return int(pids[name]) if name in pids else None

    spool = Path(os.environ.get("CRUCIBLE_SPOOL_DIR") or Path.home() / ".crucible" / "spool")
    target = faultdrill.Target(
        web=stack["web"], pid_of=pid_of, media_root=Path(settings.MEDIA_ROOT), spool_dir=spool, api_token=token
    )
    started = time.monotonic()
    figures = faultdrill.drill(
        target,
        dataset_version=version.pk,
        reward_version=reward_version.pk,
        **({"steps": args.steps} if args.steps else {}),
    )
    lines = [
        f"bench/fault_drill.py, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.2f}, {time.monotonic() - started:.0f}s",
        *faultdrill.summary(figures),
    ]
    text = "\n".join(lines) + "\n"
    (ROOT / "bench" / "results" / "fault_drill.txt").write_text(text)
    print("\n" + text)


if __name__ == "__main__":
    main()
