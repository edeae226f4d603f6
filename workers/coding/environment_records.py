"""What a coding episode leaves: its end and its record. `EpisodeRecord`, the part of
`workers.coding.environment.CodingAgentEnv` that ends an episode (the final diff, the hidden tests on a fork of the
final workspace) and writes its trajectory fields and counts; the hidden-test report as the `hidden_tests` field
(`hidden_tests_field`), the SFT warm-up's rule over teacher records (`select_resolved`) and the per-episode metrics
(`coding_episode_metrics`). The environment itself is in `workers.coding.environment`, self-summarisation in
`workers.coding.environment_summary`.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from workers.coding.environment_summary import SelfSummary
from workers.coding.execute import CommandLimits
from workers.coding.hidden_tests import TestReport, run_hidden_tests
from workers.coding.tools import is_artifact_path

if TYPE_CHECKING:
    from workers.coding.task import RepoTask
    from workers.coding.workspace import Workspace

MAX_DIFF_CHARS = 256_000
"""The trajectory keeps at most this much of the final diff (a cut is marked); `edited_files` lists every file."""


class EpisodeRecord(SelfSummary):
    """The end of a coding episode and its record; the environment that inherits it sets these."""

    test_wall_seconds: float
    command_memory_mb: int
    _workspace: Workspace | None
    _repo_task: RepoTask | None

    # --- the end of an episode ------------------------------------------------------------------------------------

    def _end(self, *, answer: str | None, reason: str, error: str | None = None) -> None:
        self._state.finish_reason = reason
        self._state.finish_message = answer
        self._finish(answer=answer, error=error)

    def _finish(self, *, answer: str | None, error: str | None = None) -> None:
        """Every way an episode ends comes here (finish, a final reply, max_turns, `abort`): close the last
        segment, take the diff and run the hidden tests on a fork of the final workspace."""
        if self._state.finish_reason is None:
            self._state.finish_reason = "aborted"
        self._state.segments.append(self._view_tokens())
        if self._workspace is not None:
            diff = self._workspace.diff()
            if len(diff) > MAX_DIFF_CHARS:
                diff = diff[:MAX_DIFF_CHARS] + f"\n[... diff cut: {len(diff) - MAX_DIFF_CHARS:,} more characters]\n"
            self._state.diff = diff
            self._state.edited_files = sorted(p for p in self._workspace.changed_paths() if not is_artifact_path(p))
            error = self._run_hidden_tests() or error
        super()._finish(answer=answer, error=error)

    def _run_hidden_tests(self) -> str | None:
        """Run the task's hidden tests; returns an error message when they could not run at all (an
        infrastructure failure, never counted as the policy's)."""

        assert self._repo_task is not None and self._workspace is not None
        limits = CommandLimits(
            wall_seconds=self.test_wall_seconds,
            cpu_seconds=max(1, int(self.test_wall_seconds)),
            memory_bytes=self.command_memory_mb * 1024 * 1024,
        )
        try:
            report = run_hidden_tests(self._workspace.fork(), self._repo_task.hidden_tests, limits=limits)
        except Exception as exc:  # a sandbox that cannot start: the episode is void, not failed
            self._state.hidden = None
            self._state.tests_passed = None
            return f"hidden tests could not run: {type(exc).__name__}: {exc}"
        self._state.hidden = hidden_tests_field(report)
        self._state.tests_passed = float(report.fraction)
        return None

    # --- the trajectory -------------------------------------------------------------------------------------------

    @property
    def counts(self) -> dict[str, int]:
        counts = super().counts
        counts.update({f"{name}_calls": n for name, n in self._state.tool_counts.items()})
        counts["summaries"] = len(self._state.summaries)
        counts["run_limit_hits"] = self._state.run_limit_hits
        return counts

    def length_stats(self) -> dict[str, int]:
        """The episode's `workers.trajectories.LengthStats` so far."""
        lengths = self._state.lengths
        return {
            "thinking_tokens": lengths.thinking_tokens,
            "tool_call_tokens": lengths.tool_call_tokens,
            "tool_output_tokens": lengths.tool_output_tokens,
            "final_message_tokens": lengths.final_message_tokens,
            "summary_tokens": lengths.summary_tokens,
            "tool_calls": self._tool_calls,
            "turns": self._steps,
        }

    def trajectory_fields(self) -> dict[str, Any]:
        state = self._state
        return {
            "tests_passed": state.tests_passed,
            "hidden_tests": copy.deepcopy(state.hidden),
            "diff": state.diff,
            "edited_files": list(state.edited_files),
            "files_edited_by_run": list(state.edited_by_run),
            "files_edited_by_tool": list(state.edited_by_tool),
            "length_stats": self.length_stats(),
            "summaries": copy.deepcopy(state.summaries),
            "segments": list(state.segments),
            "finish_reason": state.finish_reason,
            "family": self._repo_task.family if self._repo_task is not None else None,
        }

    def episode_metrics(self, record: Mapping[str, Any]) -> dict[str, float]:
        return coding_episode_metrics(record)


