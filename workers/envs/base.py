"""The environment interface: tasks in, observations out, one scoreable trajectory per episode.

An episode is

    env = make_env("calculator", max_turns=6)
    messages = env.reset(task)                 # initial chat messages for the policy
    while True:
        result = env.step(policy(messages))    # the policy's reply text
        if result.done:
            break
        messages += [reply, *result.observation.messages]
    record = env.trajectory(trajectory_id)     # a `workers.trajectories` record; score it with score_trajectory

Every environment declares, as class attributes, what a task row must hold (`required_task_fields`) and which
trajectory fields it fills (`produces`), so a run that pairs it with a dataset or a reward config it cannot serve
is refused when the run is created (`check_task_fields`, `check_task_rows`, `check_reward_compatible`), not hours
into training. It also declares how it is benchmarked and launched (`score_field`, `default_metric`,
`eval_reward`, `needs_corpus_index`, `referenced_chunk_ids`): the control plane asks the class instead of
comparing environment names, so a new environment needs no edit there. The run-creation checks live in
`workers.envs.checks`, the answer formats in `workers.envs.answers`.
"""

from __future__ import annotations

import abc
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from workers.envs.answers import ANSWER_FORMATS, AnswerFormat, canonical_number, extract_answer
from workers.envs.toolcalls import ToolCall, ToolSpec, json_kind, parse_tool_calls, render_tool_prompt

MESSAGE_OVERHEAD_TOKENS = 4
"""ChatML wraps each message in `<|im_start|>role\\n` ... `<|im_end|>\\n`: about 4 tokens beyond the content."""


def approx_tokens(text: str) -> int:
    """The stand-in token count without a tokenizer: about 4 characters per token for English text."""
    return (len(text) + 3) // 4


class Message(TypedDict):
    """One chat message, as chat templates take them."""

    role: str
    content: str


@dataclass(frozen=True)
class Task:
    """One task of a dataset version.

    `answer` is the reference answer and `aliases` other accepted spellings (together the trajectory's
    `gold_answers`); `metadata` holds every other field of the row, for environments that need more.
    """

    id: str
    prompt: str | list[Message]
    answer: str | None = None
    aliases: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def gold_answers(self) -> list[str]:
        return ([self.answer] if self.answer is not None else []) + list(self.aliases)


@dataclass(frozen=True)
class Observation:
    """What the environment says back after a step: messages to append to the conversation (role "tool")."""

    messages: list[Message]


@dataclass(frozen=True)
class StepResult:
    """Outcome of one step. `observation` is None once `done`; `info` holds this step's counts."""

    observation: Observation | None
    done: bool
    info: dict[str, Any]


class TaskFieldError(ValueError):
    """A task row lacks a field the environment needs, or holds it in the wrong shape."""

    def __init__(self, message: str, *, field: str | None, environment: str) -> None:
        self.field = field
        self.environment = environment
        super().__init__(message)


class ToolError(Exception):
    """A well-formed tool call that failed while running (bad expression, division by zero, ...).

    The message goes back to the model as "error: <message>"; it counts as a tool error, not a malformed call.
    """


class EpisodeStateError(RuntimeError):
    """`step` before `reset` or after `done`, or `trajectory` before the episode ended."""


# --- the interface ------------------------------------------------------------------------------------------------


