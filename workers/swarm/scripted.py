"""A scripted orchestrator for the swarm environment: the teacher of the SFT warm-up and both sides of the
single-agent vs swarm comparison (`bench/swarm.py`), on machines without a model that can orchestrate.

It reads the task the way a person would, never the gold table (`workers.swarm.wide_reading`):
- a wide task's columns are the header its question states (the environment states the task's `table.columns`
  when the question does not), the first being the key; its items are named by the question (in backticks, quoted,
  bulleted or as a list in the wording) or given by the task's `entities`; a task over "every API item that
  document `D` documents" is enumerated first by reading D (`read_document`) and taking the names its headings
  document, and one over "every document (package, ...) that CONDITION" by grepping the condition's terms until no
  new passage matches, each matching document being an item;
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
from workers.search.extract import entity_score, extract_cells, field_value, name_pattern, normalise
from workers.search.tools import GREP_TOOL, READ_TOOL, SEARCH_TOOL
from workers.search.types import Chunk
from workers.search.wide import HEADING_PATTERN, entity_heading, read_attributes
from workers.swarm.environment import ASSIGN_TOOL, CREATE_TOOL
from workers.swarm.subagents import passages
from workers.swarm.wide_reading import WideShape, condition_terms, read_wide_task

SCRIPTED_SWARM_TEACHER = "scripted-swarm"
"""The SFT job's `teacher_model` value that selects the scripted orchestrator (swarm mode)."""
Mode = Literal["swarm", "single"]
LOOKUP_AGENT = "lookup"
LOOKUP_PROMPT = "You look up one API item in the corpus and report the attributes you are asked for, one per line."
_VALUE_LINE = re.compile(r"^([A-Za-z_][\w ()/'-]*):\s*(.+)$", re.MULTILINE)
MAX_ENUMERATION_GREPS = 6


