"""Two tiny repository tasks with inline repositories, and scripted agents that solve them, break them or ask."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.workers.simulator.standins import Policy, Reply, instruction_of, turn_of

GOOD = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
BUGS = {
    "calc-add": ("def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b"),
    "calc-mul": ("def mul(a, b):\n    return a + b", "def mul(a, b):\n    return a * b"),
}
INSTRUCTIONS = {"calc-add": "add() gives the wrong result. Fix it.", "calc-mul": "mul() is broken. Fix it."}
TASK_OF = {text: task for task, text in INSTRUCTIONS.items()}
HIDDEN = {
    "calc-add": ("def test_add():\n    assert add(1, 2) == 3\n", "def test_add_zero():\n    assert add(0, 0) == 0\n"),
    "calc-mul": ("def test_mul():\n    assert mul(2, 3) == 6\n", "def test_mul_zero():\n    assert mul(0, 0) == 0\n"),
}
QUESTION = "Which function do you want me to change, and how?"


def task_row(task_id: str, **extra: Any) -> dict[str, Any]:
    bug, fixed = BUGS[task_id]
    name = task_id.split("-")[1]
    fail, keep = HIDDEN[task_id]
    return {
        "id": task_id,
        "prompt": INSTRUCTIONS[task_id],
        "answer": None,
        "repo": {"files": {"calc/__init__.py": "", "calc/ops.py": GOOD.replace(fixed, bug)}},
        "hidden_tests": {
            "files": {"tests/test_hidden.py": f"from calc.ops import {name}\n\n\n{fail}\n\n{keep}"},
            "fail_to_pass": [f"tests/test_hidden.py::test_{name}"],
            "pass_to_pass": [f"tests/test_hidden.py::test_{name}_zero"],
        },
        **extra,
    }


def write_tasks(folder: Path, *task_ids: str) -> str:
    """The tasks as a JSONL file; its URI."""
    path = folder / "tasks.jsonl"
    rows = [task_row(t, family="repair") if t == "calc-add" else task_row(t) for t in task_ids]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return f"file://{path}"


def scripted(modes: dict[str, str]) -> Policy:
    """An agent that, per task, fixes it ("fix": reads the file and edits it in one reply, then finishes), breaks it
    ("wrong": an edit that fails the hidden test), or asks a question without touching anything ("ask")."""

    def policy(body: dict[str, Any], headers: dict[str, str]) -> Reply:
        task = TASK_OF[instruction_of(body)]
        mode, turn = modes[task], turn_of(body)
        bug, fixed = BUGS[task]
        if mode == "ask":
            return Reply(content=QUESTION)
        if turn == 0:
            replace = fixed if mode == "fix" else bug.replace("return a", "return 7 + a")
            edit = {"path": "calc/ops.py", "search": bug, "replace": replace}
            return Reply(content="Let me look.", calls=[("read_file", {"path": "calc/ops.py"}), ("edit_file", edit)])
        return Reply(calls=[("finish", {"message": f"I changed {task.split('-')[1]}()."})])

    return policy
