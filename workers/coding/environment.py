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

Siblings. Self-summarisation (docs/methods.md C3) past `summary_threshold_tokens` is `SelfSummary` in
`workers.coding.environment_summary`; the episode's end (the diff, the hidden tests) and its record (trajectory
fields, counts, metrics, the SFT rule) are `EpisodeRecord` in `workers.coding.environment_records`, which builds on
it and which `CodingAgentEnv` inherits; task rows are read by `workers.coding.environment_tasks`.

Token counts come from the policy's tokenizer when the rollout worker binds it (`bind_token_counter`), else a
4-characters-per-token estimate, plus a fixed per-message overhead for the chat template's markers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from workers import storage
from workers.coding.environment_records import EpisodeRecord, select_resolved
from workers.coding.environment_summary import SUMMARY_PROMPT
from workers.coding.environment_tasks import inline_snapshot, parse_task_fields, prompt_text
from workers.coding.tools import (
    EDIT_TOOL,
    FINISH_TOOL,
    LIST_TOOL,
    READ_TOOL,
    RUN_TOOL,
    SEARCH_TOOL,
    CodingTools,
    EpisodeState,
)
from workers.coding.workspace import Snapshot, Workspace
from workers.envs.base import (
    EpisodeStateError,
    Message,
    Observation,
    StepResult,
    Task,
    ToolError,
    approx_tokens,
)
from workers.envs.toolcalls import ToolCall, ToolParameter, ToolSpec, parse_tool_calls
from workers.rewards.schema import coding_agent_spec

if TYPE_CHECKING:
    from workers.coding.task import RepoTask
    from workers.coding.workspace import Snapshot, Workspace

ENV_NAME = "coding_agent"

DEFAULT_SYSTEM_PROMPT = (
    "You are a coding agent working in a Python repository. Explore it with list_files, read_file and "
    "search_code; change files with edit_file (an exact search and replace: copy the text to replace from "
    "read_file's output, without the line numbers); run tests or scripts with run. The user's request may be "
    "short: act on it rather than asking questions the code can answer. When the work is done, call finish with a "
    "short message saying what you changed."
)


class CodingAgentEnv(CodingTools, EpisodeRecord):
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
        """The SFT warm-up's rule for coding episodes: `workers.coding.environment_records.select_resolved` (solved,
        no error, no malformed tool call, once per task and final diff)."""
        return select_resolved(records)

    # --- tasks ----------------------------------------------------------------------------------------------------

    @classmethod
    def validate_task_row(cls, row: object, *, index: int | None = None) -> Task:
        """A repo_task/v1 row (`workers.coding.task`), or a hand-written one whose repository is inline:
        `{"repo": {"files": {path: text}}}` instead of `snapshot` (its family defaults to "imported"). The
        instruction may be spelled `instruction` (the import format) or `prompt` (the generic task row)."""
        if isinstance(row, dict) and row.get("prompt") is None and isinstance(row.get("instruction"), str):
            row = {**row, "prompt": row["instruction"]}
        task = super().validate_task_row(row, index=index)
        parse_task_fields(
            task.metadata | {"id": task.id, "instruction": prompt_text(task)}, environment=cls.name, index=index
        )
        return task

    # --- episode --------------------------------------------------------------------------------------------------

    def _clear(self) -> None:
        super()._clear()
        self._state = EpisodeState()
        self._view_changed = False

    def reset(self, task: Task, *, workspace: Workspace | None = None) -> list[Message]:
        """Start an episode on `task`, in a fresh workspace over its snapshot or, given `workspace`, in a fork of
        it (the caller's workspace is left as it is)."""

        repo_task = parse_task_fields(
            task.metadata | {"id": task.id, "instruction": prompt_text(task)}, environment=self.name
        )
        repo = task.metadata.get("repo")
        if isinstance(repo, Mapping):
            snapshot = inline_snapshot(repo_task.snapshot.sha256, repo["files"])
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
