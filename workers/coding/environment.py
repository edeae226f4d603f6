"""Composer 2's coding harness (issue 17; docs/methods.md section 2): a repository, six tools, hidden tests at the end.

The policy works on a repository task (`workers.coding.task.RepoTask`) through six tools:

- `list_files{path?}`: the files under a directory (all of them when few, else its entries with file counts);
- `read_file{path, start_line?, end_line?}`: numbered lines, at most `max_read_lines` per call;
- `search_code{pattern, path?}`: a regular expression over the files (`path:line: text`), at most
  `max_search_matches` matches, under a time limit;
- `edit_file{path, search, replace}`: replace the one exact occurrence of `search`; an empty `search` on a missing
  file creates it. Absent or repeated search text is an error observation that says so (and how many times);
- `run{command}`: a shell command in the sandbox against the workspace (`workers.coding.execute`): wall, CPU,
  memory and output limits; files it changes come back into the workspace and are recorded as edited by `run`;
- `finish{message?}`: ends the episode with a message to the user. A reply without any tool call ends it too.

Each episode has its own copy-on-write `Workspace` over the task's snapshot. After the episode ends (finish, a
final reply, max_turns or an abort) the task's hidden tests run on a fork of the final workspace in a fresh sandbox
(`workers.coding.hidden_tests`); `tests_passed` is their pass fraction and `hidden_tests` the whole report.

Forking. `reset(task, workspace=w)` starts an episode from a fork of `w` (the diff is still taken against the
task's snapshot), and `fork_from(other)` continues another environment's episode from where it stands: its
conversation, counts and a fork of its workspace (O(1)), as Anyrun's snapshots let Cursor explore from an
intermediate state. A rollout worker that wants the G samples of a group to start from one state resets one
environment and forks the other G - 1 from it; `Snapshot.load` caches snapshots per process, so plain `reset`s of
the same task already share the snapshot and only the (empty) top layer is per episode.

Self-summarisation (docs/methods.md C3). With `summary_threshold_tokens` > 0, when a reply's observation would bring the
context past the threshold, the observation is followed by a user message holding `SUMMARY_PROMPT`. The policy's
next reply is taken as the summary (no tool in it runs); the environment then rewrites its conversation to the
system prompt, the task and "Summary of your work so far: ..." and sets `view_changed`, so the rollout worker closes
the segment and starts the next from the rewritten conversation. The chain is one trajectory: every segment's
sampled tokens (summaries included) are trained with the episode's one reward. At most `max_summaries` summaries;
`context_limit` (threshold + `summary_headroom_tokens`) is where the worker aborts, and an observation that would
leave no room for the summary request is cut to fit.

Token counts come from the policy's tokenizer when the rollout worker binds it (`bind_token_counter`), else a
4-characters-per-token estimate, plus a fixed per-message overhead for the chat template's markers.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from workers import storage
from workers.coding.archive import content_hash
from workers.coding.execute import CommandLimits
from workers.coding.hidden_tests import run_hidden_tests
from workers.coding.task import RepoTaskError, parse_repo_task_row
from workers.coding.tools import (
    EDIT_TOOL,
    FINISH_TOOL,
    LIST_TOOL,
    READ_TOOL,
    RUN_TOOL,
    SEARCH_TOOL,
    CodingTools,
    EpisodeState,
    is_artifact_path,
)
from workers.coding.workspace import Snapshot, Workspace
from workers.envs.base import (
    MESSAGE_OVERHEAD_TOKENS,
    EpisodeStateError,
    Message,
    Observation,
    StepResult,
    Task,
    TaskFieldError,
    ToolError,
    ToolUseEnvironment,
    approx_tokens,
)
from workers.envs.toolcalls import ToolCall, ToolParameter, ToolSpec, json_kind, parse_tool_calls
from workers.rewards.schema import coding_agent_spec

if TYPE_CHECKING:
    from workers.coding.task import RepoTask
    from workers.coding.workspace import Snapshot, Workspace

ENV_NAME = "coding_agent"

SUMMARY_PROMPT = (
    "Your context is almost full. Write a summary of your work so far, for yourself to continue from with a fresh "
    "context: the task, what you found (files, functions, line numbers), what you changed and why, what is left to "
    "do and what you were about to do next. Do not call any tool: reply with the summary only."
)
"""The fixed request for a self-summary (docs/methods.md C3: the prompt is not given by the source; this is ours)."""

SUMMARY_HEADER = "Summary of your work so far:"
SUMMARY_FOOTER = (
    "Continue the task from here. Every change you made is still in the repository; read files again if you "
    "need their exact text."
)

DEFAULT_SYSTEM_PROMPT = (
    "You are a coding agent working in a Python repository. Explore it with list_files, read_file and "
    "search_code; change files with edit_file (an exact search and replace: copy the text to replace from "
    "read_file's output, without the line numbers); run tests or scripts with run. The user's request may be "
    "short: act on it rather than asking questions the code can answer. When the work is done, call finish with a "
    "short message saying what you changed."
)

MAX_DIFF_CHARS = 256_000
"""The trajectory keeps at most this much of the final diff (a cut is marked); `edited_files` lists every file."""


class CodingAgentEnv(CodingTools, ToolUseEnvironment):
    name: ClassVar[str] = ENV_NAME
    description: ClassVar[str] = (
        "Composer-style coding agent in a repository snapshot: list_files, read_file, search_code, edit_file, run "
        "(sandboxed) and finish; hidden tests run on the final workspace (tests_passed, hidden_tests), with "
        "self-summarisation past summary_threshold_tokens. Task rows need id, prompt (the instruction), snapshot "
        '(or an inline "repo": {"files": {...}}) and hidden_tests (workers.coding.task, repo_task/v1).'
    )
    required_task_fields: ClassVar[frozenset[str]] = frozenset({"id", "prompt", "hidden_tests"})
    produces: ClassVar[frozenset[str]] = frozenset(
        {
            "answer",
            "turns",
            "tests_passed",
            "hidden_tests",
            "diff",
            "edited_files",
            "files_edited_by_run",
            "length_stats",
            "summaries",
            "segments",
        }
    )
    score_field: ClassVar[str] = "tests_passed"
    default_metric: ClassVar[str] = "pass@1"
    dataset_kind: ClassVar[str] = "repo_tasks"
    # Composer 2's choices (docs/methods.md C1, C2): no std division, no length normalisation, k1 KL.
    default_algorithm: ClassVar[str | None] = "composer"
    tools: ClassVar[tuple[ToolSpec, ...]] = (
        ToolSpec(
            LIST_TOOL,
            "List the files of the repository, or of one directory.",
            (ToolParameter("path", "string", "A directory relative to the repository root; default: the root", False),),
        ),
        ToolSpec(
            READ_TOOL,
            "Read a file's lines, numbered. Long files are shown a window at a time.",
            (
                ToolParameter("path", "string", "The file, relative to the repository root"),
                ToolParameter("start_line", "integer", "First line to show (1-based); default 1", False),
                ToolParameter("end_line", "integer", "Last line to show; default: as many as allowed", False),
            ),
        ),
        ToolSpec(
            SEARCH_TOOL,
            "Search the repository's files with a regular expression; returns path:line: text for each match.",
            (
                ToolParameter("pattern", "string", r"A regular expression, e.g. 'def parse\(' or a plain word"),
                ToolParameter("path", "string", "Only search this file or directory", False),
            ),
        ),
        ToolSpec(
            EDIT_TOOL,
            "Replace the one exact occurrence of `search` in a file with `replace`. With an empty `search` and a "
            "file that does not exist, create the file with `replace` as its content.",
            (
                ToolParameter("path", "string", "The file, relative to the repository root"),
                ToolParameter(
                    "search", "string", "The exact text to replace, with its indentation; unique in the file"
                ),
                ToolParameter("replace", "string", "The new text"),
            ),
        ),
        ToolSpec(
            RUN_TOOL,
            "Run a shell command in the repository root (no network), e.g. 'python -m pytest -q tests/test_x.py'.",
            (ToolParameter("command", "string", "The command line"),),
        ),
        ToolSpec(
            FINISH_TOOL,
            "End the task, with a short message to the user about what you changed.",
            (ToolParameter("message", "string", "What you did, for the user", False),),
        ),
    )

    def __init__(
        self,
        *,
        max_turns: int = 30,
        summary_threshold_tokens: int = 6_144,
        summary_headroom_tokens: int = 2_048,
        max_summaries: int = 4,
        command_wall_seconds: float = 30.0,
        command_cpu_seconds: int = 30,
        command_memory_mb: int = 1_024,
        test_wall_seconds: float = 120.0,
        max_output_chars: int = 4_000,
        max_read_lines: int = 200,
        max_search_matches: int = 50,
        max_list_entries: int = 200,
        max_calls_per_turn: int = 4,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    ) -> None:
        super().__init__(
            max_turns=max_turns,
            answer_format="text",
            system_prompt=system_prompt,
            max_calls_per_turn=max_calls_per_turn,
        )
        problems: list[str] = []
        for name, value, low in (
            ("summary_threshold_tokens", summary_threshold_tokens, 0),
            ("summary_headroom_tokens", summary_headroom_tokens, 256),
            ("max_summaries", max_summaries, 0),
            ("command_cpu_seconds", command_cpu_seconds, 1),
            ("command_memory_mb", command_memory_mb, 64),
            ("max_output_chars", max_output_chars, 200),
            ("max_read_lines", max_read_lines, 10),
            ("max_search_matches", max_search_matches, 1),
            ("max_list_entries", max_list_entries, 10),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                problems.append(f"{name} must be an integer >= {low}, got {value!r}")
        for name, seconds in (("command_wall_seconds", command_wall_seconds), ("test_wall_seconds", test_wall_seconds)):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0.1 <= seconds <= 3600:
                problems.append(f"{name} must be a number of seconds in [0.1, 3600], got {seconds!r}")
        if not problems and 0 < summary_threshold_tokens < 1_024:
            problems.append(
                f"summary_threshold_tokens must be 0 (no self-summarisation) or at least 1024, got "
                f"{summary_threshold_tokens}: the system prompt and the task alone take hundreds of tokens"
            )
        if problems:
            raise ValueError("; ".join(problems))
        self.summary_threshold_tokens = summary_threshold_tokens
        self.summary_headroom_tokens = summary_headroom_tokens
        self.max_summaries = max_summaries
        self.command_wall_seconds = float(command_wall_seconds)
        self.command_cpu_seconds = command_cpu_seconds
        self.command_memory_mb = command_memory_mb
        self.test_wall_seconds = float(test_wall_seconds)
        self.max_output_chars = max_output_chars
        self.max_read_lines = max_read_lines
        self.max_search_matches = max_search_matches
        self.max_list_entries = max_list_entries
        self._count: Callable[[str], int] = approx_tokens
        self._snapshot: Snapshot | None = None
        self._workspace: Workspace | None = None
        self._repo_task: RepoTask | None = None

    # --- wiring ---------------------------------------------------------------------------------------------------

    @property
    def context_limit(self) -> int | None:
        """Tokens the conversation may reach before the rollout worker aborts the episode: the summary threshold
        plus its headroom (room for the last observation, the summary request and the summary). None without
        self-summarisation: the worker's own limit applies."""
        if not self.summary_threshold_tokens:
            return None
        return self.summary_threshold_tokens + self.summary_headroom_tokens

    def bind_token_counter(self, count: Callable[[str], int]) -> None:
        """Count tokens with the policy's tokenizer (the rollout worker binds it)."""
        self._count = count

    @property
    def view_changed(self) -> bool:
        """Whether the last step rewrote the conversation (a self-summary): the rollout worker then starts a new
        segment from `messages` instead of appending the observation."""
        return self._view_changed

    @property
    def workspace(self) -> Workspace:
        if self._workspace is None:
            raise EpisodeStateError(f"environment '{self.name}' has no workspace; call reset(task) first")
        return self._workspace

    @classmethod
    def eval_reward(cls) -> dict[str, Any]:
        """Evals score coding episodes with the reward they train on (Composer's terms); pass or fail is
        `tests_passed`."""
        return coding_agent_spec().model_dump(mode="json")

    @classmethod
    def select_for_sft(cls, records: Sequence[Mapping[str, Any]]) -> tuple[list[int], dict[str, Any]]:
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

    # --- tasks ----------------------------------------------------------------------------------------------------

    @classmethod
    def validate_task_row(cls, row: object, *, index: int | None = None) -> Task:
        """A repo_task/v1 row (`workers.coding.task`), or a hand-written one whose repository is inline:
        `{"repo": {"files": {path: text}}}` instead of `snapshot` (its family defaults to "imported"). The
        instruction may be spelled `instruction` (the import format) or `prompt` (the generic task row)."""
        if isinstance(row, dict) and row.get("prompt") is None and isinstance(row.get("instruction"), str):
            row = {**row, "prompt": row["instruction"]}
        task = super().validate_task_row(row, index=index)
        cls._parse_repo_task(task.metadata | {"id": task.id, "instruction": _prompt_text(task)}, index=index)
        return task

    @classmethod
    def _parse_repo_task(cls, fields: Mapping[str, Any], *, index: int | None = None) -> RepoTask:
        where = f"task row {index}" if index is not None else "task row"
        row = {key: value for key, value in fields.items() if key not in ("repo", "prompt", "answer", "aliases")}
        repo = fields.get("repo")
        if repo is not None:
            files = repo.get("files") if isinstance(repo, Mapping) else None
            if (
                not isinstance(files, Mapping)
                or not files
                or not all(isinstance(path, str) and isinstance(text, str) for path, text in files.items())
            ):
                raise TaskFieldError(
                    f"{where}: field 'repo' must be {{\"files\": {{path: text, ...}}}} with at least one file, got "
                    f"{json_kind(repo)}",
                    field="repo",
                    environment=cls.name,
                )
            if fields.get("snapshot") is not None:
                raise TaskFieldError(
                    f"{where}: give either 'snapshot' or an inline 'repo', not both",
                    field="repo",
                    environment=cls.name,
                )
            row["snapshot"] = {"sha256": content_hash(dict(files)), "file_count": len(files)}
            row.setdefault("family", "imported")
            row.setdefault("provenance", {"kind": "imported", "ids": {}})
        elif fields.get("snapshot") is None:
            raise TaskFieldError(
                f"{where}: missing field 'snapshot', which environment '{cls.name}' needs (or give the files inline "
                'as "repo": {"files": {...}})',
                field="snapshot",
                environment=cls.name,
            )
        try:
            return parse_repo_task_row(row, index=index)
        except RepoTaskError as exc:
            raise TaskFieldError(str(exc), field=exc.field, environment=cls.name) from None

    # --- episode --------------------------------------------------------------------------------------------------

    def _clear(self) -> None:
        super()._clear()
        self._state = EpisodeState()
        self._view_changed = False

    def reset(self, task: Task, *, workspace: Workspace | None = None) -> list[Message]:
        """Start an episode on `task`, in a fresh workspace over its snapshot or, given `workspace`, in a fork of
        it (the caller's workspace is left as it is)."""

        repo_task = self._parse_repo_task(task.metadata | {"id": task.id, "instruction": _prompt_text(task)})
        repo = task.metadata.get("repo")
        if isinstance(repo, Mapping):
            snapshot = _inline_snapshot(repo_task.snapshot.sha256, repo["files"])
        else:
            snapshot = Snapshot.load(repo_task.snapshot, storage_options=storage.STORAGE_OPTIONS or None)
        messages = super().reset(task)
        self._repo_task = repo_task
        self._snapshot = snapshot
        self._workspace = workspace.fork() if workspace is not None else Workspace(snapshot)
        return messages

    def fork_from(self, other: CodingAgentEnv) -> None:
        """Continue `other`'s episode from where it stands: its conversation, counts and statistics are copied and
        its workspace forked (O(1)); from here the two episodes are independent. This environment keeps its own
        parameters and token counter. `other` must have an episode that has not ended."""
        if other._task is None or other._workspace is None:
            raise EpisodeStateError("fork_from needs an environment with a started episode; call reset(task) on it")
        if other._done:
            raise EpisodeStateError(f"the episode on task '{other._task.id}' is done; fork it before it ends")
        self._task = other._task
        self._repo_task = other._repo_task
        self._snapshot = other._snapshot
        self._turns = copy.deepcopy(other._turns)
        self._messages = copy.deepcopy(other._messages)
        self._steps = other._steps
        self._tool_calls = other._tool_calls
        self._malformed = other._malformed
        self._tool_errors = other._tool_errors
        self._done = False
        self._answer = None
        self._error = None
        self._state = copy.deepcopy(other._state)
        self._view_changed = False
        self._workspace = other._workspace.fork()

    def _view_tokens(self, extra: Sequence[str] = ()) -> int:
        texts = [*(m["content"] for m in self._messages), *extra]
        return sum(self._count(text) + MESSAGE_OVERHEAD_TOKENS for text in texts)

    def step(self, action_text: str) -> StepResult:
        self._begin_step(action_text)
        self._view_changed = False
        if self._state.awaiting_summary:
            return self._take_summary(action_text)
        parsed = parse_tool_calls(action_text, self.tools)
        turn = self._calls_of(action_text)
        if turn is None:
            # A reply without a tool call is the final message to the user.
            self._state.lengths.final_message_tokens += self._count(action_text.strip())
            self._end(answer=action_text.strip() or None, reason="final_reply")
            return StepResult(None, True, self._info(tool_calls=0, malformed_tool_calls=0, tool_errors=0))
        calls, errors = turn
        outside = parsed.final_text
        self._state.lengths.tool_call_tokens += max(0, self._count(action_text) - self._count(outside))

        replies: list[Message] = []
        tool_turns: list[dict[str, Any]] = []
        step_tool_errors = 0
        finished: str | None = None
        for call in calls:
            if finished is not None:
                note = f"not run: {FINISH_TOOL} ended the episode"
                replies.append({"role": "tool", "content": note})
                tool_turns.append({"role": "tool", "tool": call.name, "content": note, "skipped": True})
                continue
            self._state.tool_counts[call.name] += 1
            if call.name == FINISH_TOOL:
                finished = str(call.arguments.get("message", "")).strip()
                content, detail = "finished", dict[str, Any]()
            else:
                try:
                    content, detail = self._run(call)
                except ToolError as exc:
                    content, detail = f"error: {exc}", {"error": True}
                    step_tool_errors += 1
            replies.append({"role": "tool", "content": content})
            tool_turns.append({"role": "tool", "tool": call.name, "content": content, **detail})
        for error in errors:
            replies.append({"role": "tool", "content": error})
            tool_turns.append({"role": "tool", "content": error, "malformed": True})
        self._tool_calls += sum(1 for t in tool_turns if t.get("tool") and not t.get("skipped"))
        self._malformed += len(errors)
        self._tool_errors += step_tool_errors
        info = self._info(tool_calls=len(calls), malformed_tool_calls=len(errors), tool_errors=step_tool_errors)

        if finished is not None:
            self._turns.extend(tool_turns)
            self._messages.extend(replies)
            message = finished or outside
            self._state.lengths.final_message_tokens += self._count(outside) + self._count(finished)
            self._end(answer=message or None, reason="finish")
            return StepResult(None, True, info)

        self._state.lengths.thinking_tokens += self._count(outside)
        self._state.lengths.tool_output_tokens += sum(self._count(m["content"]) for m in replies)
        summary_request = self._wants_summary(replies)
        if summary_request:
            replies, tool_turns = self._fit_for_summary(replies, tool_turns)
            replies.append({"role": "user", "content": SUMMARY_PROMPT})
            tool_turns.append({"role": "user", "content": SUMMARY_PROMPT, "summary_request": True})
            self._state.awaiting_summary = True
        self._turns.extend(tool_turns)
        self._messages.extend(replies)
        info["token_usage"] = self._view_tokens()
        info["summary_requested"] = summary_request
        if self._steps >= self.max_turns:
            self._end(answer=None, reason="max_turns", error=f"no finish within max_turns={self.max_turns}")
            return StepResult(None, True, {**info, "truncated": True})
        return StepResult(Observation(replies), False, info)

    # --- self-summarisation (docs/methods.md C3) ----------------------------------------------------------------------

    def _wants_summary(self, replies: Sequence[Message]) -> bool:
        if not self.summary_threshold_tokens or len(self._state.summaries) >= self.max_summaries:
            return False
        if self._steps >= self.max_turns:
            return False  # the episode ends with this reply: no summary would be read
        return self._view_tokens([m["content"] for m in replies]) > self.summary_threshold_tokens

    def _fit_for_summary(
        self, replies: list[Message], tool_turns: list[dict[str, Any]]
    ) -> tuple[list[Message], list[dict[str, Any]]]:
        """Cut this reply's tool messages so that they, the summary request and a reply fit under
        `context_limit` (a huge observation must not make the worker abort the chain instead of summarising)."""
        limit = self.context_limit or 0
        room = limit - self._view_tokens([SUMMARY_PROMPT]) - len(replies) * MESSAGE_OVERHEAD_TOKENS
        used = sum(self._count(m["content"]) for m in replies)
        if used <= room:
            return replies, tool_turns
        share = max(0, room) // max(1, len(replies))
        fitted: list[Message] = []
        for message in replies:
            text = message["content"]
            if self._count(text) > share:
                chars = max(0, share * len(text) // max(1, self._count(text)) - 80)
                text = text[:chars] + "\n[... cut: the context is full; a summary is requested next]"
            fitted.append({"role": message["role"], "content": text})
        turns = [
            {**turn, "content": fitted[i]["content"]} if i < len(fitted) else turn for i, turn in enumerate(tool_turns)
        ]
        return fitted, turns

    def _take_summary(self, action_text: str) -> StepResult:
        """The reply to the summary request: record it, close the segment and restart the conversation from the
        system prompt, the task and the summary."""
        parsed = parse_tool_calls(action_text, self.tools)
        summary = (parsed.final_text or action_text).strip() or "(no summary was written)"
        self._turns.append({"role": "assistant", "content": action_text, "summary": True})
        self._state.lengths.summary_tokens += self._count(action_text)
        self._state.segments.append(self._view_tokens())
        self._state.summaries.append({"turn": self._steps, "text": summary, "tokens": self._count(summary)})
        self._state.awaiting_summary = False
        restart: Message = {"role": "user", "content": f"{SUMMARY_HEADER}\n{summary}\n\n{SUMMARY_FOOTER}"}
        self._messages = [*self.initial_messages(self.task), restart]
        self._turns.append({**restart, "segment_start": len(self._state.segments)})
        self._view_changed = True
        info = self._info(tool_calls=0, malformed_tool_calls=0, tool_errors=0, view_changed=True, summary=True)
        if self._steps >= self.max_turns:
            self._end(answer=None, reason="max_turns", error=f"no finish within max_turns={self.max_turns}")
            return StepResult(None, True, {**info, "truncated": True})
        return StepResult(Observation([restart]), False, info)

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
        self._state.hidden = {
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
        self._state.tests_passed = float(report.fraction)
        return None

    # --- tools ----------------------------------------------------------------------------------------------------

    def run_tool(self, call: ToolCall) -> str:
        """One call on its own (outside a turn's accounting), for tools and tests that need a result text."""
        if call.name == FINISH_TOOL:
            return "finished"
        content, _ = self._run(call)
        return content

    def _run(self, call: ToolCall) -> tuple[str, dict[str, Any]]:
        args = call.arguments
        if call.name == LIST_TOOL:
            return self._list(args.get("path", "")), {}
        if call.name == READ_TOOL:
            return self._read(args["path"], args.get("start_line"), args.get("end_line")), {}
        if call.name == SEARCH_TOOL:
            return self._search(args["pattern"], args.get("path", "")), {}
        if call.name == EDIT_TOOL:
            return self._edit(args["path"], args["search"], args["replace"])
        if call.name == RUN_TOOL:
            return self._command(args["command"])
        raise ToolError(f"unknown tool '{call.name}'")  # parse_tool_calls lets no other name through

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


# --- helpers ------------------------------------------------------------------------------------------------------


_INLINE_SNAPSHOTS: dict[str, Snapshot] = {}
_INLINE_CACHE_SIZE = 8


def _inline_snapshot(sha256: str, files: Mapping[str, str]) -> Snapshot:
    """The snapshot of a task's inline files, built once per process for the episodes of one task (like
    `Snapshot.load`'s cache for stored ones)."""

    snapshot = _INLINE_SNAPSHOTS.get(sha256)
    if snapshot is None:
        snapshot = Snapshot.from_files(dict(files))
        _INLINE_SNAPSHOTS[sha256] = snapshot
        while len(_INLINE_SNAPSHOTS) > _INLINE_CACHE_SIZE:
            _INLINE_SNAPSHOTS.pop(next(iter(_INLINE_SNAPSHOTS)))
    return snapshot


def _prompt_text(task: Task) -> str:
    if isinstance(task.prompt, str):
        return task.prompt
    return next((m["content"] for m in reversed(task.prompt) if m["role"] == "user"), "")
