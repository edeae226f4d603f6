"""Ray job entrypoints (`python -m workers.jobs.<name>`). Each reads its JSON spec from CRUCIBLE_JOB_SPEC."""
