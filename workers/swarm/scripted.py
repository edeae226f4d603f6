"""A scripted orchestrator for the swarm environment: the teacher of the SFT warm-up and both sides of the
single-agent vs swarm comparison (`bench/swarm.py`), on machines without a model that can orchestrate.

It reads the task the way a person would, never the gold table:
- a wide task lists its items in backticks and its columns after "columns:"; a task over "every API item that
  document `D` documents" is enumerated first by reading D (`read_document`) and taking the names its headings
  document;
- `mode="swarm"`: one reply creates a `lookup` sub-agent and assigns one task per item (at most `max_parallel` per
  reply, the rest in the next replies), then the table is assembled from the sub-agents' `column: value` lines;
- `mode="single"`: the orchestrator looks every item up itself, one search per reply (and a grep for a heading
  when the search missed it), and assembles the table from what it read;
- a deep task (no table): swarm mode hands the whole question to one sub-agent, single mode searches it; the
  answer lists the chunks seen as `<Document>` items.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from workers.envs.base import Environment, Message
from workers.envs.toolcalls import format_tool_call
from workers.rewards.table import render_markdown_table
from workers.search.tools import GREP_TOOL, READ_TOOL, SEARCH_TOOL
from workers.search.types import Chunk
from workers.search.wide import HEADING_PATTERN, entity_heading, read_attributes
from workers.swarm.environment import ASSIGN_TOOL, CREATE_TOOL
from workers.swarm.subagents import passages

SCRIPTED_SWARM_TEACHER = "scripted-swarm"
"""The SFT job's `teacher_model` value that selects the scripted orchestrator (swarm mode)."""
Mode = Literal["swarm", "single"]
LOOKUP_AGENT = "lookup"
LOOKUP_PROMPT = "You look up one API item in the corpus and report the attributes you are asked for, one per line."
_COLUMNS = re.compile(r"columns:\s*([^\n]+)$", re.IGNORECASE | re.MULTILINE)
_DOCUMENT = re.compile(r"that document `([^`]+)` documents")
_VALUE_LINE = re.compile(r"^([A-Za-z_][\w ]*):\s*(.+)$", re.MULTILINE)


def task_shape(prompt: str) -> tuple[list[str], list[str], str | None]:
    """(items, columns, document to enumerate) of a wide task's prompt; columns [] for a deep task."""
    match = _COLUMNS.search(prompt)
    columns = [c.strip() for c in match.group(1).split("|") if c.strip()] if match else []
    document = _DOCUMENT.search(prompt)
    if document:
        return [], columns, document.group(1)
    head = prompt.split(". For each", 1)[0]
    return re.findall(r"`([^`\n]+)`", head) if columns else [], columns, None


