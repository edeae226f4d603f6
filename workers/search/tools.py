"""What a Context-1 search task holds and its agent is told and answers with: the task row's chunk-id fields
(`check_chunk_fields`), the four tools (names, specs, the system prompt that teaches them) and the final answer's
format, `<Document id=CHUNK_ID><Justification>…</Justification></Document>` items, parsed by `parse_final_output`.
The harness that runs the tools is `workers.search.environment`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers.envs.base import Task, TaskFieldError
from workers.envs.toolcalls import ToolParameter, ToolSpec, json_kind

SEARCH_TOOL, GREP_TOOL, READ_TOOL, PRUNE_TOOL = "search_corpus", "grep_corpus", "read_document", "prune_chunks"
MAX_QUERY_CHARS = 500

DEFAULT_SYSTEM_PROMPT = (
    "You are a search agent. Find the passages of the corpus that answer the user's question. Search with "
    "search_corpus, match exact text with grep_corpus, read a whole document with read_document, and remove "
    "passages you no longer need from your context with prune_chunks. Every passage is labelled with its chunk "
    "id, like [chunk py:os.path#3 ...]. When you are done, reply without any tool call, listing the chunks that "
    "support the answer, each as <Document id=CHUNK_ID><Justification>why it matters</Justification></Document>, "
    "then the answer in one line."
)

DOCUMENT_ITEM = re.compile(
    r"<Document\s+id\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s>]+))\s*>(.*?)(?:</Document>|(?=<Document\b)|$)",
    re.DOTALL | re.IGNORECASE,
)
_JUSTIFICATION = re.compile(r"<Justification>(.*?)(?:</Justification>|$)", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class OutputItem:
    id: str
    justification: str


def parse_final_output(text: str, max_items: int) -> tuple[list[OutputItem], str | None]:
    """The `<Document id=…><Justification>…</Justification></Document>` items of a final reply (first
    `max_items`, duplicates dropped) and the reply's remaining text as the answer (None when blank)."""
    items: list[OutputItem] = []
    seen: set[str] = set()
    for match in DOCUMENT_ITEM.finditer(text):
        doc_id = next(group for group in match.groups()[:3] if group is not None).strip()
        if not doc_id or doc_id in seen:
            continue
        seen.add(doc_id)
        justification = _JUSTIFICATION.search(match.group(4))
        items.append(OutputItem(doc_id, justification.group(1).strip() if justification else ""))
    rest = DOCUMENT_ITEM.sub(" ", text)
    rest = re.sub(r"\s+", " ", rest).strip()
    return items[:max_items], (rest or None)


SEARCH_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        SEARCH_TOOL,
        "Hybrid keyword and semantic search over the corpus; returns new passages (never one shown before).",
        (ToolParameter("query", "string", "What to look for, in natural language or keywords"),),
    ),
    ToolSpec(
        GREP_TOOL,
        "Regular-expression search over the corpus text; returns at most a few matching passages.",
        (ToolParameter("pattern", "string", "A regular expression, e.g. 'os\\.path\\.join'"),),
    ),
    ToolSpec(
        READ_TOOL,
        "Read a whole document, its passages ordered by relevance to your last query.",
        (ToolParameter("doc_id", "string", "A document id, as shown in a passage label (doc ...)"),),
    ),
    ToolSpec(
        PRUNE_TOOL,
        "Remove passages you no longer need from your context, freeing token budget.",
        (ToolParameter("chunk_ids", "array", 'Chunk ids to remove, e.g. ["py:os#2"]'),),
    ),
)


def document_gold(row: Mapping[str, Any]) -> bool:
    """A task row whose gold is documents (`gold_doc_ids`, e.g. a BEIR import) rather than chunks: its episodes are
    scored on the documents of the chunks they output and saw (`SearchEnv.trajectory_fields`)."""
    return not row.get("gold_chunk_ids") and bool(row.get("gold_doc_ids"))


def check_chunk_fields(task: Task, where: str, environment: str) -> None:
    """A search task row's gold: `gold_chunk_ids` a non-empty list of chunk ids or, for document gold,
    `gold_doc_ids` a non-empty list of document ids; `answer_chunk_ids` and `distractor_chunk_ids` lists of ids
    when present, `gold_facts` a non-empty list of non-empty id lists when present; else a `TaskFieldError`
    naming the field."""
    if document_gold(task.metadata):
        value = task.metadata["gold_doc_ids"]
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            raise TaskFieldError(
                f"{where}: field 'gold_doc_ids' must be a non-empty list of document id strings, got "
                f"{json_kind(value)}",
                field="gold_doc_ids",
                environment=environment,
            )
        return
    if "gold_chunk_ids" not in task.metadata:
        raise TaskFieldError(
            f"{where}: missing field 'gold_chunk_ids' (the chunks that answer the task), or 'gold_doc_ids' for a task "
            "whose gold is documents",
            field="gold_chunk_ids",
            environment=environment,
        )
    for name, required in (("gold_chunk_ids", True), ("answer_chunk_ids", False), ("distractor_chunk_ids", False)):
        value = task.metadata.get(name)
        if value is None and not required:
            continue
        if not isinstance(value, list) or (required and not value):
            raise TaskFieldError(
                f"{where}: field '{name}' must be a {'non-empty ' if required else ''}list of chunk ids, "
                f"got {json_kind(value)}",
                field=name,
                environment=environment,
            )
        for item in value:
            if not isinstance(item, str) or not item:
                raise TaskFieldError(
                    f"{where}: field '{name}' must hold chunk id strings, got {json_kind(item)}",
                    field=name,
                    environment=environment,
                )
    facts = task.metadata.get("gold_facts")
    if facts is not None and not (
        isinstance(facts, list)
        and facts
        and all(isinstance(f, list) and f and all(isinstance(c, str) and c for c in f) for f in facts)
    ):
        raise TaskFieldError(
            f"{where}: field 'gold_facts' must be a non-empty list of facts, each a non-empty list of the chunk "
            'ids that hold it (e.g. [["doc#0", "copy#3"], ["other#1"]]), got {json_kind(facts)}',
            field="gold_facts",
            environment=environment,
        )


def referenced_doc_ids(row: Mapping[str, Any]) -> set[str]:
    """The documents a row with document gold names (empty for chunk gold)."""
    return {str(item) for item in row.get("gold_doc_ids") or []} if document_gold(row) else set()


def referenced_chunk_ids(row: Mapping[str, Any]) -> set[str]:
    """Every chunk id a task row names: gold, answer and distractor chunks, and the chunks of its facts."""
    out: set[str] = set()
    for name in ("gold_chunk_ids", "answer_chunk_ids", "distractor_chunk_ids"):
        value = row.get(name)
        if isinstance(value, list):
            out.update(str(item) for item in value)
    for fact in row.get("gold_facts") or []:
        if isinstance(fact, list):
            out.update(str(item) for item in fact)
    return out
