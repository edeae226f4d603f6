"""Wide-search tasks in the manner of WideSearch (docs/methods.md B2): N entities × M attributes, answered as a table.

An entity is a name a chunk documents under a heading (`## bisect.insort_left(a, x, lo=0, hi=None, *, key=None)`,
`## class csv.Sniffer()`, `### Path.stem (property)`: `workers.search.synth_corpus.SynthCorpus`'s heading names), so any
corpus with headed sections yields entities. Its attributes are read by code from that chunk (`ATTRIBUTES`):

| column | value | verified by |
|---|---|---|
| `document` | the id of the document holding the chunk | the chunk's `doc_id` |
| `kind` | class, property or function | the heading's form |
| `parameters` | the heading's parameter list as written, "none" when empty | the heading holds it verbatim |
| `first_parameter` | its first parameter's name (self and cls skipped) | the heading holds it |
| `added_in` | the version in "New in version X" / "Added in version X" | the chunk holds the sentence |

A task picks N entities that all have the M chosen attributes, from different documents (`listed`: the prompt
names the entities, as a WideSearch query names what to tabulate) or from one document (`document`: every entity
that document documents, which the agent must first enumerate). Each cell is checked against its chunk again
before the task is kept (`verify_wide_row`); the table's key column is `name`.

`synthesize_wide` returns task rows for the `swarm` environment (the table in `table`, the entity chunks as
`gold_chunk_ids`) and a report counting candidates tried, kept and dropped by reason.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from workers.rewards.table import GoldTable, normalize_key
from workers.search.synth_corpus import SynthCorpus, normalize, task_id_for
from workers.search.types import Chunk

WIDE_GENERATOR = "wide/v1"
KEY_COLUMN = "name"

# The heading that documents an entity, with what follows its name: `(a, *p)`, ` (property)` or nothing.
HEADING_PATTERN = re.compile(
    r"^#{1,6}[ \t]+(class[ \t]+|(?:async[ \t]+)?def[ \t]+)?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
    r"(\([^\n]*\)|[ \t]+\(property\))?[ \t]*(?:->[^\n]*)?$",
    re.MULTILINE,
)
_VERSION = re.compile(r"\b(?:New|Added) in version (\d+(?:\.\d+)+)", re.IGNORECASE)


@dataclass(frozen=True)
class Heading:
    """The parsed heading of an entity's chunk."""

    name: str
    prefix: str
    suffix: str
    line: str


def entity_heading(chunk_text: str, name: str) -> Heading | None:
    """The heading in `chunk_text` that documents `name` (its full name or its last dotted part), or None."""
    for match in HEADING_PATTERN.finditer(chunk_text):
        found = match.group(2)
        if found == name or found.rsplit(".", 1)[-1] == name or name.rsplit(".", 1)[-1] == found:
            return Heading(found, (match.group(1) or "").strip(), (match.group(3) or "").strip(), match.group(0))
    return None


def _parameters(heading: Heading) -> str | None:
    if not heading.suffix.startswith("(") or heading.suffix == "(property)":
        return None
    inner = heading.suffix[1:-1].strip()
    return inner or "none"


def _first_parameter(heading: Heading) -> str | None:
    params = _parameters(heading)
    if params is None or params == "none" or params == "...":
        return None
    for part in params.split(","):
        name = re.split(r"[:=]", part.strip().lstrip("*"), maxsplit=1)[0].strip()
        if name in ("self", "cls", "/", "") or not re.fullmatch(r"[A-Za-z_]\w*", name):
            continue
        return name
    return None


def _kind(heading: Heading) -> str | None:
    if heading.prefix.startswith("class"):
        return "class"
    if heading.suffix == "(property)":
        return "property"
    if heading.suffix.startswith("("):
        return "function"
    return None


def _added_in(chunk: Chunk) -> str | None:
    match = _VERSION.search(chunk.text)
    return match.group(1) if match else None


@dataclass(frozen=True)
class Attribute:
    """One column a wide task can ask for: how to read it from an entity's chunk, and how the prompt asks it."""

    column: str
    question: str
    read: Callable[[Chunk, Heading], str | None]


ATTRIBUTES: dict[str, Attribute] = {
    attribute.column: attribute
    for attribute in (
        Attribute("document", "the id of the document that documents it", lambda chunk, heading: chunk.doc_id),
        Attribute("kind", "whether it is a class, a function or a property", lambda chunk, heading: _kind(heading)),
        Attribute(
            "parameters",
            'its parameter list exactly as its signature writes it ("none" when it takes none)',
            lambda chunk, heading: _parameters(heading),
        ),
        Attribute(
            "first_parameter",
            "the name of its first parameter (not self or cls)",
            lambda chunk, heading: _first_parameter(heading),
        ),
        Attribute(
            "added_in",
            "the version it was added in",
            lambda chunk, heading: _added_in(chunk),
        ),
    )
}
"""Every column a wide task may have besides `name`, in the order prompts list them."""