def task_shape(prompt: str) -> tuple[list[str], list[str], str | None]:
    """(items, columns, document to enumerate) of a wide task's prompt; columns [] for a deep task."""
    shape = read_wide_task(prompt)
    return shape.items, shape.columns, shape.document


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
        self.key = "name"
        self.document: str | None = None
        self.condition: str | None = None
        self._terms: list[str] = []
        self._greps = 0
        self._matched: dict[str, str] = {}
        self.prompt = ""
        self._queue: list[str] = []
        self._created = False
        self._seen: list[tuple[str, str, str]] = []
        self._values: dict[str, dict[str, str]] = {}
        self._retried: set[str] = set()
        self._read_for: set[str] = set()
        self._last: str | None = None
        self._last_empty = False
        self._started = False

    def _absorb(self, messages: Sequence[Message]) -> None:
        for message in reversed(messages):
            if message["role"] != "tool":
                break
            content = message["content"]
            self._seen.extend(passages(content))
            if content.startswith("[sub-agent "):
                values = {normalise(k): v.strip() for k, v in _VALUE_LINE.findall(content)}
                name = values.get("name")
                if name:
                    self._values[name] = {k: v for k, v in values.items() if v != "not found"}
            if self.condition is not None and not self.items:
                self._match_condition(content)

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
            self._take(read_wide_task(self.prompt))
            if self.document is not None:
                return format_tool_call(READ_TOOL, {"doc_id": self.document})
        else:
            self._absorb(messages)
        if self.condition is not None and not self.items:
            call = self._enumerate()
            if call is not None:
                return call
        if self.document is not None and not self.items:
            names = [m.group(2) for _, _, text in self._seen for m in HEADING_PATTERN.finditer(text)]
            self.items = list(dict.fromkeys(names))
            self._queue = list(self.items)
        if not self.columns:
            return self._deep()
        if self.mode == "swarm":
            return self._swarm()
        return self._single()

    def _take(self, shape: WideShape) -> None:
        self.items, self.columns, self.key = shape.items, shape.columns, shape.key
        self.document, self.condition = shape.document, shape.condition
        self._terms = condition_terms(shape.condition) if shape.condition else []
        self._queue = list(self.items)

    # --- enumerating "every document that ..." ----------------------------------------------------------------------

    def _enumerate(self) -> str | None:
        """The next grep for the condition's first term (the index shows each passage once, so a repeated grep
        pages through the matches), or None once none is new: the matched documents become the items."""
        if self._terms and self._greps < MAX_ENUMERATION_GREPS and not self._exhausted:
            self._greps += 1
            return format_tool_call(GREP_TOOL, {"pattern": f"(?i){re.escape(self._terms[0][:90])}"})
        self.items = list(self._matched.values())
        self._queue = list(self.items)
        self.condition = None
        return None

    @property
    def _exhausted(self) -> bool:
        return self._greps > 0 and self._last_empty

    def _match_condition(self, content: str) -> None:
        found = passages(content)
        self._last_empty = not found
        for _, doc_id, text in found:
            lowered = text.lower()
            if all(term.lower() in lowered for term in self._terms):
                self._matched.setdefault(doc_id, self._name_of(doc_id, text))

    def _name_of(self, doc_id: str, text: str) -> str:
        """The name an enumerated document goes by in the table: its key field when it states one (`package:
        curl`), else its document id."""
        return field_value(text, self.key) or doc_id

    # --- wide tasks -----------------------------------------------------------------------------------------------

    def _swarm(self) -> str:
        if not self._queue:
            return self._table()
        calls: list[str] = []
        if not self._created:
            self._created = True
            calls.append(format_tool_call(CREATE_TOOL, {"name": LOOKUP_AGENT, "system_prompt": LOOKUP_PROMPT}))
        batch, self._queue = self._queue[: self.max_parallel], self._queue[self.max_parallel :]
        wanted = [c for c in self.columns if c != self.key]
        unsafe = any("," in c or re.search(r"\band\b", c) for c in wanted)
        asked = (" | " if unsafe else ", ").join(wanted)
        for item in batch:
            prompt = f"Find `{item}` in the corpus and report: {asked}."
            calls.append(format_tool_call(ASSIGN_TOOL, {"agent": LOOKUP_AGENT, "prompt": prompt}))
        return "\n".join(calls)

    def _single(self) -> str:
        item = self._last
        if item is not None and self._find(item) is None:
            best = self._best_doc(item)
            if (best is None or best[0] < 2) and item not in self._retried:
                self._retried.add(item)
                return format_tool_call(GREP_TOOL, {"pattern": name_pattern(item)})
            if best is not None and item not in self._read_for:
                self._read_for.add(item)
                return format_tool_call(READ_TOOL, {"doc_id": best[1]})
        if self._queue:
            self._last = self._queue.pop(0)
            return format_tool_call(SEARCH_TOOL, {"query": self._last})
        for item in self.items:
            found = self._find(item)
            if found is not None:
                chunk_id, doc_id, text = found
                values = read_attributes(Chunk(chunk_id, doc_id, 0, text), item, self.columns)
                self._values[item] = {normalise(k): v for k, v in values.items()}
            else:
                about = self._about(item)
                if about is not None:
                    values = extract_cells(about, item, [c for c in self.columns if c != self.key])
                    self._values[item] = {normalise(k): v for k, v in values.items()}
        return self._table()

    def _find(self, item: str) -> tuple[str, str, str] | None:
        return next((p for p in self._seen if entity_heading(p[2], item) is not None), None)

    def _best_doc(self, item: str) -> tuple[float, str] | None:
        """(score, document) of the passage seen that is most about `item` (`entity_score`), or None."""
        scored = [(entity_score(text, item, doc_id=doc_id), doc_id) for _, doc_id, text in self._seen]
        scored = [pair for pair in scored if pair[0] > 0]
        return max(scored, key=lambda pair: pair[0]) if scored else None

    def _about(self, item: str) -> str | None:
        """The text of the document most about `item` among the passages seen (all its passages seen), or None."""
        best = self._best_doc(item)
        if best is None:
            return None
        return "\n\n".join(text for _, did, text in self._seen if did == best[1])

    def _table(self) -> str:
        rows: list[dict[str, Any]] = []
        for item in self.items:
            values = self._values.get(item, {})
            row = {column: values.get(normalise(column), "") for column in self.columns}
            row[self.key] = item
            rows.append(row)
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
