"""A coding agent written as code: the SFT teacher for the `coding_agent` environment when no large model is at hand.

Composer 2 was warmed up on a large model's sessions in the same harness. A 135M model on a CPU has no such
teacher and does not call tools by itself, so RL from it sees reward 0 everywhere. This agent plays the large
model's part as `workers.search.teacher.ScriptedSearchAgent` does for search: it knows the task's reference patch
and carries it out through the real tools, so its trajectories show the harness's whole loop (explore, read,
edit, check, finish) with the environment's real observations, and they are scored with the run's reward.

Its policy, one reply at a time (at most `max_calls_per_reply` calls per reply):
1. `list_files` of the repository;
2. `read_file` of every region the patch touches (each hunk with a few lines around it), in original line numbers;
3. `edit_file` for each hunk, bottom-up within a file (so the line numbers it read stay true above each edit):
   search = the hunk's old lines (context and removed), replace = its new lines. When the tool answers that the
   text matches several times, it retries with more of the lines above; a new file is created with an empty
   search, a deleted or renamed one goes through `run` (`rm`, `mv`);
4. `run` of the visible tests of the modules it changed (test files named after them), else
   `python -c "import <module>"`;
5. `finish` with a short message.
Asked for a self-summary (`SUMMARY_PROMPT`), it writes one from its own notes and carries on where it was.

`locate="search"` (teacher `scripted-coding-search`) acts only on what a student could see, so that a small model
can learn to do what it does: steps 1-2 above read lines whose numbers come from the reference patch, which a
student never has, so imitating them teaches it to guess. In this mode the agent
1. searches for the definition the instruction names (`search_code` for `def <name>` and an opening parenthesis in its
   file; for a method, `class <Class>` as a word too, taking the first definition after the class line);
2. reads from that line (no end line: as much as the tool shows), and on from the line after the last one shown
   while the change lies below (at most `SEARCH_MAX_READS` reads);
3. edits only the changed lines of each hunk (widened upwards with lines it read when the text is not unique);
4. finishes (no test run: the episode is short and its reward is the hidden tests).
It needs the row's `source.function` and `source.path` (generated tasks have them) named in its instruction, as
`instruction_style="pinpoint"` writes them; a row without them is solved the patch's way.

    agent = ScriptedCodingAgent.for_row(row)                 # a repo_task/v1 row with a reference_patch
    record = run_episode(env, agent)                         # env: a reset coding_agent environment
    samples = teacher_rollout(coding_teacher_for(), tokenizer, encode, rows, ...)  # the SFT job (workers.rl.teacher)

Its notes, the edits it plans and the parsers of the tools' observations live in `workers.coding.scripted_reading`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from workers.coding.environment_summary import SUMMARY_PROMPT
from workers.coding.patches import FilePatch, parse_patch
from workers.coding.scripted_reading import (
    Edit,
    Notes,
    Observations,
    command_passed,
    leading_context,
    listed_paths,
    minimal_edit,
    module_of,
    named_target,
    observations_since_reply,
    search_lines,
)
from workers.coding.tools import EDIT_TOOL, FINISH_TOOL, LIST_TOOL, READ_TOOL, RUN_TOOL, SEARCH_TOOL, is_test_path
from workers.envs.base import Environment, Message
from workers.envs.toolcalls import format_tool_call

SCRIPTED_CODING_TEACHER = "scripted-coding"
"""The SFT job's `teacher_model` value that selects this agent (as "scripted-search" selects the search one)."""
SCRIPTED_CODING_SEARCH_TEACHER = "scripted-coding-search"
"""The same agent with `locate="search"`: it finds the code the instruction names as a student would."""
SCRIPTED_CODING_TEACHERS = {SCRIPTED_CODING_TEACHER: "patch", SCRIPTED_CODING_SEARCH_TEACHER: "search"}
"""Teacher name -> locate mode."""
SEARCH_MAX_READS = 4
"""locate="search": reads from the definition on, each from the line after the last one shown, at most this many."""

READ_MARGIN = 6
"""Lines read around each hunk (the unified diff's own 3 lines of context, and a few more to extend a search)."""
MAX_CONTEXT_RETRIES = 3
TEST_COMMAND = "python -m pytest -q -x -p no:cacheprovider"

_NUMBERED = re.compile(r"^\s*(\d+)\| ?(.*)$")
_READ_HEADER = re.compile(r"^(\S.*) \(lines \d+-\d+ of \d+\)$")
_MATCHES = re.compile(r"matches (\d+) times")
_DEF = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_][A-Za-z0-9_]*)")


def call(name: str, **arguments: Any) -> str:
    return format_tool_call(name, arguments)