def read_attributes(chunk: Chunk, name: str, columns: Sequence[str] | None = None) -> dict[str, str]:
    """The attributes of entity `name` that its chunk gives (all of `ATTRIBUTES`, or `columns`), by column; a
    column the chunk does not give is left out. {} when the chunk has no heading for `name`."""
    heading = entity_heading(chunk.text, name)
    if heading is None:
        return {}
    out: dict[str, str] = {}
    for column in columns if columns is not None else ATTRIBUTES:
        attribute = ATTRIBUTES.get(column)
        value = attribute.read(chunk, heading) if attribute else None
        if value:
            out[column] = value
    return out


def verify_wide_row(chunk: Chunk, row: dict[str, str]) -> str | None:
    """None when every cell of `row` checks out against `chunk`, independently of how it was read; else the drop
    reason. The key must be a heading of the chunk; `document` must be the chunk's document; `kind` must match the
    heading's form (`class ...`, `... (property)`, `...(...)`); "none" parameters need an empty `()`; every other
    cell must occur verbatim (after normalisation) in the chunk's heading line or, for `added_in`, its text."""
    heading = entity_heading(chunk.text, row[KEY_COLUMN])
    if heading is None:
        return "key_not_in_heading"
    line = normalize(heading.line)
    for column, value in row.items():
        if column == KEY_COLUMN:
            continue
        if column == "document":
            ok = value == chunk.doc_id
        elif column == "kind":
            ok = {
                "class": heading.line.lstrip("#").strip().startswith("class"),
                "property": heading.line.rstrip().endswith("(property)"),
                "function": "(" in heading.line and not heading.line.rstrip().endswith("(property)"),
            }.get(value, False)
        elif column in ("parameters", "first_parameter") and heading.suffix in ("", "(property)"):
            ok = False  # a property or a bare name has no parameters
        elif column == "parameters" and value == "none":
            ok = heading.suffix.replace(" ", "") == "()"
        elif column == "added_in":
            ok = normalize(value) in normalize(chunk.text)
        else:
            ok = normalize(value) in line
        if not ok:
            return "cell_not_in_chunk"
    return None


WideDropReason = Literal[
    "too_few_entities", "key_not_in_heading", "cell_not_in_chunk", "duplicate_key", "duplicate_task"
]
WIDE_DROP_REASONS: tuple[WideDropReason, ...] = (
    "too_few_entities",
    "key_not_in_heading",
    "cell_not_in_chunk",
    "duplicate_key",
    "duplicate_task",
)


class WideParams(BaseModel):
    """What a user chooses for wide-task generation."""

    model_config = ConfigDict(extra="forbid")
    num_tasks: int = Field(default=20, ge=1, le=10_000, description="tasks to keep")
    min_rows: int = Field(default=3, ge=1, le=100, description="entities (rows) per task, at least")
    max_rows: int = Field(default=6, ge=1, le=100, description="entities (rows) per task, at most")
    columns: list[str] = Field(
        default_factory=lambda: ["document", "kind", "first_parameter"],
        min_length=1,
        description=f"attribute columns besides name, from: {', '.join(ATTRIBUTES)}",
    )
    style: Literal["listed", "document"] = Field(
        default="listed",
        description="listed: the prompt names the entities (from different documents); document: every entity of "
        "one document, which the agent must enumerate",
    )
    seed: int = Field(default=0, ge=0)

    def model_post_init(self, context: Any) -> None:
        unknown = [c for c in self.columns if c not in ATTRIBUTES]
        if unknown:
            raise ValueError(f"columns: unknown column(s) {', '.join(unknown)}; choose from {', '.join(ATTRIBUTES)}")
        if len(set(self.columns)) != len(self.columns):
            raise ValueError("columns: a column is listed twice")
        if self.max_rows < self.min_rows:
            raise ValueError(f"max_rows ({self.max_rows}) must be >= min_rows ({self.min_rows})")


def wide_prompt(names: Sequence[str], columns: Sequence[str], *, document: str | None = None) -> str:
    """The task's question: what to tabulate, each column's meaning, and the table's header."""
    asks = "; ".join(f"{column}: {ATTRIBUTES[column].question}" for column in columns)
    header = " | ".join([KEY_COLUMN, *columns])
    if document is not None:
        what = f"every API item (class, function or property) that document `{document}` documents"
    else:
        what = f"these {len(names)} items: " + ", ".join(f"`{name}`" for name in names)
    return (
        f"Using the corpus, build a table of {what}. For each give {asks}. Answer with one Markdown table with "
        f"the columns: {header}"
    )