class Environment(abc.ABC):
    """Base of every environment. Subclasses set the class attributes and implement `step`.

    Class attributes (readable without an instance, for the checks at run creation):
    - `name`, `description`: registry key and help text;
    - `required_task_fields`: fields every task row must hold;
    - `produces`: trajectory fields (`workers.trajectories.Trajectory`) this environment fills;
    - `tools`: the tools it offers (none for single-turn environments);
    - `score_field`: what an eval attempt is scored by unless its benchmark says otherwise: "reward" or a key of
      `episode_metrics`;
    - `default_metric`: the headline metric of a new benchmark on this environment ("pass@1", "mean_score");
    - `needs_corpus_index`: whether the environment searches a corpus, so a run or benchmark must name a corpus
      version whose ready index fills `env_params["index_uri"]`;
    - `dataset_kind`: the kind of dataset its runs train on ("tasks"; "repo_tasks" for repository tasks, whose rows
      name a snapshot and hidden tests and are verified in the sandbox before they are stored);
    - `default_algorithm`: the RL algorithm (a name in `workers.rl.algorithms.ALGORITHMS`) a training run on this
      environment uses when it names none, e.g. "composer" for the coding agent (Composer 2's C1/C2); None keeps
      the trainer's own default (grpo). A run that names an algorithm keeps it (`workers.rl.config.TrainConfig`).
    - `default_substeps`: the optimizer steps per rollout batch (`TrainConfig.substeps`) of a run that names none,
      e.g. 4 for search (Context-1's "4 gradient substeps/step"); None keeps the trainer's own default (1).
    - `default_group_size`: the completions per prompt (`TrainConfig.group_size`) of a run that names none, e.g. 8
      for search (Context-1's "128 queries x 8 envs"); None keeps the trainer's own default (4).
    - `default_max_new_tokens`: the tokens the policy may sample per turn (`sampling.max_new_tokens`) in a run that
      names none: room for the environment's own reply format, e.g. 256 for search (up to `max_output_docs` cited
      documents; the scripted teacher's replies run to about 150 SmolLM2 tokens); None keeps the trainer's 64.
    - `default_reward()`: the recipe's reward spec (JSON) a training launch that names no reward config trains
      with (`apps.training.services.recipe_reward_version` keeps it as a reward config version), e.g. Context-1's
      X2-X5 for search, Kimi K2.5's PARL (K1) for swarm; None (the default): a launch must name one.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    required_task_fields: ClassVar[frozenset[str]] = frozenset({"id", "prompt", "answer"})
    produces: ClassVar[frozenset[str]] = frozenset({"answer", "gold_answers", "turns"})
    tools: ClassVar[tuple[ToolSpec, ...]] = ()
    score_field: ClassVar[str] = "reward"
    default_metric: ClassVar[str] = "mean_score"
    needs_corpus_index: ClassVar[bool] = False
    dataset_kind: ClassVar[str] = "tasks"
    default_algorithm: ClassVar[str | None] = None
    default_substeps: ClassVar[int | None] = None
    default_group_size: ClassVar[int | None] = None
    default_max_new_tokens: ClassVar[int | None] = None

    @classmethod
    def default_reward(cls) -> dict[str, Any] | None:
        """The reward spec (JSON) of this environment's recipe, which a training run that names no reward config
        trains with; None: the environment has no recipe reward, and a launch must name a reward config."""
        return None

    @classmethod
    def eval_reward(cls) -> dict[str, Any]:
        """The reward spec (JSON) an eval's episodes are scored with. Trajectory pages show it; pass or fail is
        the benchmark's `score_field`. By default the answer must match a gold answer exactly."""
        return {"terms": [{"type": "exact_match"}]}

    @classmethod
    def select_for_sft(cls, records: Sequence[Mapping[str, Any]]) -> tuple[list[int], dict[str, Any]] | None:
        """Which teacher episodes the SFT warm-up keeps, for an environment with a rule of its own: (indices of the
        kept records, a report {"generated", "kept", "dropped": {reason: count}}). None (the default): the SFT job's
        configurable filter decides (Context-1's rejection sampling, workers.search.rejection)."""
        return None

    @classmethod
    def referenced_chunk_ids(cls, row: Mapping[str, Any]) -> set[str]:
        """Corpus chunk ids a task row names; at launch each must exist in the corpus version the run searches,
        else the task could never be answered. Environments without a corpus name none."""
        return set()

    def __init__(
        self, *, max_turns: int, answer_format: AnswerFormat = "text", system_prompt: str | None = None
    ) -> None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}")
        self.max_turns = max_turns
        self.answer_format: AnswerFormat = answer_format
        self.system_prompt = system_prompt
        self._task: Task | None = None
        self._clear()

    def _clear(self) -> None:
        self._turns: list[dict[str, Any]] = []
        self._messages: list[Message] = []
        self._steps = 0
        self._tool_calls = 0
        self._malformed = 0
        self._tool_errors = 0
        self._done = False
        self._answer: str | None = None
        self._error: str | None = None

    # task rows

    @classmethod
    def validate_task_row(cls, row: object, *, index: int | None = None) -> Task:
        """Check one dataset row and turn it into a `Task`.

        A row is a JSON object with `id` (string or integer), `prompt` (non-blank text, or a list of
        {"role", "content"} messages) and `answer` (a string or number, or a non-empty list of them: the first
        is the reference, the rest aliases); any other field lands in `metadata`. Raises `TaskFieldError` naming
        the row (`index`, 1-based when given), the field and this environment.
        """
        # One function on purpose: one check per field, in the row's order, each naming its field; split up, the error
        # messages would lose their order.
        where = f"task row {index}" if index is not None else "task row"

        def fail(field_name: str | None, problem: str) -> TaskFieldError:
            return TaskFieldError(f"{where}: {problem}", field=field_name, environment=cls.name)

        if not isinstance(row, dict):
            raise fail(None, f"expected a JSON object, got {json_kind(row)}")
        for name in sorted(cls.required_task_fields):
            if row.get(name) is None:
                present = ", ".join(sorted(map(str, row))) or "none"
                raise fail(
                    name,
                    f"missing field '{name}', which environment '{cls.name}' needs "
                    f"(required: {', '.join(sorted(cls.required_task_fields))}; the row has: {present})",
                )

        raw_id = row.get("id", "")
        if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or (isinstance(raw_id, str) and not raw_id):
            raise fail("id", f"field 'id' must be a non-empty string or an integer, got {json_kind(raw_id)}")

        prompt = row.get("prompt", "")
        if isinstance(prompt, str):
            if "prompt" in cls.required_task_fields and not prompt.strip():
                raise fail("prompt", "field 'prompt' is blank; give the task's question")
            task_prompt: str | list[Message] = prompt
        elif isinstance(prompt, list) and prompt:
            messages: list[Message] = []
            for i, message in enumerate(prompt):
                if not (
                    isinstance(message, dict)
                    and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)
                ):
                    raise fail("prompt", f"field 'prompt[{i}]' must be an object with string 'role' and 'content'")
                messages.append({"role": message["role"], "content": message["content"]})
            task_prompt = messages
        else:
            raise fail(
                "prompt", f"field 'prompt' must be text or a non-empty list of messages, got {json_kind(prompt)}"
            )

        raw_answer = row.get("answer")
        answers: list[str] = []
        if raw_answer is not None:
            candidates = raw_answer if isinstance(raw_answer, list) and raw_answer else [raw_answer]
            for value in candidates:
                if isinstance(value, str) and value.strip():
                    answers.append(value.strip())
                elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                    answers.append(str(value))
                else:
                    raise fail(
                        "answer",
                        "field 'answer' must be a non-blank string, a finite number or a non-empty list of them, "
                        f"got {json_kind(value)}",
                    )

        metadata = {key: value for key, value in row.items() if key not in ("id", "prompt", "answer")}
        return Task(
            id=str(raw_id),
            prompt=task_prompt,
            answer=answers[0] if answers else None,
            aliases=tuple(answers[1:]),
            metadata=metadata,
        )

    # episode

    @property
    def task(self) -> Task:
        if self._task is None:
            raise EpisodeStateError(f"environment '{self.name}' has no task; call reset(task) first")
        return self._task

    @property
    def done(self) -> bool:
        return self._done

    @property
    def messages(self) -> list[Message]:
        """The conversation so far: initial messages, replies and observations."""
        return list(self._messages)

    def initial_messages(self, task: Task) -> list[Message]:
        """System prompt (this environment's, then the tool prompt) followed by the task's prompt."""
        system = "\n\n".join(part for part in (self.system_prompt, render_tool_prompt(self.tools)) if part)
        if isinstance(task.prompt, str):
            prompt: list[Message] = [{"role": "user", "content": task.prompt}]
        else:
            prompt = [Message(role=m["role"], content=m["content"]) for m in task.prompt]
        if not system:
            return prompt
        if prompt and prompt[0]["role"] == "system":
            return [{"role": "system", "content": prompt[0]["content"] + "\n\n" + system}, *prompt[1:]]
        return [{"role": "system", "content": system}, *prompt]

    def reset(self, task: Task) -> list[Message]:
        """Start an episode on `task`; returns the initial chat messages for the policy."""
        self._task = task
        self._clear()
        initial = self.initial_messages(task)
        self._messages = list(initial)
        self._turns = [dict(message) for message in initial]
        return [Message(role=m["role"], content=m["content"]) for m in initial]

    @abc.abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Feed the policy's reply; returns what the environment says back, whether the episode ended, and
        this step's counts in `info`."""

    def abort(self, reason: str) -> None:
        """End the episode early (a timeout, a generation failure); the trajectory carries `reason` as its error."""
        _ = self.task  # raises EpisodeStateError when no episode was started
        self._finish(answer=None, error=reason or "aborted")

    def _begin_step(self, action_text: str) -> None:
        _ = self.task  # raises EpisodeStateError when no episode was started
        if self._done:
            raise EpisodeStateError(f"the episode on task '{self.task.id}' is done; call reset(task) to start another")
        self._steps += 1
        self._messages.append({"role": "assistant", "content": action_text})

    def _finish(self, *, answer: str | None, error: str | None = None) -> None:
        self._done = True
        self._answer = answer
        self._error = error

    def _info(self, **step_counts: Any) -> dict[str, Any]:
        return {"turn": self._steps, **step_counts}

    @property
    def counts(self) -> dict[str, int]:
        """Episode totals: replies (`turns`), tool calls run, malformed calls, calls that failed while running."""
        return {
            "turns": self._steps,
            "tool_calls": self._tool_calls,
            "malformed_tool_calls": self._malformed,
            "tool_errors": self._tool_errors,
        }

    def gold_answers(self) -> list[str]:
        """The task's accepted answers, in the form `extract_answer` gives replies (numbers canonical)."""
        gold = self.task.gold_answers
        if self.answer_format == "last_number":
            return [canonical_number(answer) or answer for answer in gold]
        return gold

    def episode_metrics(self, record: Mapping[str, Any]) -> dict[str, float]:
        """Environment-specific metrics of a finished episode's record (the trainer averages them per step as
        `env/<name>`); none by default."""
        return {}

    def trajectory_fields(self) -> dict[str, Any]:
        """Extra trajectory fields a subclass fills (output_doc_ids, seen_doc_ids, ...); none by default."""
        return {}

    @classmethod
    def ensemble_metrics(cls, records: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
        """Metrics of several attempts at one task fused into one answer (Context-1's "4x": the search outputs
        fused with RRF); None where the environment has no such fusion (the default)."""
        return None

    def trajectory(self, trajectory_id: str | None = None) -> dict[str, Any]:
        """The finished episode as a `workers.trajectories` record (a JSON-able dict, one JSONL line).

        Beyond the parsed fields it carries `env` and `counts` (turns, tool_calls, malformed_tool_calls,
        tool_errors), which the parser ignores and summaries read.
        """
        if not self._done:
            raise EpisodeStateError(
                f"the episode on task '{self.task.id}' is not done; step until done or call abort(reason)"
            )
        return {
            "id": trajectory_id or uuid.uuid4().hex,
            "task_id": self.task.id,
            "env": self.name,
            "answer": self._answer,
            "gold_answers": self.gold_answers(),
            "turns": [dict(turn) for turn in self._turns],
            "error": self._error,
            "counts": self.counts,
            **self.trajectory_fields(),
        }


class ToolUseEnvironment(Environment):
    """A multi-turn environment: each reply either calls tools (the results come back as `tool` messages) or,
    with no tool call, ends the episode as the final answer. Reaching `max_turns` replies ends it too, without
    an answer.

    In the trajectory a reply with k well-formed calls becomes k assistant turns (the first holds the reply's
    text), each followed by its tool turn, because `Trajectory.tool_calls` reads one call per assistant turn;
    a reply with only malformed calls is one assistant turn with no tool. Malformed calls get an error `tool`
    turn without a tool name. `counts["turns"]`, `max_turns` and the turn penalty (X5, `Trajectory.num_turns`)
    all count replies: the 2nd to k-th assistant turns of one reply are marked `continues`.

    Subclasses set `tools` and implement `run_tool`.
    """

    def __init__(
        self,
        *,
        max_turns: int,
        answer_format: AnswerFormat = "text",
        system_prompt: str | None = None,
        max_calls_per_turn: int = 4,
    ) -> None:
        super().__init__(max_turns=max_turns, answer_format=answer_format, system_prompt=system_prompt)
        if isinstance(max_calls_per_turn, bool) or not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1:
            raise ValueError(f"max_calls_per_turn must be an integer >= 1, got {max_calls_per_turn!r}")
        self.max_calls_per_turn = max_calls_per_turn

    @abc.abstractmethod
    def run_tool(self, call: ToolCall) -> str:
        """Run one well-formed call; returns the result text or raises `ToolError`."""

    def _calls_of(self, action_text: str) -> tuple[list[ToolCall], list[str]] | None:
        """Parse a reply and record its assistant turn(s). None when it calls no tool (a final answer); else the
        calls to run (at most `max_calls_per_turn`) and one error string per malformed or skipped call."""
        parsed = parse_tool_calls(action_text, self.tools)
        if not parsed.has_tool_calls:
            self._turns.append({"role": "assistant", "content": action_text})
            return None
        calls = parsed.calls[: self.max_calls_per_turn]
        errors = list(parsed.errors)
        for skipped in parsed.calls[self.max_calls_per_turn :]:
            errors.append(
                f"error: at most {self.max_calls_per_turn} tool calls per reply; the call to '{skipped.name}' "
                "was not run; make it in your next reply"
            )
        if calls:
            for i, call in enumerate(calls):
                self._turns.append(
                    {
                        "role": "assistant",
                        "content": action_text if i == 0 else "",
                        "tool": call.name,
                        "args": call.arguments,
                        **({"continues": True} if i else {}),
                    }
                )
        else:
            self._turns.append({"role": "assistant", "content": action_text})
        return calls, errors

    def step(self, action_text: str) -> StepResult:
        self._begin_step(action_text)
        turn = self._calls_of(action_text)
        if turn is None:
            self._finish(answer=extract_answer(action_text, self.answer_format))
            return StepResult(None, True, self._info(tool_calls=0, malformed_tool_calls=0, tool_errors=0))
        calls, errors = turn

        replies: list[Message] = []
        tool_turns: list[dict[str, Any]] = []
        step_tool_errors = 0
        for call in calls:
            try:
                content = self.run_tool(call)
            except ToolError as exc:
                content = f"error: {exc}"
                step_tool_errors += 1
            replies.append({"role": "tool", "content": content})
            tool_turns.append({"role": "tool", "tool": call.name, "content": content})
        for error in errors:
            replies.append({"role": "tool", "content": error})
            tool_turns.append({"role": "tool", "content": error})
        # Results follow their calls: the i-th assistant turn's result is the i-th tool turn after them all,
        # which is how the policy saw them (one reply, then every result).
        self._turns.extend(tool_turns)
        self._messages.extend(replies)
        self._tool_calls += len(calls)
        self._malformed += len(errors)
        self._tool_errors += step_tool_errors

        info = self._info(tool_calls=len(calls), malformed_tool_calls=len(errors), tool_errors=step_tool_errors)
        if self._steps >= self.max_turns:
            self._finish(answer=None, error=f"no final answer within max_turns={self.max_turns}")
            return StepResult(None, True, {**info, "truncated": True})
        return StepResult(Observation(replies), False, info)