def hidden_tests_field(report: TestReport) -> dict[str, Any]:
    """A hidden-test run's report as the trajectory's `hidden_tests` field (JSON, its detail cut at 2,000
    characters)."""
    return {
        "outcomes": dict(report.outcomes),
        "fail_to_pass_passed": report.fail_to_pass_passed,
        "fail_to_pass_total": report.fail_to_pass_total,
        "pass_to_pass_passed": report.pass_to_pass_passed,
        "pass_to_pass_total": report.pass_to_pass_total,
        "fraction": float(report.fraction),
        "resolved": bool(report.resolved),
        "detail": str(report.detail or "")[:2_000],
        "seconds": round(float(report.seconds), 3),
    }


def select_resolved(records: Sequence[Mapping[str, Any]]) -> tuple[list[int], dict[str, Any]]:
    """The SFT warm-up keeps the teacher's episodes that solved their task (every hidden test passed) without an
    error or a malformed tool call, once per (task, final diff): Context-1's recall filter has nothing to read
    in a coding episode. Counts every drop by reason."""
    kept: list[int] = []
    dropped = {"error": 0, "malformed": 0, "unresolved": 0, "duplicate": 0}
    seen: set[tuple[str, str]] = set()
    for index, record in enumerate(records):
        counts = record.get("counts") or {}
        report = record.get("hidden_tests") or {}
        key = (str(record.get("task_id")), str(record.get("diff") or ""))
        if record.get("error"):
            dropped["error"] += 1
        elif int(counts.get("malformed_tool_calls", 0)) > 0:
            dropped["malformed"] += 1
        elif not report.get("resolved"):
            dropped["unresolved"] += 1
        elif key in seen:
            dropped["duplicate"] += 1
        else:
            seen.add(key)
            kept.append(index)
    return kept, {"generated": len(records), "kept": len(kept), "dropped": dropped, "rule": "resolved"}


def coding_episode_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Per-episode metrics of a coding-agent record (the trainer averages them per step as `env/<name>`):
    `tests_passed` (hidden-test pass fraction, the benchmark score), `resolved`, `summaries` per trajectory,
    `segments`, `segment_tokens_mean` / `segment_tokens_max`, `turns`, `tool_calls`, `malformed_tool_calls`,
    `files_edited` and `files_edited_by_run`. Tolerates records without these fields (uploads)."""
    raw_hidden, raw_counts = record.get("hidden_tests"), record.get("counts")
    hidden: Mapping[str, Any] = raw_hidden if isinstance(raw_hidden, Mapping) else {}
    counts: Mapping[str, Any] = raw_counts if isinstance(raw_counts, Mapping) else {}
    segments = [int(n) for n in record.get("segments") or [] if isinstance(n, int | float)]
    summaries = record.get("summaries") or []
    return {
        "tests_passed": float(record.get("tests_passed") or 0.0),
        "resolved": 1.0 if hidden.get("resolved") else 0.0,
        "summaries": float(len(summaries)),
        "segments": float(len(segments)),
        "segment_tokens_mean": float(statistics.fmean(segments)) if segments else 0.0,
        "segment_tokens_max": float(max(segments)) if segments else 0.0,
        "turns": float(counts.get("turns", 0) or 0),
        "tool_calls": float(counts.get("tool_calls", 0) or 0),
        "malformed_tool_calls": float(counts.get("malformed_tool_calls", 0) or 0),
        "files_edited": float(len(record.get("edited_files") or [])),
        "files_edited_by_run": float(len(record.get("files_edited_by_run") or [])),
    }