class ScriptedCodingAgent:
    """Solves one task from its reference patch through the `coding_agent` tools (see the module docstring).

    `reply(messages)` takes the conversation so far (as the environment keeps it) and returns the next reply text;
    one agent serves one episode."""

    name = SCRIPTED_CODING_TEACHER

    def __init__(
        self,
        reference_patch: str,
        *,
        instruction: str = "",
        max_calls_per_reply: int = 4,
        target: tuple[str, str] | None = None,
    ) -> None:
        """`target` (path, qualname) of the function to find by search (`locate="search"`); None: read what the
        patch touches."""
        self.files: list[FilePatch] = parse_patch(reference_patch)
        self.instruction = instruction
        self.max_calls = max(1, max_calls_per_reply)
        self.target = target
        self.notes = Notes()
        self._script: Generator[str, Observations, None] | None = None
        self._pending: Observations | None = None  # observations that came with a summary request
        self._last = ""

    @classmethod
    def for_row(
        cls, row: Mapping[str, Any], *, max_calls_per_reply: int = 4, locate: str = "patch"
    ) -> ScriptedCodingAgent:
        """The agent for a task row; ValueError when it has no reference patch to follow. `locate` "search" finds
        the function by search when the row's `source` names it (function and path) and so does its instruction;
        otherwise, and with "patch", it reads what the patch touches."""
        patch = row.get("reference_patch")
        if not isinstance(patch, str) or not patch.strip():
            raise ValueError(f"task {row.get('id')!r} has no reference_patch; the scripted agent needs one")
        if locate not in ("patch", "search"):
            raise ValueError(f"locate must be 'patch' or 'search', got {locate!r}")
        instruction = str(row.get("instruction") or row.get("prompt") or "")
        return cls(
            patch,
            instruction=instruction,
            max_calls_per_reply=max_calls_per_reply,
            target=named_target(row, instruction) if locate == "search" else None,
        )

    # --- the conversation --------------------------------------------------------------------------------------

    def reply(self, messages: Sequence[Message]) -> str:
        if messages and messages[-1]["role"] == "user" and messages[-1]["content"] == SUMMARY_PROMPT:
            self._pending = observations_since_reply(messages[:-1])
            return self.summary()
        if self._script is None:
            self._script = self._plan()
            text = next(self._script)
        else:
            observations = self._pending if self._pending is not None else observations_since_reply(messages)
            self._pending = None
            try:
                text = self._script.send(observations)
            except StopIteration:
                text = call(FINISH_TOOL, message=self._finish_message())
        self._last = text
        return text

    def summary(self) -> str:
        """A self-summary from the agent's notes (what a good summary holds: task, findings, changes, next step)."""
        notes = self.notes
        parts = [f"Task: {self.instruction.strip() or 'fix the reported problem'}"]
        touched = [fp.path for fp in self.files]
        parts.append(f"Files involved: {', '.join(touched)}.")
        for path, names in notes.names.items():
            if names:
                parts.append(f"In {path}, the change concerns {', '.join(f'`{n}`' for n in names)}.")
        if notes.edited:
            parts.append(f"Done: edited {', '.join(dict.fromkeys(notes.edited))}.")
        remaining = [path for path in touched if path not in notes.edited]
        if remaining:
            parts.append(f"Left to do: change {', '.join(remaining)}, then check the result and finish.")
        elif notes.check is None:
            parts.append("Left to do: check the change by running the tests, then finish.")
        else:
            parts.append("Left to do: finish with a short message.")
        return " ".join(parts)

    # --- the plan --------------------------------------------------------------------------------------------------

    def _plan(self) -> Generator[str, Observations, None]:
        if self.target is not None:
            found = yield from self._search_plan(self.target)
            if found:
                return
        notes = self.notes
        observations = yield "Let me look at the repository layout first.\n" + call(LIST_TOOL)
        for text in observations:
            notes.listing += listed_paths(text)

        reads = self._reads()
        for start in range(0, len(reads), self.max_calls):
            batch = reads[start : start + self.max_calls]
            where = ", ".join(dict.fromkeys(path for path, _, _ in batch))
            observations = yield f"I'll read the code the request is about in {where}.\n" + "\n".join(
                call(READ_TOOL, path=path, start_line=first, end_line=last) for path, first, last in batch
            )
            for text in observations:
                self._learn(text)
        self._name_changes()

        yield from self._edit_replies()

        command = self._check_command()
        notes.check = command
        observations = yield "Now let me check that the change works.\n" + call(RUN_TOOL, command=command)
        output = observations[0] if observations else ""
        notes.check_passed = command_passed(output)
        yield call(FINISH_TOOL, message=self._finish_message())

    def _search_plan(self, target: tuple[str, str]) -> Generator[str, Observations, bool]:
        """locate="search": find the definition, read from it, make the minimal edits, finish. False (nothing
        edited yet) when the search does not find the definition or the change is not in what was read: the
        caller then solves it the patch's way."""
        path, qualname = target
        owner, _, name = qualname.rpartition(".")
        calls = [call(SEARCH_TOOL, pattern=f"class {owner}\\b", path=path)] if owner else []
        calls.append(call(SEARCH_TOOL, pattern=f"def {name}\\(", path=path))
        observations = yield f"Let me find `{qualname}` in {path}.\n" + "\n".join(calls)
        lines = [search_lines(text, path) for text in observations]
        defs = lines[-1] if lines else []
        after = lines[0][0] if owner and lines and lines[0] else 0
        start = next((number for number in defs if number > after), None)
        if start is None:
            return False
        changed = [
            hunk.old_start + leading_context(hunk)
            for file_patch in self.files
            if file_patch.old_path == path
            for hunk in file_patch.hunks
        ]
        if not changed or len(self.files) != 1 or min(changed) < start:
            return False
        first, seen = start, False
        for _ in range(SEARCH_MAX_READS):
            # No end_line: the tool shows what fits its output limit, and a student need not add line numbers.
            observations = yield f"I'll read `{qualname}`.\n" + call(READ_TOOL, path=path, start_line=first)
            for text in observations:
                self._learn(text)
            read = self.notes.known.get(path, {})
            seen = all(number in read for number in changed)
            last = max(read, default=0)
            if seen or last < first or not observations or observations[0].startswith("error"):
                break
            first = last + 1
        if not seen:
            return False
        self.notes.names[path] = [qualname]
        yield from self._edit_replies(minimal=True)
        yield call(FINISH_TOOL, message=self._finish_message())
        return True

    def _reads(self) -> list[tuple[str, int, int]]:
        """(path, first, last) windows to read: every modified file's hunks with READ_MARGIN lines around them,
        overlapping windows merged."""
        windows: list[tuple[str, int, int]] = []
        for file_patch in self.files:
            if file_patch.old_path is None or not file_patch.hunks:
                continue
            spans: list[list[int]] = []
            for hunk in file_patch.hunks:
                first = max(1, hunk.old_start - READ_MARGIN)
                last = hunk.old_start + max(hunk.old_count, 1) - 1 + READ_MARGIN
                if spans and first <= spans[-1][1] + 1:
                    spans[-1][1] = max(spans[-1][1], last)
                else:
                    spans.append([first, last])
            windows += [(file_patch.old_path, first, last) for first, last in spans]
        return windows

    def _learn(self, observation: str) -> None:
        """Keep the numbered lines of a read_file result (original numbering: reads come before any edit)."""
        lines = observation.splitlines()
        if not lines:
            return
        header = _READ_HEADER.match(lines[0])
        if header is None:
            return
        known = self.notes.known.setdefault(header.group(1), {})
        for line in lines[1:]:
            match = _NUMBERED.match(line)
            if match:
                known.setdefault(int(match.group(1)), match.group(2))

    def _name_changes(self) -> None:
        """The functions or classes each hunk sits in (the nearest def/class above it in what was read)."""
        for file_patch in self.files:
            known = self.notes.known.get(file_patch.old_path or "", {})
            names: list[str] = []
            for hunk in file_patch.hunks:
                changed = hunk.old_start + leading_context(hunk)
                for number in range(changed, 0, -1):
                    match = _DEF.match(known.get(number, ""))
                    if match:
                        if match.group(1) not in names:
                            names.append(match.group(1))
                        break
            self.notes.names[file_patch.path] = names

    def _edit_replies(self, *, minimal: bool = False) -> Generator[str, Observations, None]:
        """Replies that carry out the patch; a failed edit (ambiguous search text) is retried with more context.
        `minimal`: each hunk's edit holds only its changed lines, not its context (widened when not unique)."""
        queue: list[str | Edit] = []
        for file_patch in self.files:
            old, new = file_patch.old_path, file_patch.new_path
            if new is None and old is not None:
                queue.append(f"rm {shlex.quote(old)}")
                continue
            assert new is not None
            if old is None:
                content = "".join(line for hunk in file_patch.hunks for line in hunk.new)
                queue.append(Edit(new, "", content, 0))
                continue
            if old != new:
                queue.append(
                    f"mkdir -p {shlex.quote(str(PurePosixPath(new).parent))} && mv {shlex.quote(old)} "
                    f"{shlex.quote(new)}"
                )
            for hunk in sorted(file_patch.hunks, key=lambda h: h.old_start, reverse=True):
                edit = (
                    minimal_edit(new, hunk)
                    if minimal
                    else Edit(new, "".join(hunk.old), "".join(hunk.new), hunk.old_start)
                )
                if not edit.search.strip():
                    self._widen(edit, old)  # a pure insertion: anchor it on the lines above
                queue.append(edit)
        while queue:
            batch, queue = queue[: self.max_calls], queue[self.max_calls :]
            paths = list(dict.fromkeys(item.path if isinstance(item, Edit) else "the file layout" for item in batch))
            names = [n for path in paths for n in self.notes.names.get(path, [])]
            what = f"`{'`, `'.join(names)}` in {', '.join(paths)}" if names else ", ".join(paths)
            calls = [
                call(EDIT_TOOL, path=item.path, search=item.search, replace=item.replace)
                if isinstance(item, Edit)
                else call(RUN_TOOL, command=item)
                for item in batch
            ]
            observations = yield f"I'll make the change to {what}.\n" + "\n".join(calls)
            retry: list[str | Edit] = []
            for item, result in zip(batch, observations, strict=False):
                if not isinstance(item, Edit):
                    continue
                if result.startswith("error"):
                    repeated = _MATCHES.search(result)
                    if (
                        repeated
                        and item.context_added < MAX_CONTEXT_RETRIES * READ_MARGIN
                        and self._widen(item, item.path)
                    ):
                        retry.append(item)
                    else:
                        self.notes.failed_edits.append(item.path)
                else:
                    self.notes.edited.append(item.path)
            queue = retry + queue

    def _widen(self, edit: Edit, original_path: str) -> bool:
        """Prepend up to 3 more known original lines above the edit to its search and replace text; False when
        nothing is known above it."""
        known = self.notes.known.get(original_path, {})
        added: list[str] = []
        line = edit.first_line - 1
        while line >= 1 and len(added) < 3 and line in known:
            added.insert(0, known[line] + "\n")
            line -= 1
        if not added:
            return False
        prefix = "".join(added)
        edit.search, edit.replace = prefix + edit.search, prefix + edit.replace
        edit.first_line -= len(added)
        edit.context_added += len(added)
        return True

    def _check_command(self) -> str:
        """The visible tests named after the changed modules (`tests/test_<module>.py`), else an import of them."""
        changed = [fp.path for fp in self.files if fp.new_path is not None and fp.path.endswith(".py")]
        stems = {PurePosixPath(path).stem for path in changed if not is_test_path(path)}
        tests = sorted(
            path
            for path in self.notes.listing
            if is_test_path(path)
            and PurePosixPath(path).name not in ("conftest.py", "__init__.py")
            and any(PurePosixPath(path).stem in (f"test_{stem}", f"{stem}_test") for stem in stems)
        )
        if tests:
            return f"{TEST_COMMAND} {' '.join(shlex.quote(t) for t in tests[:3])}"
        modules = [m for m in dict.fromkeys(module_of(p) for p in changed if not is_test_path(p)) if m]
        if not modules:
            return "python -c \"print('no module to import')\""
        return f'python -c "import {", ".join(modules[:4])}"'

    def _finish_message(self) -> str:
        notes = self.notes
        paths = list(dict.fromkeys(notes.edited)) or [fp.path for fp in self.files]
        names = [n for path in paths for n in notes.names.get(path, [])]
        subject = f"`{'`, `'.join(names)}` in {', '.join(paths)}" if names else ", ".join(paths)
        message = f"I changed {subject} to address the request."
        if notes.failed_edits:
            message += f" Some edits to {', '.join(dict.fromkeys(notes.failed_edits))} did not apply."
        if notes.check_passed is True:
            message += " The check I ran passes."
        elif notes.check_passed is False:
            message += " The check I ran still reports a failure."
        return message


