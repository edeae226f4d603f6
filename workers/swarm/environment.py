"""Kimi K2.5's Agent Swarm on the Context-1 search harness (docs/methods.md section 1, K2 and E.8).

The trainable orchestrator has the search tools of `workers.search.environment` and two more (schemas as in E.8):

- `create_subagent{name, system_prompt}`: define a sub-agent for reuse; a name is defined once, and at most
  `max_subagents` are defined per episode;
- `assign_task{agent, prompt}`: launch a new run of a defined agent on a task. A reply's `create_subagent` calls
  run first, then all its `assign_task` calls start together and run in parallel (Ray tasks on the cluster,
  `workers.swarm.subagents`), at most `max_parallel` per reply; its other tools run after, in order, and every
  result comes back in call order. Each sub-agent has its own context, step limit and the search tools, and
  returns one message, which comes back as the call's tool observation (loss mask 0: sub-agent tokens are never
  trained on). Its whole conversation is stored with the trajectory (`swarm.subagents[*].turns`).

The final answer is a reply without tool calls: the Markdown table of a wide task (scored by item-F1, docs/methods.md
B2) or the answer of a deep task, optionally with `<Document id=...>` items as in the search environment.

**Steps** (K2). One step is one reply (for the orchestrator and for each sub-agent). A stage is one orchestrator
reply; its cost is S_main = 1 plus the most steps any sub-agent it launched took (0 without sub-agents), and an
episode's `critical_steps` is the sum over its stages; `total_steps` counts every reply of every agent. Limits
come from `step_preset` (docs/methods.md's evaluation table: browsecomp 15 / 100, widesearch 100 / 100, in_house
100 / 50, orchestrator / each sub-agent) unless `max_turns` or `subagent_max_steps` is given. Critical steps enter
training as a hard cap (`max_critical_steps`: the episode ends once it is passed) or as a penalty (the
`critical_steps` reward term), or both.

**Bad input** becomes an error observation, counted in `swarm.errors`: `assign_task` to an agent never created
(`unknown_agent`), a name created twice (`duplicate_agent`), more agents than `max_subagents` or more tasks in a
reply than `max_parallel` (`over_cap`), a blank task (`empty_task`); malformed arguments are malformed tool calls
(`counts.malformed_tool_calls`). A sub-agent cut at `subagent_timeout_s` is reported as unfinished (`timeouts`).
A task repeated verbatim within an episode runs, but is counted (`duplicate_tasks`), as spurious parallelism.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from workers import storage
from workers.envs.base import Message, StepResult, Task, TaskFieldError, ToolError
from workers.envs.toolcalls import ToolCall, ToolParameter, ToolSpec
from workers.rewards.schema import parl_spec
from workers.rewards.table import TableSpecError, gold_table_from, normalize_cell
from workers.rewards.table_score import table_metrics
from workers.search.environment import SearchEnv, _Block, _render
from workers.search.rejection import select_trajectories
from workers.search.tools import DOCUMENT_ITEM
from workers.swarm.metrics import swarm_episode_metrics
from workers.swarm.subagents import RUNNERS, SubagentJob, SubagentResult, resolve_runner, run_subagents
from workers.swarm.wide_reading import task_brief

CREATE_TOOL, ASSIGN_TOOL = "create_subagent", "assign_task"
STEP_PRESETS: dict[str, tuple[int, int]] = {"browsecomp": (15, 100), "widesearch": (100, 100), "in_house": (100, 50)}
"""docs/methods.md section 1's step limits at evaluation: (orchestrator, each sub-agent)."""
ERROR_KINDS = (
    "unknown_agent",
    "duplicate_agent",
    "over_cap",
    "empty_task",
    "bad_arguments",
    "timeouts",
    "duplicate_tasks",
)
MAX_TASK_CHARS = 4_000
MAX_AGENT_PROMPT_CHARS = 4_000

DEFAULT_SYSTEM_PROMPT = (
    "You are an orchestrator agent with a search corpus. You can search it yourself (search_corpus, grep_corpus, "
    "read_document, prune_chunks), or define sub-agents with create_subagent and give them tasks with "
    "assign_task: each sub-agent searches on its own and returns one message. When you are done, reply without "
    "any tool call with the final answer in the form the task asks for (a Markdown table when it asks for one)."
)

