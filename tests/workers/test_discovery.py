"""Registries find what a domain package contributes (workers/discovery.py): a new package with an
`environment.py` and a `detectors/` folder is picked up with no edit anywhere else, and a clash is refused."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import workers
from workers.detectors import registry as detector_registry
from workers.discovery import domain_modules
from workers.envs import registry as env_registry

ENVIRONMENT = """
from typing import ClassVar

from workers.envs.base import Environment, StepResult


class EchoEnv(Environment):
    name: ClassVar[str] = "{name}"
    description: ClassVar[str] = "Says back what it is told (a test package)."

    def __init__(self) -> None:
        super().__init__(max_turns=1)

    def step(self, action_text: str) -> StepResult:
        self._begin_step(action_text)
        self._finish(answer=action_text)
        return StepResult(None, True, self._info(tool_calls=0, malformed_tool_calls=0, tool_errors=0))
"""

DETECTOR = """
from typing import Any, ClassVar

from workers.detectors.base import DetectorParams, TrajectoryDetector


class SaysNothing(TrajectoryDetector[DetectorParams]):
    name: ClassVar[str] = "says_nothing"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "Flags nothing (a test package)."
    Params = DetectorParams

    def detect(self, record: Any, params: DetectorParams) -> list:
        return []
"""


@pytest.fixture
def domain_package(tmp_path, monkeypatch):
    """A package `workers.zz_echo` that lives in a temporary folder, as a new domain package would."""
    root = tmp_path / "workers"

    def write(name: str = "echo") -> Path:
        package = root / "zz_echo"
        (package / "detectors").mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("")
        (package / "environment.py").write_text(textwrap.dedent(ENVIRONMENT.format(name=name)))
        (package / "detectors" / "__init__.py").write_text("")
        (package / "detectors" / "says_nothing.py").write_text(textwrap.dedent(DETECTOR))
        return package

    monkeypatch.setattr(workers, "__path__", [*workers.__path__, str(root)])
    yield write
    for name in [m for m in sys.modules if m.startswith("workers.zz_echo")]:
        del sys.modules[name]


def test_a_new_domain_package_adds_its_environment_and_detector(domain_package):
    domain_package()
    assert "workers.zz_echo.environment" in [module.__name__ for module in domain_modules("environment")]
    environments = env_registry.builtin_environments()
    assert environments["echo"].__module__ == "workers.zz_echo.environment"
    assert {"coding_agent", "search", "swarm", "exact_answer"} <= set(environments)
    assert "says_nothing" in detector_registry.discover()
    assert "edits_tests" in detector_registry.discover()


def test_two_environments_under_one_name_are_refused_by_name(domain_package):
    domain_package(name="search")
    with pytest.raises(ImportError, match="'search' is taken twice"):
        env_registry.builtin_environments()


def test_the_shipped_domain_packages_contribute_the_recipes():
    environments = {cls.name: cls.__module__ for cls in env_registry.domain_environments()}
    assert environments == {
        "coding_agent": "workers.coding.environment",
        "search": "workers.search.environment",
        "swarm": "workers.swarm.environment",
    }
    assert [m.__name__ for m in domain_modules("detectors")] == [
        "workers.coding.detectors",
        "workers.search.detectors",
        "workers.swarm.detectors",
    ]