# --- episodes -----------------------------------------------------------------------------------------------------


def run_episode(env: Environment, agent: ScriptedCodingAgent, *, max_replies: int = 200) -> dict[str, Any]:
    """Play `agent` in `env` (already reset on its task) until the episode ends; returns the trajectory record."""
    for _ in range(max_replies):
        result = env.step(agent.reply(env.messages))
        if result.done:
            break
    else:
        env.abort(f"the scripted agent did not finish within {max_replies} replies")
    return env.trajectory(f"scripted-{env.task.id}")


def coding_teacher_for(locate: str = "patch") -> Callable[[Mapping[str, Any], Environment], ScriptedCodingAgent | None]:
    """The scripted coding agent of each task row, for `workers.rl.teacher.teacher_rollout` (the SFT job's loop): it
    never asks for more calls per reply than the environment takes, and rows without a reference patch are skipped
    (None). `locate` is how it finds the change (SCRIPTED_CODING_TEACHERS)."""

    def agent_for(row: Mapping[str, Any], env: Environment) -> ScriptedCodingAgent | None:
        if not str(row.get("reference_patch") or "").strip():
            return None
        return ScriptedCodingAgent.for_row(
            row, max_calls_per_reply=int(getattr(env, "max_calls_per_turn", 4)), locate=locate
        )

    return agent_for