def wide_task_row(
    rows: list[dict[str, str]], chunk_ids: list[str], columns: Sequence[str], prompt: str
) -> dict[str, Any]:
    gold = GoldTable(columns=[KEY_COLUMN, *columns], key_columns=[KEY_COLUMN], rows=rows)
    return {
        "id": task_id_for(prompt, "wide", chunk_ids),
        "prompt": prompt,
        "task_kind": "wide",
        "table": gold.to_json(),
        "gold_chunk_ids": chunk_ids,
        "generator": WIDE_GENERATOR,
    }


@dataclass
class WideResult:
    tasks: list[dict[str, Any]]
    report: dict[str, Any]


def wide_entities(corpus: SynthCorpus, columns: Sequence[str]) -> list[tuple[str, Chunk, dict[str, str]]]:
    """(full name, chunk, row) of every heading entity whose chunk gives all `columns`, in corpus order."""
    out: list[tuple[str, Chunk, dict[str, str]]] = []
    for entity, name in sorted(corpus.entity_names.items(), key=lambda item: (item[0].doc_id, item[0].chunk or -1)):
        if entity.chunk is None:
            continue
        chunk = corpus.chunks[entity.chunk]
        values = read_attributes(chunk, name, columns)
        if len(values) == len(columns):
            out.append((name, chunk, {KEY_COLUMN: name, **values}))
    return out


def synthesize_wide(chunks: Sequence[Chunk], params: WideParams, *, corpus_label: str = "") -> WideResult:
    """Up to `params.num_tasks` verified wide tasks from `chunks` (see the module docstring)."""
    # One function on purpose: the generator's loop: candidates, verification and the report share its counters.
    started = time.perf_counter()
    corpus = SynthCorpus(chunks)
    rng = random.Random(f"wide:{params.seed}")
    entities = wide_entities(corpus, params.columns)
    dropped: Counter[str] = Counter({reason: 0 for reason in WIDE_DROP_REASONS})
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    tried = 0
    by_doc: dict[str, list[int]] = {}
    for i, (_, chunk, _) in enumerate(entities):
        by_doc.setdefault(chunk.doc_id, []).append(i)
    docs = sorted(by_doc)
    # `document` style asks for every entity of a document, so a document qualifies only when each of its heading
    # entities gives every column (else the gold table would miss rows a correct answer has).
    documented: Counter[str] = Counter(
        corpus.chunks[entity.chunk].doc_id for entity in corpus.entity_names if entity.chunk is not None
    )
    complete = [d for d in docs if documented[d] == len(by_doc[d])]
    limit = 20 * params.num_tasks + 50
    while len(tasks) < params.num_tasks and tried < limit and entities:
        tried += 1
        size = rng.randint(params.min_rows, params.max_rows)
        document: str | None = None
        if params.style == "document":
            fits = [d for d in complete if params.min_rows <= len(by_doc[d]) <= params.max_rows]
            if not fits:
                dropped["too_few_entities"] += 1
                break
            document = rng.choice(fits)
            picked = list(by_doc[document])
        else:
            if len(docs) < size:
                dropped["too_few_entities"] += 1
                break
            picked = [rng.choice(by_doc[d]) for d in rng.sample(docs, size)]
        rows = [entities[i][2] for i in picked]
        keys = [normalize_key(row[KEY_COLUMN]) for row in rows]  # as the scorer joins them
        if len(set(keys)) != len(keys):
            dropped["duplicate_key"] += 1
            continue
        reason = next((r for i in picked if (r := verify_wide_row(entities[i][1], entities[i][2]))), None)
        if reason is not None:
            dropped[reason] += 1
            continue
        names = [row[KEY_COLUMN] for row in rows]
        prompt = wide_prompt(names, params.columns, document=document)
        row = wide_task_row(rows, [entities[i][1].chunk_id for i in picked], params.columns, prompt)
        if row["id"] in seen:
            dropped["duplicate_task"] += 1
            continue
        seen.add(row["id"])
        tasks.append(row)
    report = {
        "generator": WIDE_GENERATOR,
        "params": params.model_dump(mode="json"),
        "corpus": corpus_label,
        "target": params.num_tasks,
        "candidates": tried,
        "per_hop": {},
        "stopped": "target reached" if len(tasks) >= params.num_tasks else "out of candidates",
        "chunks": len(chunks),
        "entities": len(entities),
        "documents_with_entities": len(docs),
        "tried": tried,
        "kept": len(tasks),
        "dropped": dict(dropped),
        "seconds": round(time.perf_counter() - started, 3),
    }
    return WideResult(tasks=tasks, report=report)
