"""Environments by name (what a run spec's `env` field names) and toy task generators for tests and demos."""

from __future__ import annotations

import importlib
import inspect
import os
import random
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from workers.discovery import domain_modules
from workers.envs.base import Environment
from workers.envs.calculator import CalculatorEnv
from workers.envs.coding import CodingEnv
from workers.envs.exact_answer import ExactAnswerEnv
from workers.storage import STORAGE_OPTIONS

GENERIC_ENVIRONMENTS: tuple[type[Environment], ...] = (ExactAnswerEnv, CalculatorEnv, CodingEnv)
"""The environments of this package; each domain package adds its own in `workers/<domain>/environment.py`."""

EXTRA_ENVIRONMENTS_VAR = "CRUCIBLE_ENVIRONMENTS"


def domain_environments() -> list[type[Environment]]:
    """Every environment class a domain package defines in its `environment` module (`workers.discovery`)."""
    return [
        obj
        for module in domain_modules("environment")
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, Environment)
        and obj.__module__ == module.__name__
        and not inspect.isabstract(obj)
        and "name" in vars(obj)
    ]


def builtin_environments() -> dict[str, type[Environment]]:
    """This package's environments and the domain packages': name -> class. Two classes under one name are
    refused by name, since a run would get one of them silently."""
    found: dict[str, type[Environment]] = {}
    for cls in (*GENERIC_ENVIRONMENTS, *domain_environments()):
        if cls.name in found:
            first = found[cls.name]
            raise ImportError(
                f"environment name {cls.name!r} is taken twice: {first.__module__}.{first.__name__} "
                f"and {cls.__module__}.{cls.__name__}"
            )
        found[cls.name] = cls
    return found


def load_extra_environments(
    spec: str, known: Mapping[str, type[Environment]] | None = None
) -> dict[str, type[Environment]]:
    """Environments from your own code, without editing Crucible: `spec` is comma-separated `module:Class`
    (importable where the control plane and the Ray jobs run; the control plane hands the variable to its jobs).
    Each class must subclass `Environment` and have a `name` no built-in one (`known`; by default
    `builtin_environments()`) has."""
    taken = builtin_environments() if known is None else known
    found: dict[str, type[Environment]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        module_name, _, class_name = item.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ImportError(f"{EXTRA_ENVIRONMENTS_VAR}: cannot load {item!r} (write module:Class): {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise ImportError(f"{EXTRA_ENVIRONMENTS_VAR}: {item!r} is not a workers.envs.base.Environment subclass")
        if cls.name in taken or cls.name in found:
            raise ImportError(f"{EXTRA_ENVIRONMENTS_VAR}: {item!r} is named {cls.name!r}, a name already taken")
        found[cls.name] = cls
    return found


def discover() -> dict[str, type[Environment]]:
    """Every environment a run may name: the built-in ones and those `CRUCIBLE_ENVIRONMENTS` adds."""
    found = builtin_environments()
    found.update(load_extra_environments(os.environ.get(EXTRA_ENVIRONMENTS_VAR, ""), found))
    return found


class EnvironmentRegistry(MutableMapping[str, type[Environment]]):
    """`ENVIRONMENTS`: name -> class, discovered on first use. Lazily, because the domain packages' environments
    import `workers.envs` themselves: discovering them while `workers.envs` is being imported would be a cycle."""

    def __init__(self) -> None:
        self._found: dict[str, type[Environment]] | None = None

    def _all(self) -> dict[str, type[Environment]]:
        if self._found is None:
            self._found = discover()
        return self._found

    def __getitem__(self, name: str) -> type[Environment]:
        return self._all()[name]

    def __setitem__(self, name: str, cls: type[Environment]) -> None:
        self._all()[name] = cls

    def __delitem__(self, name: str) -> None:
        del self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


ENVIRONMENTS = EnvironmentRegistry()
"""Every environment a run may name (`discover`): the built-in ones and those `CRUCIBLE_ENVIRONMENTS` adds."""


def configure_storage(options: Mapping[str, Any]) -> None:
    """Hand the job's storage options (fsspec: credentials, endpoint) to the environments that read from object
    storage themselves (`workers.storage.STORAGE_OPTIONS`: search loads its index, coding_agent its repository
    snapshots). A job calls this once."""
    STORAGE_OPTIONS.update(options)


def environment_choices() -> list[tuple[str, str]]:
    """(name, description) of every environment, sorted by name, for UI help text and form choices."""
    return [(name, ENVIRONMENTS[name].description) for name in sorted(ENVIRONMENTS)]


def environment_params(name: str) -> dict[str, Any]:
    """The keyword parameters environment `name` takes, with their defaults (`inspect.Parameter.empty` if none)."""
    cls = get_environment(name)
    return {
        param.name: param.default
        for param in inspect.signature(cls.__init__).parameters.values()
        if param.kind is inspect.Parameter.KEYWORD_ONLY
    }


def get_environment(name: str) -> type[Environment]:
    """The environment class registered as `name`; ValueError listing the choices when there is none."""
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; choose one of: {', '.join(sorted(ENVIRONMENTS))}")


def make_env(name: str, **params: Any) -> Environment:
    """A new environment `name` built with `params` (e.g. max_turns=8).

    Raises ValueError for an unknown name (listing the choices), a parameter the environment does not take
    (listing those it takes) or a bad parameter value.
    """
    cls = get_environment(name)
    accepted = environment_params(name)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"environment {name!r} takes no parameter {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(accepted) or 'none'}"
        )
    missing = [name for name, default in accepted.items() if default is inspect.Parameter.empty and name not in params]
    if missing:
        raise ValueError(
            f"environment {name!r} needs parameter {', '.join(map(repr, missing))} in env_params "
            "(for 'search', index_uri is filled in at launch from the corpus version's index)"
        )
    return cls(**params)


DIFFICULTIES = (1, 2, 3)


def _arithmetic_question(rng: random.Random, difficulty: int) -> tuple[str, int]:
    if difficulty == 1:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"{a} + {b}", a + b
    if difficulty == 2:
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        if rng.random() < 0.5:
            return f"{a} + {b}", a + b
        high, low = max(a, b), min(a, b)
        return f"{high} - {low}", high - low
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"{a} * {b}", a * b
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if op == "+":
        return f"{a} + {b}", a + b
    high, low = max(a, b), min(a, b)
    return f"{high} - {low}", high - low


def arithmetic_tasks(n: int, seed: int = 0, difficulty: int = 1) -> list[dict[str, Any]]:
    """`n` exact-answer task rows ({"id", "prompt", "answer"}) such as "What is 7 + 5? Answer with just the
    number." -> "12", for the exact_answer environment.

    Difficulty 1: sums of two digits; 2: sums and differences up to 20; 3: two-digit sums and differences and
    products up to 12 x 12. Answers are never negative. The same (n, seed, difficulty) gives the same rows, and
    a longer list extends a shorter one with the same seed.
    """
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"arithmetic-{seed}-{difficulty}")
    rows: list[dict[str, Any]] = []
    for index in range(n):
        expression, answer = _arithmetic_question(rng, difficulty)
        rows.append(
            {
                "id": f"arith-d{difficulty}-s{seed}-{index}",
                "prompt": f"What is {expression}? Answer with just the number.",
                "answer": str(answer),
            }
        )
    return rows
