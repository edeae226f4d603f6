"""Frozen sub-agents (docs/methods.md section 1, Kimi K2.5's Agent Swarm): each `assign_task` runs one.

A sub-agent is an episode of the Context-1 search harness (`workers.search.environment.SearchEnv`) over the run's corpus
index, with its own context, its own step limit (one step is one reply: a tool-calling reply or the final
message) and the agent's system prompt. Its final reply (no tool call) is the one message it returns to the
orchestrator. A sub-agent that raises, runs out of steps or is cut at its time limit returns that as its message
and counts as unfinished.

Sub-agents are frozen: the policy is named by `checkpoint`, never trained:
- `scripted`: a deterministic searcher (`ScriptedSearcher`) for machines without a large model. It searches
  for the item the task names, finds the chunk whose heading documents it and reports the attributes the task asks
  for (read by code, as `workers.search.wide` reads them), or the best passages it found;
- a built-in model name or a model directory: that checkpoint, served by the transformers backend (loaded once per
  process and cached), sampling at the environment's sub-agent temperature.
Their conversations are stored with the orchestrator's trajectory (`SubagentResult.turns`); their messages reach
the orchestrator as tool observations, so their tokens carry loss mask 0 and are never trained on.

`run_subagents` runs one reply's jobs together: as Ray tasks (`runner="ray"`, each on the cluster with
`cpus` CPUs; 0 shares the caller's), on threads in this process (`"threads"`), or one after another (`"serial"`,
the baseline of the fan-out benchmark). `"auto"` is Ray when this process is connected to a Ray cluster (the
trainer's rollout actors are) and threads otherwise (tests, offline tools). Each job has `timeout_s`: one still
running then is cut (a Ray task is cancelled; a thread cannot be killed, so it is abandoned) and reported.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from workers import storage
from workers.envs.base import Task, approx_tokens
from workers.envs.toolcalls import format_tool_call
from workers.models.base import SamplingParams
from workers.models.frozen import frozen_backend
from workers.search.environment import SearchEnv
from workers.search.extract import entity_score, extract_cells, name_pattern
from workers.search.tools import GREP_TOOL, MAX_QUERY_CHARS, READ_TOOL, SEARCH_TOOL
from workers.search.types import Chunk
from workers.search.wide import entity_heading, read_attributes

if TYPE_CHECKING:
    from workers.envs.base import Message
    from workers.search.index import SearchIndex

SCRIPTED = "scripted"
Runner = Literal["auto", "ray", "threads", "serial"]
RUNNERS: tuple[Runner, ...] = ("auto", "ray", "threads", "serial")

SUBAGENT_INSTRUCTIONS = (
    "You are a sub-agent. Search the corpus with the tools to do the task you are given. When you are done, reply "
    "without any tool call: that reply is the one message returned to the agent that assigned you the task, so put "
    "everything it asked for in it."
)

_PASSAGE = re.compile(r"^\[chunk (\S+) \| doc (\S+?)(?: \| [^\]]*)?\]$", re.MULTILINE)
_BACKTICKED = re.compile(r"`([^`\n]{1,200})`")
_REPORT = re.compile(r"\breport(?: its)?:?\s+([A-Za-z_][\w ,|'()/-]*?)(?:\.|$)", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class SubagentJob:
    """One `assign_task`: which agent, what it is told, and the limits it runs under."""

    run_id: str
    agent: str
    system_prompt: str
    prompt: str
    checkpoint: str
    max_steps: int
    index_uri: str
    token_budget: int = 8_192
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    storage_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class SubagentResult:
    """What one sub-agent did: its message back, whether it finished, its steps (replies) and its conversation."""

    run_id: str
    agent: str
    prompt: str
    message: str
    finished: bool
    steps: int
    error: str | None = None
    seconds: float = 0.0
    tokens: int = 0
    turns: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: str = ""
    cut: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class SubagentPolicy(Protocol):
    """A frozen policy: the next reply for a conversation, and how many tokens it generated so far."""

    tokens: int

    def act(self, messages: Sequence[Message]) -> str: ...


# --- the scripted searcher ----------------------------------------------------------------------------------------


def passages(text: str) -> list[tuple[str, str, str]]:
    """(chunk id, doc id, text) of every labelled passage in a search tool's message."""
    out: list[tuple[str, str, str]] = []
    matches = list(_PASSAGE.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        body = re.sub(r"\n\[(?:Token usage|\d+ more passage).*$", "", body, flags=re.DOTALL)
        out.append((match.group(1), match.group(2), body))
    return out


def requested_columns(prompt: str) -> list[str]:
    """The attributes a task asks to report ("... and report: document, kind, first_parameter.", or with " | "
    between them when a column's name holds a comma or "and")."""
    match = _REPORT.search(prompt)
    if not match:
        return []
    listed = match.group(1)
    parts = listed.split("|") if "|" in listed else re.split(r",|\band\b", listed)
    return [part.strip().replace(" ", "_") for part in parts if part.strip()]


class ScriptedSearcher:
    """A deterministic sub-agent for any corpus: search for the item the task names (its first `backticked` name,
    else the task text); report the asked attributes read from the chunk whose heading documents it when there is
    one (`read_attributes`), else from the document most about it (`entity_score`), read whole with
    `read_document` and read by `workers.search.extract` (field lines, tables, sentences); a grep for the name when
    the search surfaced neither. It reports `column: value` lines, or the passages it found."""

    def __init__(self, job: SubagentJob) -> None:
        self.job = job
        names = _BACKTICKED.findall(job.prompt)
        self.target = names[0].strip() if names else None
        self.columns = requested_columns(job.prompt)
        self.tokens = 0
        self._phase = 0
        self._seen: list[tuple[str, str, str]] = []
        self._grepped = False
        self._read: str | None = None

    def _reply(self, text: str) -> str:
        self.tokens += approx_tokens(text)
        return text

    def act(self, messages: Sequence[Message]) -> str:
        if self._phase > 0 and messages and messages[-1]["role"] == "tool":
            for message in reversed(messages):
                if message["role"] != "tool":
                    break
                self._seen.extend(passages(message["content"]))
        self._phase += 1
        if self._phase == 1:
            query = self.target or " ".join(self.job.prompt.split())[:MAX_QUERY_CHARS]
            return self._reply(format_tool_call(SEARCH_TOOL, {"query": query}))
        if not self.target:
            return self._reply(self._report(None))
        heading = self._find()
        if heading is not None:
            return self._reply(self._report(heading))
        if self._read is not None:
            return self._reply(self._report_read(self._read))
        best = self._best()
        if best is not None and (best[0] >= 2 or self._grepped):
            self._read = best[1]
            return self._reply(format_tool_call(READ_TOOL, {"doc_id": best[1]}))
        if not self._grepped:
            self._grepped = True
            pattern = name_pattern(self.target)
            return self._reply(format_tool_call(GREP_TOOL, {"pattern": pattern}))
        return self._reply(self._report(None))

    def _find(self) -> tuple[str, str, str] | None:
        if not self.target:
            return None
        for passage in self._seen:
            if entity_heading(passage[2], self.target) is not None:
                return passage
        return None

    def _best(self) -> tuple[float, str] | None:
        """(score, document) of the passage seen that is most about the target, or None when none names it."""
        assert self.target is not None
        scored = [(entity_score(text, self.target, doc_id=doc_id), doc_id) for _, doc_id, text in self._seen]
        scored = [item for item in scored if item[0] > 0]
        return max(scored, key=lambda item: item[0]) if scored else None

    def _report_read(self, doc_id: str) -> str:
        assert self.target is not None
        text = "\n\n".join(body for _, did, body in self._seen if did == doc_id)
        values = extract_cells(text, self.target, self.columns)
        if not values:
            return self._report(None)
        chunk_id = next(cid for cid, did, _ in self._seen if did == doc_id)
        lines = [f"name: {self.target}"] + [f"{c}: {values[c]}" for c in self.columns if c in values]
        lines += [f"{c}: not found" for c in self.columns if c not in values]
        return "\n".join(lines) + f"\nsource: [chunk {chunk_id} | doc {doc_id}]"

    def _report(self, found: tuple[str, str, str] | None) -> str:
        if found is not None and self.target:
            chunk_id, doc_id, text = found
            values = read_attributes(Chunk(chunk_id, doc_id, 0, text), self.target, self.columns or None)
            lines = [f"name: {self.target}"] + [f"{c}: {values[c]}" for c in self.columns if c in values]
            lines += [f"{c}: not found" for c in self.columns if c not in values]
            return "\n".join(lines) + f"\nsource: [chunk {chunk_id}]"
        if not self._seen:
            return f"nothing found for {self.target or 'the task'}"
        head = f"{self.target}: no heading documents it; " if self.target else ""
        shown = "\n".join(
            f"[chunk {cid} | doc {did}] {' '.join(text.split())[:200]}" for cid, did, text in self._seen[:3]
        )
        return f"{head}the best passages:\n{shown}"


# --- model sub-agents ---------------------------------------------------------------------------------------------


class ModelPolicy:
    """A frozen checkpoint as a sub-agent: each reply is sampled from the re-encoded conversation."""

    def __init__(self, job: SubagentJob) -> None:
        self.backend, self._lock = frozen_backend(job.checkpoint)
        self.job = job
        self.tokens = 0
        self._turn = 0

    def act(self, messages: Sequence[Message]) -> str:
        params = SamplingParams(
            temperature=self.job.temperature,
            max_new_tokens=self.job.max_new_tokens,
            seed=(self.job.seed * 1009 + self._turn) % 2**62,
        )
        self._turn += 1
        prompt = self.backend.encode_chat(list(messages))
        with self._lock:  # one backend per process: one conversation at a time generates on it
            generation = self.backend.generate([prompt], params)[0]
        self.tokens += len(generation.token_ids)
        return str(generation.text)


POLICIES: dict[str, Callable[[SubagentJob], SubagentPolicy]] = {SCRIPTED: ScriptedSearcher}
"""Sub-agent policies by checkpoint name beside the model checkpoints (a name not here is a model)."""


def make_policy(job: SubagentJob) -> SubagentPolicy:
    factory = POLICIES.get(job.checkpoint)
    return factory(job) if factory is not None else ModelPolicy(job)


# --- one sub-agent ------------------------------------------------------------------------------------------------


def run_subagent(job: SubagentJob, index: SearchIndex | None = None) -> SubagentResult:
    """Run one sub-agent to its final message, its step limit or an error; never raises."""

    # One function on purpose: a sub-agent's loop: its turns, its tool calls and its limits share one state, and it
    # never raises.
    started = time.perf_counter()
    try:
        env = SearchEnv(
            index_uri=job.index_uri,
            max_turns=job.max_steps,
            token_budget=job.token_budget,
            reserve_tokens=min(1_024, job.token_budget // 4),
            result_budget=min(2_048, job.token_budget // 4),
            training=False,
            system_prompt="\n\n".join(part for part in (job.system_prompt.strip(), SUBAGENT_INSTRUCTIONS) if part),
            max_output_docs=10,
        )
    except ValueError as exc:
        return _failed(job, exc, time.perf_counter() - started)
    if index is not None:
        env.bind_index(index)
    elif job.storage_options:
        storage.STORAGE_OPTIONS.update(job.storage_options)
    policy: SubagentPolicy | None = None
    error: str | None = None
    message = ""
    try:
        policy = make_policy(job)
        messages = env.reset(Task(id=job.run_id, prompt=job.prompt, metadata={"gold_chunk_ids": []}))
        while True:
            reply = policy.act(messages)
            result = env.step(reply)
            if result.done:
                break
            messages = env.messages
        record = env.trajectory(job.run_id)
        error = record.get("error")
        if error is None:
            message = env.messages[-1]["content"].strip() or "(empty message)"
    except Exception as exc:  # a sub-agent's failure is an observation for the orchestrator, not a crash
        error = f"sub-agent failed: {type(exc).__name__}: {exc}"
        if not env.done and env._task is not None:
            env.abort(error)
    turns: list[dict[str, Any]] = []
    steps = 0
    if env._task is not None and env.done:
        record = env.trajectory(job.run_id)
        turns, steps = record["turns"], int(record["counts"]["turns"])
    seconds, tokens = time.perf_counter() - started, int(getattr(policy, "tokens", 0) or 0)
    if error is not None:
        if error.startswith("no final answer within max_turns"):
            error = f"ran out of its {job.max_steps} steps without a final message"
        return _unfinished(job, error, seconds, steps=steps, tokens=tokens, turns=turns)
    return SubagentResult(
        run_id=job.run_id,
        agent=job.agent,
        prompt=job.prompt,
        message=message,
        finished=True,
        steps=steps,
        seconds=seconds,
        tokens=tokens,
        turns=turns,
        checkpoint=job.checkpoint,
    )


def _unfinished(
    job: SubagentJob,
    error: str,
    seconds: float,
    *,
    steps: int = 0,
    tokens: int = 0,
    turns: list[dict[str, Any]] | None = None,
    cut: bool = False,
) -> SubagentResult:
    """A sub-agent that did not finish: its message back says so and why."""
    return SubagentResult(
        run_id=job.run_id,
        agent=job.agent,
        prompt=job.prompt,
        message=f"error: sub-agent {job.agent} did not finish: {error}",
        finished=False,
        steps=steps,
        error=error,
        seconds=seconds,
        tokens=tokens,
        turns=turns or [],
        checkpoint=job.checkpoint,
        cut=cut,
    )


def _cut(job: SubagentJob, timeout_s: float, seconds: float) -> SubagentResult:
    return _unfinished(job, f"cut at its time limit of {timeout_s:g}s", seconds, steps=job.max_steps, cut=True)


def _failed(job: SubagentJob, exc: BaseException, seconds: float) -> SubagentResult:
    return _unfinished(job, f"sub-agent failed: {type(exc).__name__}: {exc}", seconds)


# --- many sub-agents at once --------------------------------------------------------------------------------------

_remote: Any = None


def _ray_run(job: SubagentJob) -> SubagentResult:
    return run_subagent(job)


def _run_ray(jobs: Sequence[SubagentJob], timeout_s: float, cpus: float) -> list[SubagentResult]:
    import ray

    global _remote
    if _remote is None:
        _remote = ray.remote(max_retries=0)(_ray_run)
    started = time.perf_counter()
    refs = [_remote.options(num_cpus=cpus).remote(job) for job in jobs]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    out: list[SubagentResult] = []
    for job, ref in zip(jobs, refs, strict=True):
        if ref not in done:
            ray.cancel(ref, force=True)
            out.append(_cut(job, timeout_s, time.perf_counter() - started))
            continue
        try:
            out.append(ray.get(ref))
        except Exception as exc:  # the task's worker died: that sub-agent failed
            out.append(_failed(job, exc, time.perf_counter() - started))
    return out


def _run_threads(
    jobs: Sequence[SubagentJob], timeout_s: float, index: SearchIndex | None, workers: int
) -> list[SubagentResult]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="subagent")
    try:
        if workers == 1:  # serial: each job gets its own time limit
            out: list[SubagentResult] = []
            for job in jobs:
                started = time.perf_counter()
                future = pool.submit(run_subagent, job, index)
                try:
                    out.append(future.result(timeout=timeout_s))
                except concurrent.futures.TimeoutError:
                    out.append(_cut(job, timeout_s, time.perf_counter() - started))
                    pool.shutdown(wait=False, cancel_futures=True)
                    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="subagent")
                except Exception as exc:  # run_subagent never raises; a thread that died all the same
                    out.append(_failed(job, exc, time.perf_counter() - started))
            return out
        started = time.perf_counter()
        futures = [pool.submit(run_subagent, job, index) for job in jobs]
        concurrent.futures.wait(futures, timeout=timeout_s)
        out = []
        for job, future in zip(jobs, futures, strict=True):
            if not future.done():
                out.append(_cut(job, timeout_s, time.perf_counter() - started))
            elif future.exception() is not None:  # run_subagent never raises; a thread that died all the same
                out.append(_failed(job, future.exception() or RuntimeError("?"), time.perf_counter() - started))
            else:
                out.append(future.result())
        return out
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def resolve_runner(runner: Runner) -> Runner:
    if runner != "auto":
        return runner
    try:
        import ray

        return "ray" if ray.is_initialized() else "threads"
    except ImportError:
        return "threads"


def run_subagents(
    jobs: Sequence[SubagentJob],
    *,
    runner: Runner = "auto",
    timeout_s: float = 300.0,
    cpus: float = 0.0,
    index: SearchIndex | None = None,
) -> list[SubagentResult]:
    """Run `jobs` together and return their results in order (see the module docstring for the runners). `index`
    (threads and serial) lets in-process sub-agents share the orchestrator's index instead of loading it."""
    if not jobs:
        return []
    chosen = resolve_runner(runner)
    if chosen == "ray":
        return _run_ray(jobs, timeout_s, cpus)
    return _run_threads(jobs, timeout_s, index, workers=1 if chosen == "serial" else len(jobs))
