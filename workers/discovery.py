"""What the domain packages contribute to the registries below them, found by a module's name.

The environment and detector registries sit low in `workers/` (the RL runtime and the jobs read them) while the
environments and detectors of a domain live in its own package (`workers/coding/environment.py`,
`workers/coding/detectors/`), above the registries. A registry therefore never imports a domain package by name:
it asks for `workers.<package>.<name>` of every package that has one. Adding an environment or a detector touches
its own package only (docs/architecture.md, "Workers in layers").
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import workers


def domain_modules(name: str) -> list[ModuleType]:
    """`workers.<package>.<name>` (a module or a package) of every package of `workers/` that has one, imported,
    in the packages' name order. The check looks at the files, so a package without one is not imported."""
    found: dict[str, ModuleType] = {}
    for folder in map(Path, workers.__path__):
        for info in sorted(pkgutil.iter_modules([str(folder)]), key=lambda item: item.name):
            package = folder / info.name
            if info.ispkg and ((package / f"{name}.py").is_file() or (package / name / "__init__.py").is_file()):
                found.setdefault(info.name, importlib.import_module(f"workers.{info.name}.{name}"))
    return [found[package] for package in sorted(found)]


def submodules(package: ModuleType) -> list[ModuleType]:
    """Every public module of `package` (names not starting with `_`), imported, in name order."""
    return [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda item: item.name)
        if not info.name.startswith("_")
    ]
