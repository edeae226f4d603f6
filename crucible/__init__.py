"""Crucible's SDK: report a training run that runs elsewhere (TRL, verl, your own loop) to a Crucible server, so it
gets Crucible's live charts, trajectory viewer, detectors, review queue, evals and gates.

    import crucible
    run = crucible.init("my-project", "grpo-lr3e-6", config={"lr": 3e-6}, base_model="org/model")
    run.log({"reward": 0.41}, step=1)
    run.log_trajectories([{"task_id": "t1", "messages": [...], "reward": 1.0, "terms": {"correct": 1.0}}], step=1)
    run.log_checkpoint("out/checkpoint-100", step=100)
    run.finish()

TRL: `crucible.trl.CrucibleCallback` (docs/external-runs.md).
"""

from crucible.run import CrucibleError, Run, init

__all__ = ["CrucibleError", "Run", "init"]