class ScriptedOrchestrator:
    """A deterministic orchestrator policy (`act(messages) -> reply`) for one episode; see the module docstring."""

    name = SCRIPTED_SWARM_TEACHER

    def __init__(self, mode: Mode = "swarm", *, max_parallel: int = 8) -> None:
        self.mode = mode
        self.max_parallel = max_parallel
        self._reset()

    def _reset(self) -> None:
        self.items: list[str] = []
        self.columns: list[str] = []
        self.document: str | None = None
        self.prompt = ""
        self._queue: list[str] = []
        self._created = False
        self._seen: list[tuple[str, str, str]] = []
        self._values: dict[str, dict[str, str]] = {}
        self._retried: set[str] = set()
        self._last: str | None = None
        self._started = False

    def _absorb(self, messages: Sequence[Message]) -> None:
        for message in reversed(messages):
            if message["role"] != "tool":
                break
            content = message["content"]
            self._seen.extend(passages(content))
            if content.startswith("[sub-agent "):
                values = dict((k.strip().replace(" ", "_"), v.strip()) for k, v in _VALUE_LINE.findall(content))
                name = values.get("name")
                if name:
                    self._values[name] = {k: v for k, v in values.items() if v != "not found"}

    def reply(self, messages: Sequence[Message]) -> str:
        """`act`, starting over when `messages` hold no reply yet: one instance plays many episodes in turn (the
        SFT job's teacher interface)."""
        if not any(m["role"] == "assistant" for m in messages):
            self._reset()
        return self.act(messages)

    def act(self, messages: Sequence[Message]) -> str:
        if not self._started:
            self._started = True
            self.prompt = next((m["content"] for m in messages if m["role"] == "user"), "")
            self.items, self.columns, self.document = task_shape(self.prompt)
            self._queue = list(self.items)
            if self.document is not None:
                return format_tool_call(READ_TOOL, {"doc_id": self.document})
        else:
            self._absorb(messages)
        if self.document is not None and not self.items:
            names = [m.group(2) for _, _, text in self._seen for m in HEADING_PATTERN.finditer(text)]
            self.items = list(dict.fromkeys(names))
            self._queue = list(self.items)
        if not self.columns:
            return self._deep()
        if self.mode == "swarm":
            return self._swarm()
        return self._single()

    # --- wide tasks -----------------------------------------------------------------------------------------------

    def _swarm(self) -> str:
        if not self._queue:
            return self._table()
        calls: list[str] = []
        if not self._created:
            self._created = True
            calls.append(format_tool_call(CREATE_TOOL, {"name": LOOKUP_AGENT, "system_prompt": LOOKUP_PROMPT}))
        batch, self._queue = self._queue[: self.max_parallel], self._queue[self.max_parallel :]
        asked = ", ".join(c for c in self.columns if c != "name")
        for item in batch:
            prompt = f"Find `{item}` in the corpus and report: {asked}."
            calls.append(format_tool_call(ASSIGN_TOOL, {"agent": LOOKUP_AGENT, "prompt": prompt}))
        return "\n".join(calls)

    def _single(self) -> str:
        if self._last is not None and self._find(self._last) is None and self._last not in self._retried:
            self._retried.add(self._last)
            tail = re.escape(self._last.rsplit(".", 1)[-1])
            return format_tool_call(GREP_TOOL, {"pattern": rf"^#+ (class |def )?[\w.]*\b{tail}\b"})
        if self._queue:
            self._last = self._queue.pop(0)
            return format_tool_call(SEARCH_TOOL, {"query": self._last})
        for item in self.items:
            found = self._find(item)
            if found is not None:
                chunk_id, doc_id, text = found
                self._values[item] = read_attributes(Chunk(chunk_id, doc_id, 0, text), item, self.columns)
        return self._table()

    def _find(self, item: str) -> tuple[str, str, str] | None:
        return next((p for p in self._seen if entity_heading(p[2], item) is not None), None)

    def _table(self) -> str:
        rows: list[dict[str, Any]] = []
        for item in self.items:
            values = self._values.get(item, {})
            rows.append({column: item if column == "name" else values.get(column, "") for column in self.columns})
        return render_markdown_table(self.columns, rows)

    # --- deep tasks -----------------------------------------------------------------------------------------------

    def _deep(self) -> str:
        if self.mode == "swarm" and not self._created:
            self._created = True
            return "\n".join(
                [
                    format_tool_call(
                        CREATE_TOOL, {"name": "researcher", "system_prompt": "You research one question."}
                    ),
                    format_tool_call(ASSIGN_TOOL, {"agent": "researcher", "prompt": self.prompt}),
                ]
            )
        if self.mode == "single" and not self._seen and self._last is None:
            self._last = self.prompt
            return format_tool_call(SEARCH_TOOL, {"query": " ".join(self.prompt.split())[:400]})
        chunk_ids = list(dict.fromkeys(chunk_id for chunk_id, _, _ in self._seen))[:5]
        return "\n".join(
            f"<Document id={c}><Justification>found while searching</Justification></Document>" for c in chunk_ids
        )


def run_episode(
    env: Environment, policy: Any, row: Mapping[str, Any], trajectory_id: str | None = None
) -> dict[str, Any]:
    """One episode of `env` on task `row` with a policy (`act(messages) -> reply`); returns the trajectory record."""
    messages = env.reset(env.validate_task_row(dict(row)))
    while True:
        result = env.step(policy.act(messages))
        if result.done:
            break
        messages = env.messages
    return env.trajectory(trajectory_id)
