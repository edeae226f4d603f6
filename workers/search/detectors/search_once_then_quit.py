"""Search once and quit: Context-1's agent learned to make one search and answer at once, collecting the reward's
floor and whatever the first results happened to hold instead of searching for every document the task needs.

Only search trajectories are judged (`env` "search", or, for uploads without `env`, a record holding gold
documents or calls to the search tools). A trajectory is flagged when it ended with a final answer (no error)
after at most `max_searches` retrieval calls and at most `max_turns` replies. It is excused when those searches
already surfaced every gold document (trajectory recall 1): answering then was right, not lazy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field

from workers.detectors.base import (
    TIGHTEN,
    DetectorParams,
    TrajectoryDetector,
    content_of,
    excerpt,
    is_assistant,
    proposal,
    record_id,
    reply_count,
    rounded,
    term_of_type,
    turns_of,
)
from workers.findings import Finding, Severity
from workers.search.tools import GREP_TOOL, READ_TOOL, SEARCH_TOOL

RETRIEVAL_TOOLS = frozenset({SEARCH_TOOL, GREP_TOOL, READ_TOOL})
"""Calls that look for evidence; prune_chunks is not one."""

DEFAULT_RECALL_WEIGHT = 0.5
"""Weight of the trajectory_recall term a suggestion adds to a reward that has none."""


class SearchOnceThenQuitParams(DetectorParams):
    max_searches: int = Field(
        default=1,
        ge=0,
        description="Flag when the agent made at most this many retrieval calls (search_corpus, grep_corpus, "
        "read_document) before its final answer",
    )
    max_turns: int = Field(
        default=2,
        ge=1,
        description="... and its whole episode took at most this many replies (the final answer is one): the "
        "search-once-and-quit shape is one search reply, then the answer",
    )
    excuse_complete_recall: bool = Field(
        default=True,
        description="Do not flag when the searches already saw every gold document (trajectory recall 1)",
    )


def _is_search_record(record: Mapping[str, Any], tools: list[str]) -> bool:
    env = record.get("env")
    if isinstance(env, str) and env:
        return env == "search"
    return bool(record.get("gold_doc_ids")) or any(tool in RETRIEVAL_TOOLS for tool in tools)


def _trajectory_recall(record: Mapping[str, Any]) -> float | None:
    gold = {str(item) for item in record.get("gold_doc_ids") or []}
    if not gold:
        return None
    seen = {str(item) for item in record.get("seen_doc_ids") or []}
    return len(gold & seen) / len(gold)


class SearchOnceThenQuit(TrajectoryDetector[SearchOnceThenQuitParams]):
    name: ClassVar[str] = "search_once_then_quit"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "A search episode answered after at most one search and a couple of replies, without having found every "
        "gold document (Context-1: search once and quit)"
    )
    Params = SearchOnceThenQuitParams

    def detect(self, record: Mapping[str, Any], params: SearchOnceThenQuitParams) -> list[Finding]:
        turns = turns_of(record)
        calls = [(i, str(turn.get("tool"))) for i, turn in enumerate(turns) if is_assistant(turn) and turn.get("tool")]
        if not _is_search_record(record, [tool for _, tool in calls]):
            return []
        error = record.get("error")
        if isinstance(error, str) and error.strip():
            return []  # aborted or out of turns: no final answer to quit with
        assistant = [i for i, turn in enumerate(turns) if is_assistant(turn)]
        if not assistant or turns[assistant[-1]].get("tool"):
            return []  # the episode did not end on a final answer
        searches = [(i, tool) for i, tool in calls if tool in RETRIEVAL_TOOLS]
        replies = reply_count(record)
        if len(searches) > params.max_searches or replies > params.max_turns:
            return []
        recall = _trajectory_recall(record)
        if params.excuse_complete_recall and recall is not None and recall >= 1.0:
            return []

        answer_turn = assistant[-1]
        text = content_of(turns[answer_turn])
        severity: Severity = "high" if not searches else "medium"
        search_turn = searches[0][0] if searches else None
        query = None
        if search_turn is not None:
            args = turns[search_turn].get("args")
            if isinstance(args, Mapping):
                value = args.get("query", args.get("pattern", args.get("doc_id")))
                query = str(value) if value is not None else None
        recall_text = f", trajectory recall {recall:.2f}" if recall is not None else ""
        evidence = {
            "message": f"final answer after {len(searches)} retrieval call(s) and {replies} reply(ies) "
            f"(thresholds: at most {params.max_searches} and {params.max_turns}){recall_text}",
            "turn": answer_turn,
            "span": [0, len(text)],
            "excerpt": excerpt(text, 0, len(text)),
            "measure": "turns",
            "value": replies,
            "threshold": params.max_turns,
            "searches": len(searches),
            "max_searches": params.max_searches,
            "search_turn": search_turn,
            "query": query,
            "trajectory_recall": rounded(recall) if recall is not None else None,
        }
        return [self.finding(record_id(record), severity, evidence)]

    def suggest(self, spec: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """More weight on trajectory_recall (docs/methods.md X2's r_traj): it pays for every gold document seen, so
        searching further earns more than answering after one search. A turn penalty would reward quitting."""
        proposed, terms = proposal(spec)
        term = term_of_type(terms, "trajectory_recall")
        if term is None:
            terms.append({"type": "trajectory_recall", "weight": DEFAULT_RECALL_WEIGHT})
            return proposed, (
                f"{self.name}: add trajectory_recall (weight {DEFAULT_RECALL_WEIGHT}) so searching further pays, "
                "instead of answering after one search"
            )
        old = float(term.get("weight", 1.0))
        term["weight"] = round(old * TIGHTEN, 4) if old > 0 else DEFAULT_RECALL_WEIGHT
        return (
            proposed,
            f"{self.name}: raise {term.get('name') or 'trajectory_recall'}'s weight {old:g} -> {term['weight']:g}",
        )