SUBAGENT_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        CREATE_TOOL,
        "Create a custom subagent with specific system prompt and name for reuse.",
        (
            ToolParameter("name", "string", "Unique name of the sub-agent"),
            ToolParameter("system_prompt", "string", "System prompt that sets the sub-agent's role"),
        ),
    ),
    ToolSpec(
        ASSIGN_TOOL,
        "Launch a new agent to work on a task. 1. You can launch multiple agents concurrently whenever possible, "
        "by making several assign_task calls in one reply. 2. When the agent is done, it will return a single "
        "message back to you.",
        (
            ToolParameter("agent", "string", "Name of a sub-agent created with create_subagent"),
            ToolParameter("prompt", "string", "The task for the agent"),
        ),
    ),
)


MAX_ENTITIES = 1_000


class SwarmEnv(SearchEnv):
    name: ClassVar[str] = "swarm"
    description: ClassVar[str] = (
        "Kimi K2.5 Agent Swarm on the search harness: an orchestrator with the search tools plus create_subagent "
        "and assign_task, whose sub-agents (frozen: scripted or a model checkpoint) search in parallel and return "
        "one message each; critical steps counted per stage. Task rows need id, prompt and gold_chunk_ids (or "
        "gold_doc_ids); wide tasks add a table (item-F1; then the gold ids are optional), deep tasks an answer; "
        "env_params need index_uri (set at launch)."
    )
    score_field: ClassVar[str] = "task_score"
    produces: ClassVar[frozenset[str]] = SearchEnv.produces | {"gold_table", "swarm"}
    tools: ClassVar[tuple[ToolSpec, ...]] = SearchEnv.tools + SUBAGENT_TOOLS
    # Kimi K2.5's recipe (docs/methods.md section 1): its policy loss (K3) with the PARL reward (K1, `default_reward`).
    # The source gives no substep count or group size, so the trainer's own (1 and 4), not the search
    # environment's Context-1 values.
    default_algorithm: ClassVar[str | None] = "kimi"
    default_substeps: ClassVar[int | None] = None
    default_group_size: ClassVar[int | None] = None
    # The orchestrator's reply holds one assign_task call per item of a wide table (bench/swarm_learning_check.py
    # samples 512 per reply); the source gives no cap.
    default_max_new_tokens: ClassVar[int | None] = 512

    def __init__(
        self,
        *,
        index_uri: str,
        step_preset: str = "in_house",
        max_turns: int | None = None,
        subagent_max_steps: int | None = None,
        max_subagents: int = 8,
        max_parallel: int = 8,
        subagent_checkpoint: str = "scripted",
        subagent_temperature: float = 0.0,
        subagent_max_new_tokens: int = 256,
        subagent_token_budget: int = 8_192,
        subagent_timeout_s: float = 300.0,
        subagent_runner: str = "auto",
        subagent_cpus: float = 0.0,
        max_critical_steps: int | None = None,
        token_budget: int = 32_768,
        soft_threshold: float = 0.5,
        hard_cutoff: float = 0.75,
        reserve_tokens: int = 1_024,
        result_budget: int = 2_048,
        top_k: int = 5,
        max_output_docs: int = 10,
        max_calls_per_turn: int | None = None,
        training: bool = True,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    ) -> None:
        # One function on purpose: every setting is checked and the problems are raised together, each naming its
        # field.
        problems: list[str] = []
        if step_preset not in STEP_PRESETS:
            problems.append(f"step_preset must be one of {', '.join(STEP_PRESETS)}, got {step_preset!r}")
        orchestrator, sub = STEP_PRESETS.get(step_preset, STEP_PRESETS["in_house"])
        for name, value, low, high in (
            ("max_turns", max_turns, 1, 10_000),
            ("subagent_max_steps", subagent_max_steps, 1, 10_000),
            ("max_critical_steps", max_critical_steps, 1, 1_000_000),
            ("max_calls_per_turn", max_calls_per_turn, 1, 256),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
            ):
                problems.append(f"{name} must be empty or an integer in [{low}, {high}], got {value!r}")
        for name, value, low, high in (
            ("max_subagents", max_subagents, 1, 256),
            ("max_parallel", max_parallel, 1, 256),
            ("subagent_max_new_tokens", subagent_max_new_tokens, 1, 8_192),
            ("subagent_token_budget", subagent_token_budget, 256, 1_048_576),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                problems.append(f"{name} must be an integer in [{low}, {high}], got {value!r}")
        if not isinstance(subagent_checkpoint, str) or not subagent_checkpoint.strip():
            problems.append("subagent_checkpoint must name 'scripted', a built-in model or a model directory")
        if not isinstance(subagent_temperature, int | float) or not 0 <= subagent_temperature <= 2:
            problems.append(f"subagent_temperature must be in [0, 2], got {subagent_temperature!r}")
        if not isinstance(subagent_timeout_s, int | float) or not 0 < subagent_timeout_s <= 86_400:
            problems.append(f"subagent_timeout_s must be in (0, 86400] seconds, got {subagent_timeout_s!r}")
        if subagent_runner not in RUNNERS:
            problems.append(f"subagent_runner must be one of {', '.join(RUNNERS)}, got {subagent_runner!r}")
        if not isinstance(subagent_cpus, int | float) or not 0 <= subagent_cpus <= 64:
            problems.append(f"subagent_cpus must be in [0, 64], got {subagent_cpus!r}")
        if problems:
            raise ValueError("; ".join(problems))
        super().__init__(
            index_uri=index_uri,
            token_budget=token_budget,
            soft_threshold=soft_threshold,
            hard_cutoff=hard_cutoff,
            reserve_tokens=reserve_tokens,
            result_budget=result_budget,
            max_turns=max_turns or orchestrator,
            top_k=top_k,
            max_output_docs=max_output_docs,
            max_calls_per_turn=max_calls_per_turn or max_parallel + 4,
            training=training,
            system_prompt=system_prompt,
        )
        self.step_preset = step_preset
        self.subagent_max_steps = subagent_max_steps or sub
        self.max_subagents = max_subagents
        self.max_parallel = max_parallel
        self.subagent_checkpoint = subagent_checkpoint.strip()
        self.subagent_temperature = float(subagent_temperature)
        self.subagent_max_new_tokens = subagent_max_new_tokens
        self.subagent_token_budget = subagent_token_budget
        self.subagent_timeout_s = float(subagent_timeout_s)
        self.subagent_runner: Any = subagent_runner
        self.subagent_cpus = float(subagent_cpus)
        self.max_critical_steps = max_critical_steps

    # --- tasks ----------------------------------------------------------------------------------------------------

    @classmethod
    def needs_retrieval_gold(cls, metadata: Mapping[str, Any]) -> bool:
        """A wide task is scored by its table: naming the chunks (or documents) behind it is optional (a task
        imported from WideSearch has none), and without them its retrieval metrics are 0."""
        return metadata.get("table") is None or bool(metadata.get("gold_chunk_ids") or metadata.get("gold_doc_ids"))

    @classmethod
    def select_for_sft(cls, records: Sequence[Mapping[str, Any]]) -> tuple[list[int], dict[str, Any]] | None:
        """The SFT warm-up's rule for wide-table episodes: kept when the whole table is right (item-F1 1, the
        rule `bench/swarm_learning_check.py` warms up with), without an error, once per (task, answer). Retrieval
        recall, which Context-1's filter reads, says nothing of a table and is 0 for a task without chunk gold (a
        WideSearch import), so that filter would drop every such episode. Episodes of deep tasks (no table) go
        through Context-1's filter with its defaults; None when there is no wide episode (the SFT job's configured
        filter decides)."""
        wide = [i for i, r in enumerate(records) if isinstance(r.get("gold_table"), Mapping)]
        if not wide:
            return None
        kept: list[int] = []
        dropped = {"error": 0, "table_wrong": 0, "duplicate": 0}
        seen: set[tuple[str, str]] = set()
        for index in wide:
            record = records[index]
            key = (str(record.get("task_id")), str(record.get("answer") or ""))
            if record.get("error"):
                dropped["error"] += 1
            elif table_metrics(record).get("item_f1", 0.0) < 1.0:
                dropped["table_wrong"] += 1
            elif key in seen:
                dropped["duplicate"] += 1
            else:
                seen.add(key)
                kept.append(index)
        report: dict[str, Any] = {"generated": len(records), "kept": len(kept), "dropped": dropped, "rule": "item_f1"}
        deep = sorted(set(range(len(records))) - set(wide))
        if deep:
            selected = select_trajectories([records[i] for i in deep])
            kept += [deep[i] for i in selected.kept]
            deep_report = selected.report(len(deep))
            report["kept"] = len(kept)
            report["deep"] = deep_report
            for reason, count in deep_report.get("dropped", {}).items():
                report["dropped"][reason] = report["dropped"].get(reason, 0) + count
        return sorted(kept), report

    @classmethod
    def validate_task_row(cls, row: object, *, index: int | None = None) -> Task:
        task = super().validate_task_row(row, index=index)
        table = task.metadata.get("table")
        if table is not None:
            where = f"task row {index}" if index is not None else "task row"
            try:
                gold_table_from(table, where=f"{where}: field 'table'")
            except TableSpecError as exc:
                raise TaskFieldError(str(exc), field="table", environment=cls.name) from None
        entities = task.metadata.get("entities")
        if entities is not None and (
            not isinstance(entities, list)
            or not entities
            or len(entities) > MAX_ENTITIES
            or not all(isinstance(e, str) and e.strip() for e in entities)
        ):
            where = f"task row {index}" if index is not None else "task row"
            raise TaskFieldError(
                f"{where}: field 'entities' must be a list of 1-{MAX_ENTITIES} non-blank names (the rows to fill), "
                "or left out",
                field="entities",
                environment=cls.name,
            )
        return task

    def initial_messages(self, task: Task) -> list[Message]:
        """The search harness's messages, the question followed by what the task's fields state and it does not
        (`workers.swarm.wide_reading.task_brief`): the header of the table to answer with (`table.columns`, key
        columns first) and the rows given as `entities`. A question that already has both is shown as it is."""
        messages = super().initial_messages(task)
        if not isinstance(task.prompt, str):
            return messages
        brief = task_brief(task.prompt, task.metadata.get("table"), task.metadata.get("entities"))
        if brief:
            last = max(i for i, m in enumerate(messages) if m["role"] == "user")
            messages[last] = {"role": "user", "content": messages[last]["content"].rstrip() + "\n\n" + brief}
        return messages

    @classmethod
    def default_reward(cls) -> dict[str, Any] | None:
        """Kimi K2.5's PARL reward (docs/methods.md K1): r_perf + λ1·r_parallel + λ2·r_finish, λ1 and λ2 (0.1 each,
        ours) annealed to 0 over the run's own steps (`Anneal.steps` left empty)."""

        return parl_spec().model_dump(mode="json")

    @classmethod
    def eval_reward(cls) -> dict[str, Any]:
        return parl_spec(lambda_parallel=0.0, lambda_finish=0.0).model_dump(mode="json")

    # --- episode --------------------------------------------------------------------------------------------------

    def _clear(self) -> None:
        super()._clear()
        self._tool_counts.update({CREATE_TOOL: 0, ASSIGN_TOOL: 0})
        self._agents: dict[str, str] = {}
        self._subagents: list[dict[str, Any]] = []
        self._stages: list[dict[str, Any]] = []
        self._errors = dict.fromkeys(ERROR_KINDS, 0)
        self._task_prompts: set[str] = set()
        self._reply_calls: list[ToolCall] = []
        self._launched: dict[int, Any] = {}
        self._stage_steps: list[int] = []
        self._stage_tools: list[str] = []
        self._final_text: str | None = None

    def _calls_of(self, action_text: str) -> tuple[list[ToolCall], list[str]] | None:
        turn = super()._calls_of(action_text)
        self._reply_calls = list(turn[0]) if turn is not None else []
        self._launched = {}
        self._stage_steps = []
        self._stage_tools = [call.name for call in self._reply_calls]
        if turn is None:
            self._final_text = action_text
            return None
        # A reply's create_subagent calls run first, then its assign_task calls all together; its other tools then
        # run in order. Results come back in call order.
        for call in self._reply_calls:
            if call.name == CREATE_TOOL:
                try:
                    self._launched[id(call)] = self._create(call)
                except ToolError as exc:
                    self._launched[id(call)] = exc
        self._launch_reply()
        return turn

    def step(self, action_text: str) -> StepResult:
        result = super().step(action_text)
        sub_max = max(self._stage_steps, default=0)
        self._stages.append(
            {
                "stage": len(self._stages) + 1,
                "main_steps": 1,
                "subagent_steps": list(self._stage_steps),
                "cost": 1 + sub_max,
                "tools": list(self._stage_tools),
            }
        )
        if result.done and self._error is None and self._final_text is not None:
            # The answer keeps its lines (a table is rows of text); <Document> items are taken out as in search.
            self._answer = DOCUMENT_ITEM.sub(" ", self._final_text).strip() or None
        critical = self.critical_steps
        info = {**result.info, "critical_steps": critical, "stage_cost": 1 + sub_max}
        if not result.done and self.max_critical_steps is not None and critical > self.max_critical_steps:
            self._finish(answer=None, error=f"over the critical step limit of {self.max_critical_steps}")
            return StepResult(None, True, {**info, "truncated": True})
        return StepResult(result.observation, result.done, info)

    @property
    def critical_steps(self) -> int:
        """K2: Σ over stages of (1 + the most steps of the sub-agents the stage launched)."""
        return sum(int(stage["cost"]) for stage in self._stages)

    # --- tools ----------------------------------------------------------------------------------------------------

    def _run(
        self, call: ToolCall, pending: list[tuple[list[_Block], dict[str, Any]]]
    ) -> tuple[list[_Block], dict[str, Any]]:
        if call.name == CREATE_TOOL:
            outcome = self._launched[id(call)]
            if isinstance(outcome, ToolError):
                raise outcome
            assert isinstance(outcome, tuple)
            return outcome
        if call.name == ASSIGN_TOOL:
            return self._assign(call, pending)
        return super()._run(call, pending)

    def _refuse(self, kind: str, message: str) -> ToolError:
        self._errors[kind] += 1
        return ToolError(message)

    def _create(self, call: ToolCall) -> tuple[list[_Block], dict[str, Any]]:
        name = str(call.arguments["name"]).strip()
        prompt = str(call.arguments["system_prompt"]).strip()
        if not name or len(name) > 64 or not re.fullmatch(r"[\w.\- ]+", name):
            raise self._refuse("bad_arguments", "name must be 1-64 letters, digits, spaces, '_', '.' or '-'")
        if name in self._agents:
            raise self._refuse(
                "duplicate_agent",
                f"a sub-agent named '{name}' already exists; reuse it with assign_task or pick a new name",
            )
        if len(self._agents) >= self.max_subagents:
            raise self._refuse(
                "over_cap",
                f"at most {self.max_subagents} sub-agents per episode (max_subagents); reuse one of: "
                + ", ".join(sorted(self._agents)),
            )
        if len(prompt) > MAX_AGENT_PROMPT_CHARS:
            raise self._refuse(
                "bad_arguments", f"system_prompt has {len(prompt)} characters; keep it under {MAX_AGENT_PROMPT_CHARS}"
            )
        self._agents[name] = prompt
        return [_Block(f"created sub-agent '{name}'")], {"agent": name}

    def _assign(
        self, call: ToolCall, pending: list[tuple[list[_Block], dict[str, Any]]]
    ) -> tuple[list[_Block], dict[str, Any]]:
        outcome = self._launched.get(id(call))
        if isinstance(outcome, str):
            kind, _, message = outcome.partition(":")
            raise self._refuse(kind, message)
        assert isinstance(outcome, SubagentResult)
        used = self._view_tokens([_render(blocks) for blocks, _ in pending])
        allowance = max(64, min(self.result_budget, self.token_budget - used - self.reserve_tokens))
        state = "finished" if outcome.finished else "did not finish"
        text = f"[sub-agent {outcome.agent} ({outcome.run_id}) {state} in {outcome.steps} step(s)]\n{outcome.message}"
        if self._count(text) > allowance:
            text = self._cut(text, allowance) or text[:200]
        return [_Block(text)], {"agent": outcome.agent, "subagent": outcome.run_id, "finished": outcome.finished}

    def _launch_reply(self) -> None:
        """Start every assign_task call of this reply together; each call's outcome is a result or 'kind:error'."""
        # One function on purpose: the calls of one reply are started, waited for and recorded together: one loop's
        # state.
        jobs: list[tuple[int, SubagentJob]] = []
        over_limit = self._view_tokens() > self.hard_cutoff * self.token_budget
        for call in self._reply_calls:
            if call.name != ASSIGN_TOOL:
                continue
            if over_limit:
                self._launched[id(call)] = (
                    f"over_cap:{ASSIGN_TOOL} refused: the context is over the hard limit of "
                    f"{int(self.hard_cutoff * self.token_budget):,} tokens; prune passages or give your final answer"
                )
                continue
            agent = str(call.arguments.get("agent", "")).strip()
            prompt = str(call.arguments.get("prompt", "")).strip()
            if agent not in self._agents:
                known = ", ".join(sorted(self._agents)) or "none yet"
                self._launched[id(call)] = (
                    f"unknown_agent:unknown sub-agent '{agent}'; create it first with {CREATE_TOOL} (agents: {known})"
                )
            elif not prompt:
                self._launched[id(call)] = "empty_task:the task prompt is blank; say what the sub-agent should do"
            elif len(prompt) > MAX_TASK_CHARS:
                self._launched[id(call)] = (
                    f"bad_arguments:the task has {len(prompt)} characters; keep it under {MAX_TASK_CHARS}"
                )
            elif len(jobs) >= self.max_parallel:
                self._launched[id(call)] = (
                    f"over_cap:at most {self.max_parallel} assign_task calls per reply (max_parallel); this one was "
                    "not run, assign it in your next reply"
                )
            else:
                run_id = f"t{self._steps}-{len(self._subagents) + len(jobs)}"
                key = normalize_cell(prompt)
                if key in self._task_prompts:
                    self._errors["duplicate_tasks"] += 1
                self._task_prompts.add(key)
                seed = int(hashlib.sha256(f"{self.task.id}:{run_id}".encode()).hexdigest()[:8], 16)
                jobs.append(
                    (
                        id(call),
                        SubagentJob(
                            run_id=run_id,
                            agent=agent,
                            system_prompt=self._agents[agent],
                            prompt=prompt,
                            checkpoint=self.subagent_checkpoint,
                            max_steps=self.subagent_max_steps,
                            index_uri=self.index_uri,
                            token_budget=self.subagent_token_budget,
                            max_new_tokens=self.subagent_max_new_tokens,
                            temperature=self.subagent_temperature,
                            seed=seed,
                            storage_options=_storage_options(),
                        ),
                    )
                )
        if not jobs:
            return
        runner = self.subagent_runner

        index = self.index if resolve_runner(runner) != "ray" else None
        results = run_subagents(
            [job for _, job in jobs],
            runner=runner,
            timeout_s=self.subagent_timeout_s,
            cpus=self.subagent_cpus,
            index=index,
        )
        for (call_key, _), outcome in zip(jobs, results, strict=True):
            self._launched[call_key] = outcome
            self._stage_steps.append(outcome.steps)
            if outcome.cut:
                self._errors["timeouts"] += 1
            record = outcome.to_json()
            record["stage"] = self._steps
            self._subagents.append(record)

    # --- the trajectory -------------------------------------------------------------------------------------------

    @property
    def counts(self) -> dict[str, int]:
        counts = super().counts
        counts["subagents"] = len(self._subagents)
        counts["critical_steps"] = self.critical_steps
        return counts

    def swarm_record(self) -> dict[str, Any]:
        sub_steps = sum(int(s["steps"]) for s in self._subagents)
        return {
            "agents": [{"name": name, "system_prompt": prompt} for name, prompt in self._agents.items()],
            "subagents": list(self._subagents),
            "stages": list(self._stages),
            "critical_steps": self.critical_steps,
            "total_steps": self._steps + sub_steps,
            "errors": dict(self._errors),
            "step_limits": {"orchestrator": self.max_turns, "subagent": self.subagent_max_steps},
            "checkpoint": self.subagent_checkpoint,
        }

    def trajectory_fields(self) -> dict[str, Any]:
        fields = super().trajectory_fields()
        table = self.task.metadata.get("table")
        fields["gold_table"] = table if isinstance(table, Mapping) else None
        fields["task_kind"] = "wide" if table is not None else "deep"
        fields["swarm"] = self.swarm_record()
        return fields

    def episode_metrics(self, record: Mapping[str, Any]) -> dict[str, float]:
        return swarm_episode_metrics(record)


def _storage_options() -> dict[str, Any]:
    return dict(storage.STORAGE_OPTIONS)
