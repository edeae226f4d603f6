"""The trainer job (`python -m workers.jobs.train`): a training run's wiring. It reads the run's task rows from
storage (leaving out excluded tasks), checks them against the environment, and runs `workers.rl.trainer.Trainer`
with the run's reporter."""

from __future__ import annotations

import json
from typing import Any

from workers.envs.registry import get_environment
from workers.jobs.common import load_spec, reporter_for
from workers.jobs.preflight import preflight_models
from workers.reporting import configure_logging
from workers.rl.trainer import Trainer
from workers.specs import TrainSpec
from workers.storage import read_bytes


def run(spec: TrainSpec) -> dict[str, Any]:
    with reporter_for(spec) as reporter:
        preflight_models(spec, reporter)  # the models it names are here, or the run fails now
        env_cls = get_environment(spec.config.environment)
        raw = read_bytes(spec.input_uri, spec.storage_options)
        rows = [json.loads(line) for line in raw.split(b"\n") if line.strip()][: spec.max_rows]
        if spec.exclude_task_ids:
            excluded = set(spec.exclude_task_ids)
            kept = [row for row in rows if str(row.get("id")) not in excluded]
            reporter.log(f"{len(rows) - len(kept)} excluded task(s) left out of training")
            rows = kept
        task_ids = [env_cls.validate_task_row(row, index=index).id for index, row in enumerate(rows, start=1)]
        return Trainer(spec, rows, task_ids, reporter).run()


def main() -> None:
    configure_logging()
    run(load_spec(TrainSpec))


if __name__ == "__main__":
    main()
