"""Template tags for the trajectory page's coding-agent views: `{% load trajectory_chain %}`.

`trajectory_chain record turns` splits a self-summarised trajectory (docs/methods.md C3, the `coding_agent` environment)
into its segments: the record's `segments` give each segment's tokens, its `summaries` the summary that closed
it, and its turns carry the marks the environment writes (`summary_request` on the harness's request, `summary` on
the model's summary reply, `segment_start` on the message that restarts the context from the summary). A record
with neither `segments` nor `summaries` (every other environment) gives None and the page lists its turns as
before.

`coding_outcome record` gathers what a coding-agent episode ended with: the hidden tests' report, the final diff,
the files it edited (and those it edited through `run` rather than the edit tool) and its length statistics; None
for a record without any of them.

Both read the stored record defensively: an upload or an older record may lack a field or hold it in another
shape, and the page must still render.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django import template

register = template.Library()

OUTCOME_ORDER = {"failed": 0, "error": 1, "missing": 2, "passed": 3}
"""Hidden-test outcomes listed worst first, so a failure is the first thing a reader sees."""

LENGTH_FIELDS = (
    ("thinking_tokens", "thinking tokens"),
    ("tool_call_tokens", "tool-call tokens"),
    ("tool_output_tokens", "tool-output tokens"),
    ("final_message_tokens", "final-message tokens"),
    ("summary_tokens", "summary tokens"),
    ("tool_calls", "tool calls"),
    ("turns", "turns"),
)
"""`workers.trajectories.LengthStats`, in the order docs/methods.md C4 lists the length penalty's inputs."""


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _mark(turn: Mapping[str, Any]) -> str:
    if turn.get("summary_request"):
        return "summary_request"
    if turn.get("summary"):
        return "summary"
    if "segment_start" in turn:
        return "restart"
    return ""


@register.simple_tag
def trajectory_chain(record: Any, turns: Sequence[Any] | None = None) -> dict[str, Any] | None:
    """The chain of a self-summarised trajectory, or None when the record is not one.

    Returns {"segments": [...], "summaries": k, "tokens": total}, where each segment is {"number" (1-based),
    "tokens" (its tokens at its close, None when not stored), "turns": [{"view": the page's view of the turn,
    "mark": "summary_request" | "summary" | "restart" | ""}], "summary": the summary that closed it ({"number",
    "turn", "text", "tokens"}) or None for the last}. `turns` are the page's turn views (`apps.runs.pages`), one per
    dict turn of the record; without them (or when they do not line up) the record's own turns are shown.
    """
    if not isinstance(record, Mapping):
        return None
    raw_segments, raw_summaries = record.get("segments"), record.get("summaries")
    if not raw_segments and not raw_summaries:
        return None
    segment_tokens = [_int(n) for n in raw_segments] if isinstance(raw_segments, list) else []
    summaries = [s for s in raw_summaries if isinstance(s, Mapping)] if isinstance(raw_summaries, list) else []
    record_turns = [t for t in record.get("turns") or [] if isinstance(t, Mapping)]
    views = list(turns) if turns is not None and len(turns) == len(record_turns) else list(record_turns)

    grouped: list[list[dict[str, Any]]] = [[]]
    for turn, view in zip(record_turns, views, strict=True):
        if "segment_start" in turn and grouped[-1]:
            grouped.append([])  # the context was rewritten: system prompt + task + this summary
        grouped[-1].append({"view": view, "mark": _mark(turn)})
    count = max(len(grouped), len(segment_tokens), len(summaries) + 1)
    grouped += [[] for _ in range(count - len(grouped))]

    segments = []
    for index, members in enumerate(grouped):
        summary = summaries[index] if index < len(summaries) else None
        segments.append(
            {
                "number": index + 1,
                "tokens": segment_tokens[index] if index < len(segment_tokens) else None,
                "turns": members,
                "summary": None
                if summary is None
                else {
                    "number": index + 1,
                    "turn": _int(summary.get("turn")),
                    "text": str(summary.get("text") or ""),
                    "tokens": _int(summary.get("tokens")),
                },
            }
        )
    return {
        "segments": segments,
        "summaries": len(summaries),
        "tokens": sum(n for n in segment_tokens if n is not None),
    }


@register.simple_tag
def coding_outcome(record: Any) -> dict[str, Any] | None:
    """What a coding-agent episode ended with, for the page; None when the record holds none of it.

    Returns {"hidden": {"resolved", "fraction", "fail_to_pass" ("passed/total"), "pass_to_pass", "detail",
    "seconds", "outcomes": [(test id, outcome)] worst first} or None, "diff", "edited_files",
    "files_edited_by_run", "files_edited_by_tool", "length": [(label, value)], "finish_reason", "family"}.
    """
    if not isinstance(record, Mapping):
        return None
    shown = ("hidden_tests", "length_stats", "edited_files", "files_edited_by_run")
    if record.get("diff") is None and not any(record.get(key) for key in shown):
        return None
    raw_hidden = record.get("hidden_tests")
    hidden = None
    if isinstance(raw_hidden, Mapping):
        raw_outcomes = raw_hidden.get("outcomes")
        outcomes = raw_outcomes if isinstance(raw_outcomes, Mapping) else {}
        fraction = raw_hidden.get("fraction")
        hidden = {
            "resolved": bool(raw_hidden.get("resolved")),
            "fraction": float(fraction) if isinstance(fraction, int | float) else None,
            "fail_to_pass": f"{raw_hidden.get('fail_to_pass_passed', 0)}/{raw_hidden.get('fail_to_pass_total', 0)}",
            "pass_to_pass": f"{raw_hidden.get('pass_to_pass_passed', 0)}/{raw_hidden.get('pass_to_pass_total', 0)}",
            "detail": str(raw_hidden.get("detail") or ""),
            "seconds": raw_hidden.get("seconds"),
            "outcomes": sorted(
                ((str(test), str(outcome)) for test, outcome in outcomes.items()),
                key=lambda item: (OUTCOME_ORDER.get(item[1], -1), item[0]),
            ),
        }
    raw_length = record.get("length_stats")
    length = (
        [(label, raw_length.get(key, 0)) for key, label in LENGTH_FIELDS] if isinstance(raw_length, Mapping) else []
    )

    def paths(key: str) -> list[str]:
        value = record.get(key)
        return [str(p) for p in value] if isinstance(value, list) else []

    diff = record.get("diff")
    return {
        "hidden": hidden,
        "diff": diff if isinstance(diff, str) else None,
        "edited_files": paths("edited_files"),
        "files_edited_by_run": paths("files_edited_by_run"),
        "files_edited_by_tool": paths("files_edited_by_tool"),
        "length": length,
        "finish_reason": record.get("finish_reason"),
        "family": record.get("family"),
    }
