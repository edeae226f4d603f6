"""Checks at run creation: whether an environment can serve a dataset's rows and a reward config's terms, so a
run that pairs them wrongly is refused when it is created, not hours into training."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from workers.envs.base import Environment, TaskFieldError
from workers.rewards.schema import RewardSpec, validate_reward_spec

EnvLike = Environment | type[Environment]


def check_reward_compatible(env: EnvLike, reward_spec: RewardSpec | Mapping[str, Any]) -> list[str]:
    """Problems that keep `reward_spec` from scoring `env`'s trajectories; [] when they fit.

    Each problem names the term, what it reads and what the environment produces. `reward_spec` may be a
    `RewardSpec` or its JSON dict (an invalid dict raises `RewardSpecError`).
    """
    spec = validate_reward_spec(reward_spec)
    produced = ", ".join(sorted(env.produces))
    offered = {tool.name for tool in env.tools}
    problems: list[str] = []
    for index, term in enumerate(spec.terms):
        label = f"terms[{index}] ({term.type}" + (f" '{term.name}')" if term.name != term.type else ")")
        needs = term.reads
        if not any(option <= env.produces for option in needs.fields):
            wanted = " or ".join(", ".join(sorted(option)) for option in needs.fields)
            problems.append(
                f"{label}: reads {wanted}, which environment '{env.name}' does not produce "
                f"(it produces {produced}); remove the term or pick an environment that fills those fields"
            )
        missing_tools = sorted(needs.tools - offered)
        if missing_tools:
            problems.append(
                f"{label}: counts calls to {', '.join(missing_tools)}, a tool environment '{env.name}' does not "
                f"offer (tools: {', '.join(sorted(offered)) or 'none'}), so it would always be 0; remove the term"
            )
    return problems


def check_task_fields(env: EnvLike, fields: Iterable[str]) -> list[str]:
    """Problems with a dataset version whose rows have `fields` (e.g. its schema's columns); [] when it fits."""
    present = set(fields)
    return [
        f"the dataset has no field '{name}', which environment '{env.name}' needs in every task row "
        f"(required: {', '.join(sorted(env.required_task_fields))})"
        for name in sorted(env.required_task_fields - present)
    ]


def check_task_rows(env: EnvLike, rows: Iterable[object], *, max_errors: int = 20) -> list[str]:
    """Validate dataset rows for `env`; returns up to `max_errors` messages, each naming the row and field."""
    problems: list[str] = []
    for index, row in enumerate(rows, start=1):
        try:
            env.validate_task_row(row, index=index)
        except TaskFieldError as exc:
            problems.append(str(exc))
            if len(problems) >= max_errors:
                break
    return problems
