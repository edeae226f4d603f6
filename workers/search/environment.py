"""Context-1's self-editing search agent (docs/methods.md section 3): the harness around a corpus index.

The model answers a multi-hop question by calling four tools over one corpus version's index:

- `search_corpus(query)`: hybrid BM25 + dense retrieval fused with RRF and reranked (workers.search.index);
  every chunk id shown earlier is an exclusion filter, so a search never repeats a chunk (harness-level dedup);
- `grep_corpus(pattern)`: a regex over the chunks, at most `grep_max_chunks`, under a time limit;
- `read_document(doc_id)`: a document's chunks, reranked against the last query (else the task's question); a
  chunk several documents hold word for word is stored once and labelled `also in <doc ids>`, and reading any of
  those documents shows it;
- `prune_chunks(chunk_ids)`: removes chunks from the model's view. The conversation the model sees is rewritten
  (each pruned chunk becomes a one-line stub), while the full unpruned trajectory is kept for the reward:
  `seen_doc_ids` holds every chunk ever shown.

The token budget (X1), every knob a constructor parameter and so a field of the run spec's `env_params`:
- after every turn the observation ends with the usage line `[Token usage: 14,203/32,768]`;
- above `soft_threshold` x budget a message suggests pruning or answering (training rollouts only);
- above `hard_cutoff` x budget every tool but prune_chunks is refused with an error;
- each result is truncated to min(`result_budget`, what is left of the budget after a `reserve_tokens` reserve
  for the model's next reply).

The final answer is a reply with no tool call, holding up to `max_output_docs` items
`<Document id=CHUNK_ID><Justification>why</Justification></Document>`; their ids become `output_doc_ids`.

Token counts come from the policy's tokenizer when the rollout worker binds it (`bind_token_counter`); without
one (tests, offline tools) a 4-characters-per-token estimate stands in. Counts cover message contents plus a
fixed per-message overhead for the chat template's role markers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from workers import storage
from workers.envs.base import (
    MESSAGE_OVERHEAD_TOKENS,
    Message,
    Observation,
    StepResult,
    Task,
    ToolError,
    ToolUseEnvironment,
    approx_tokens,
)
from workers.envs.toolcalls import ToolCall, ToolSpec
from workers.rewards.schema import context1_spec
from workers.search.index import GrepError, Hit
from workers.search.index_store import load_index
from workers.search.metrics import ensemble_metrics, episode_metrics
from workers.search.records import episode_record
from workers.search.tools import (
    DEFAULT_SYSTEM_PROMPT,
    GREP_TOOL,
    MAX_QUERY_CHARS,
    PRUNE_TOOL,
    READ_TOOL,
    SEARCH_TOOL,
    SEARCH_TOOLS,
    OutputItem,
    check_chunk_fields,
    parse_final_output,
    referenced_chunk_ids,
)
from workers.search.types import also_in, chunk_doc_ids

if TYPE_CHECKING:
    from workers.search.index import Hit, SearchIndex


@dataclass
class _Block:
    """One piece of a tool message in the model's view: a chunk (prunable) or plain text."""

    text: str
    chunk_id: str | None = None
    pruned: bool = False

    def render(self) -> str:
        return f"[chunk {self.chunk_id} pruned]" if self.pruned else self.text


class SearchEnv(ToolUseEnvironment):
    name: ClassVar[str] = "search"
    description: ClassVar[str] = (
        "Context-1 agentic search over a corpus index: search_corpus, grep_corpus, read_document and "
        "prune_chunks under a token budget, answered with <Document id=…> items. Task rows need id, prompt and "
        "gold_chunk_ids (answer and answer_chunk_ids optional), or gold_doc_ids for document gold (scored on the "
        "documents of the chunks); env_params need index_uri (set at launch from the corpus version's index)."
    )
    score_field: ClassVar[str] = "output_recall"
    needs_corpus_index: ClassVar[bool] = True
    # Context-1's RL recipe (docs/methods.md section 3, "RL"): fully on-policy CISPO, 4 gradient substeps per step, 8
    # episodes per query, and its reward (X2-X5, `default_reward`). A run that names its own keeps it.
    default_algorithm: ClassVar[str | None] = "cispo"
    default_substeps: ClassVar[int | None] = 4
    default_group_size: ClassVar[int | None] = 8
    # A final answer cites up to max_output_docs documents with a justification each, and one reply may hold three
    # quoted searches: the scripted teacher's replies run to 147 SmolLM2 tokens, and at 96 a third of them were cut
    # (docs/recipe-learning-checks.md, the search check's sixth attempt). The source gives no cap.
    default_max_new_tokens: ClassVar[int | None] = 256
    # and gold_chunk_ids, or gold_doc_ids for document gold (checked in validate_task_row: one of the two)
    required_task_fields: ClassVar[frozenset[str]] = frozenset({"id", "prompt"})
    produces: ClassVar[frozenset[str]] = frozenset(
        {"answer", "gold_answers", "turns", "output_doc_ids", "gold_doc_ids", "seen_doc_ids", "answer_doc_ids"}
    )
    tools: ClassVar[tuple[ToolSpec, ...]] = SEARCH_TOOLS

    def __init__(
        self,
        *,
        index_uri: str,
        token_budget: int = 32_768,
        soft_threshold: float = 0.5,
        hard_cutoff: float = 0.75,
        reserve_tokens: int = 1_024,
        result_budget: int = 2_048,
        max_turns: int = 32,
        top_k: int = 5,
        grep_max_chunks: int = 5,
        grep_timeout_s: float = 0.5,
        max_output_docs: int = 10,
        max_calls_per_turn: int = 4,
        training: bool = True,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    ) -> None:
        # One function on purpose: every setting is checked and the problems are raised together, each naming its
        # field; then they are stored.
        super().__init__(
            max_turns=max_turns,
            answer_format="text",
            system_prompt=system_prompt,
            max_calls_per_turn=max_calls_per_turn,
        )
        problems = []
        if not isinstance(index_uri, str) or not index_uri:
            problems.append("index_uri must name a built index (set at launch from the corpus version)")
        for name, value, low in (
            ("token_budget", token_budget, 256),
            ("reserve_tokens", reserve_tokens, 0),
            ("result_budget", result_budget, 16),
            ("top_k", top_k, 1),
            ("grep_max_chunks", grep_max_chunks, 1),
            ("max_output_docs", max_output_docs, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                problems.append(f"{name} must be an integer >= {low}, got {value!r}")
        if not (isinstance(soft_threshold, int | float) and 0 < soft_threshold < 1):
            problems.append(f"soft_threshold must be a fraction of the budget in (0, 1), got {soft_threshold!r}")
        elif not (isinstance(hard_cutoff, int | float) and soft_threshold <= hard_cutoff <= 1):
            # docs/methods.md X1: the hard cutoff lies between T_budget/2 and T_budget
            problems.append(
                f"hard_cutoff must be a fraction of the budget in [soft_threshold={soft_threshold}, 1], "
                f"got {hard_cutoff!r}"
            )
        if not (isinstance(grep_timeout_s, int | float) and 0 < grep_timeout_s <= 10):
            problems.append(f"grep_timeout_s must be in (0, 10] seconds, got {grep_timeout_s!r}")
        if not problems and reserve_tokens >= token_budget // 2:
            problems.append(f"reserve_tokens ({reserve_tokens}) must be under half of token_budget ({token_budget})")
        if problems:
            raise ValueError("; ".join(problems))
        self.index_uri = index_uri
        self.token_budget = token_budget
        self.soft_threshold = float(soft_threshold)
        self.hard_cutoff = float(hard_cutoff)
        self.reserve_tokens = reserve_tokens
        self.result_budget = result_budget
        self.top_k = top_k
        self.grep_max_chunks = grep_max_chunks
        self.grep_timeout_s = float(grep_timeout_s)
        self.max_output_docs = max_output_docs
        self.training = training
        self._count: Callable[[str], int] = approx_tokens
        self._index: SearchIndex | None = None

    # --- wiring ---------------------------------------------------------------------------------------------------

    @property
    def context_limit(self) -> int:
        """Tokens the conversation may reach: the rollout worker aborts an episode past it."""
        return self.token_budget

    def bind_token_counter(self, count: Callable[[str], int]) -> None:
        """Count tokens with the policy's tokenizer (the rollout worker binds it)."""
        self._count = count

    def bind_index(self, index: SearchIndex) -> None:
        """Use an index already in memory instead of loading `index_uri` (benchmarks, evaluation tools)."""
        self._index = index

    @property
    def index(self) -> SearchIndex:
        if self._index is None:
            # Loaded on first use, not at construction: the control plane builds environments to check a run's
            # parameters and must not load an index for that. load_index caches per process (once per actor).

            self._index = load_index(self.index_uri, storage.STORAGE_OPTIONS or None)
        return self._index

    # --- tasks ----------------------------------------------------------------------------------------------------

    @classmethod
    def validate_task_row(cls, row: object, *, index: int | None = None) -> Task:
        task = super().validate_task_row(row, index=index)
        if cls.needs_retrieval_gold(task.metadata):
            check_chunk_fields(task, f"task row {index}" if index is not None else "task row", cls.name)
        return task

    @classmethod
    def needs_retrieval_gold(cls, metadata: Mapping[str, Any]) -> bool:
        """Whether a task row must name its gold chunks (or documents): every search task does."""
        return True

    @classmethod
    def referenced_chunk_ids(cls, row: Mapping[str, Any]) -> set[str]:
        """Every chunk id a task row names: gold, answer and distractor chunks, and the chunks of its facts."""
        return referenced_chunk_ids(row)

    @classmethod
    def default_reward(cls) -> dict[str, Any] | None:
        """Context-1's reward (docs/methods.md X2-X5):
        clamp(0.7·F_β + 0.3·r_traj + r_fa − p_prune − p_turn, ε, r_pre)."""
        return context1_spec().model_dump(mode="json")

    @classmethod
    def eval_reward(cls) -> dict[str, Any]:
        """Evals score search episodes with the reward they are trained on (Context-1's), so trajectory pages
        show the same terms in training and evaluation."""
        return context1_spec().model_dump(mode="json")

    # --- episode --------------------------------------------------------------------------------------------------

    def _clear(self) -> None:
        super()._clear()
        self._seen: list[str] = []  # every chunk id shown, in order; never shrinks (the reward's view)
        self._seen_set: set[str] = set()
        self._in_view: set[str] = set()
        self._pruned: list[str] = []
        self._blocks: dict[int, list[_Block]] = {}  # index in self._messages -> that tool message's blocks
        self._usage: list[int] = []
        self._output: list[OutputItem] = []
        self._last_query: str | None = None
        self._tool_counts = {SEARCH_TOOL: 0, GREP_TOOL: 0, READ_TOOL: 0, PRUNE_TOOL: 0}
        self._view_changed = False

    def reset(self, task: Task) -> list[Message]:
        messages = super().reset(task)
        self._usage = [self._view_tokens()]
        return messages

    def _view_tokens(self, extra: Sequence[str] = ()) -> int:
        texts = [*(m["content"] for m in self._messages), *extra]
        return sum(self._count(text) + MESSAGE_OVERHEAD_TOKENS for text in texts)

    def step(self, action_text: str) -> StepResult:
        # One function on purpose: one branch per tool call, each turning the call into its observation and reward.
        self._begin_step(action_text)
        self._view_changed = False
        turn = self._calls_of(action_text)
        if turn is None:
            self._output, answer = parse_final_output(action_text, self.max_output_docs)
            self._finish(answer=answer)
            self._usage.append(self._view_tokens())
            return StepResult(None, True, self._info(tool_calls=0, malformed_tool_calls=0, tool_errors=0))
        calls, errors = turn

        pending: list[tuple[list[_Block], dict[str, Any]]] = []
        step_tool_errors = 0
        for call in calls:
            try:
                blocks, detail = self._run(call, pending)
            except ToolError as exc:
                blocks, detail = [_Block(f"error: {exc}")], {"error": str(exc)}
                step_tool_errors += 1
            self._tool_counts[call.name] += 1
            pending.append((blocks, {"tool": call.name, **detail}))
        for error in errors:
            pending.append(([_Block(error)], {"malformed": True}))

        # The usage line and the budget message close the observation (docs/methods.md X1).
        usage = self._view_tokens([_render(blocks) for blocks, _ in pending])
        notes = [f"[Token usage: {usage:,}/{self.token_budget:,}]"]
        if usage > self.hard_cutoff * self.token_budget:
            notes.append(
                f"You are over the hard limit of {int(self.hard_cutoff * self.token_budget):,} tokens: only "
                f"{PRUNE_TOOL} is allowed now. Prune passages you do not need, or give your final answer."
            )
        elif self.training and usage > self.soft_threshold * self.token_budget:
            notes.append(
                f"Your context is over {self.soft_threshold:.0%} of its budget. Consider pruning passages you no "
                f"longer need with {PRUNE_TOOL}, or give your final answer."
            )
        pending[-1][0].append(_Block("\n" + "\n".join(notes)))

        replies: list[Message] = []
        for blocks, detail in pending:
            content = _render(blocks)
            self._blocks[len(self._messages)] = blocks
            self._messages.append({"role": "tool", "content": content})
            replies.append({"role": "tool", "content": content})
            self._turns.append({"role": "tool", "content": content, **detail})
        self._usage.append(usage)
        self._tool_calls += len(calls)
        self._malformed += len(errors)
        self._tool_errors += step_tool_errors

        info = self._info(
            tool_calls=len(calls),
            malformed_tool_calls=len(errors),
            tool_errors=step_tool_errors,
            token_usage=usage,
            view_changed=self._view_changed,
        )
        if self._steps >= self.max_turns:
            self._finish(answer=None, error=f"no final answer within max_turns={self.max_turns}")
            return StepResult(None, True, {**info, "truncated": True})
        return StepResult(Observation(replies), False, info)

    def run_tool(self, call: ToolCall) -> str:
        """One call on its own (outside a turn's budget accounting), for tools and tests that need a result text."""
        blocks, _ = self._run(call, [])
        return _render(blocks)

    @property
    def view_changed(self) -> bool:
        """Whether the last step rewrote earlier messages (a prune): the rollout worker then re-encodes the whole
        conversation instead of appending to it."""
        return self._view_changed

    # --- tools ----------------------------------------------------------------------------------------------------

    def _run(
        self, call: ToolCall, pending: list[tuple[list[_Block], dict[str, Any]]]
    ) -> tuple[list[_Block], dict[str, Any]]:
        if call.name == PRUNE_TOOL:
            return self._prune(call.arguments["chunk_ids"], [blocks for blocks, _ in pending])
        used = self._view_tokens([_render(blocks) for blocks, _ in pending])
        if used > self.hard_cutoff * self.token_budget:
            raise ToolError(
                f"{call.name} refused: the context is over the hard limit of "
                f"{int(self.hard_cutoff * self.token_budget):,} tokens; only {PRUNE_TOOL} is allowed. Prune "
                "passages or give your final answer"
            )
        allowance = min(self.result_budget, self.token_budget - used - self.reserve_tokens)
        if allowance < 16:
            raise ToolError(f"no token budget left for results; use {PRUNE_TOOL} or give your final answer")
        if call.name == SEARCH_TOOL:
            query = call.arguments["query"].strip()
            if not query:
                raise ToolError("the query is empty; say what to look for")
            if len(query) > MAX_QUERY_CHARS:
                raise ToolError(f"the query has {len(query)} characters; keep it under {MAX_QUERY_CHARS}")
            self._last_query = query
            hits = self.index.search(query, k=self.top_k, exclude=self._seen_set)
            return self._show(hits, allowance, empty="no new passages match; try other words")
        if call.name == GREP_TOOL:
            try:
                hits = self.index.grep(
                    call.arguments["pattern"],
                    max_chunks=self.grep_max_chunks,
                    timeout_s=self.grep_timeout_s,
                    exclude=self._seen_set,
                )
            except GrepError as exc:
                raise ToolError(str(exc))
            return self._show(hits, allowance, empty="no new passage matches the pattern")
        doc_id = call.arguments["doc_id"].strip()
        chunks = self.index.document(doc_id)
        if not chunks:
            hint = f" (chunk {doc_id} belongs to document {doc_id.split('#')[0]})" if "#" in doc_id else ""
            raise ToolError(f"unknown document '{doc_id}'{hint}; use a doc id shown in a passage label")
        query = self._last_query or (self.task.prompt if isinstance(self.task.prompt, str) else "")
        hits = self.index.rerank(query, [c.chunk_id for c in chunks]) if query else []
        if not hits:
            hits = [Hit(chunk=c, score=0.0, ranks={}) for c in chunks]
        return self._show(hits, allowance, empty="the document is empty", repeat_seen=False)

    def _show(
        self, hits: list[Hit], allowance: int, *, empty: str, repeat_seen: bool = True
    ) -> tuple[list[_Block], dict[str, Any]]:
        """Render hits as labelled passages within `allowance` tokens: whole passages while they fit, then the
        next one cut short; record every chunk shown as seen."""
        if not hits:
            return [_Block(empty)], {"results": []}
        blocks: list[_Block] = []
        shown: list[dict[str, Any]] = []
        left = allowance
        truncated = False
        for hit in hits:
            chunk = hit.chunk
            if not repeat_seen and chunk.chunk_id in self._in_view:
                text = f"[chunk {chunk.chunk_id}: already in your context]"
            else:
                docs = chunk_doc_ids(chunk)
                label = f"[chunk {chunk.chunk_id} | doc {chunk.doc_id}" + (f" | {chunk.title}" if chunk.title else "")
                if len(docs) > 1:
                    # Text several documents hold word for word is stored once (workers.search.corpus).
                    label += f" | also in {', '.join(docs[1:])}"
                text = f"{label}]\n{chunk.text}"
            cost = self._count(text) + 1
            if cost > left:
                text = self._cut(text, left)
                truncated = True
                if not text:
                    break
            blocks.append(_Block(text + "\n", chunk_id=chunk.chunk_id))
            shown.append(
                {
                    "chunk_id": chunk.chunk_id,
                    "doc_id": chunk.doc_id,
                    **({"also_in": also_in(chunk)} if also_in(chunk) else {}),
                    "score": round(float(hit.score), 6),
                    "ranks": dict(hit.ranks),
                }
            )
            if chunk.chunk_id not in self._seen_set:
                self._seen_set.add(chunk.chunk_id)
                self._seen.append(chunk.chunk_id)
            self._in_view.add(chunk.chunk_id)
            left -= self._count(text) + 1
            if truncated or left <= 0:
                break
        hidden = len(hits) - len(shown)
        if hidden:
            blocks.append(_Block(f"[{hidden} more passage(s) not shown: token budget]"))
        return blocks, {"results": shown, "truncated": truncated or hidden > 0}

    def _cut(self, text: str, tokens: int) -> str:
        """The longest prefix of `text` within `tokens` (by binary search on characters), marked as cut."""
        if tokens < 8:
            return ""
        low, high = 0, len(text)
        while low < high:
            mid = (low + high + 1) // 2
            if self._count(text[:mid]) + 4 <= tokens:
                low = mid
            else:
                high = mid - 1
        return text[:low] + " …[cut: token budget]" if low else ""

    def _prune(self, raw_ids: list[Any], pending: Sequence[list[_Block]] = ()) -> tuple[list[_Block], dict[str, Any]]:
        ids = [str(item).strip() for item in raw_ids if isinstance(item, str | int) and str(item).strip()]
        if not ids:
            raise ToolError('chunk_ids is empty; list the ids to remove, e.g. ["py:os#2"]')
        pruned = [chunk_id for chunk_id in dict.fromkeys(ids) if chunk_id in self._in_view]
        unknown = [chunk_id for chunk_id in dict.fromkeys(ids) if chunk_id not in self._in_view]
        # Earlier messages and this reply's results not yet shown (a search and a prune in one reply).
        for blocks in [*self._blocks.values(), *pending]:
            for block in blocks:
                if block.chunk_id in pruned and not block.pruned:
                    block.pruned = True
        for position, blocks in self._blocks.items():
            self._messages[position] = {"role": "tool", "content": _render(blocks)}
        self._in_view.difference_update(pruned)
        self._pruned.extend(pruned)
        self._view_changed = self._view_changed or bool(pruned)
        parts = [f"pruned {len(pruned)} chunk(s)" + (f": {', '.join(pruned)}" if pruned else "")]
        if unknown:
            parts.append(f"not in your context, ignored: {', '.join(unknown[:10])}")
        if not pruned:
            raise ToolError("; ".join(parts[1:]) + "; use chunk ids shown in passage labels")
        return [_Block("; ".join(parts))], {"pruned": pruned, "unknown": unknown}

    # --- the trajectory -------------------------------------------------------------------------------------------

    @property
    def counts(self) -> dict[str, int]:
        counts = super().counts
        counts.update({f"{name}_calls": n for name, n in self._tool_counts.items()})
        counts["pruned_chunks"] = len(self._pruned)
        return counts

    def episode_metrics(self, record: Mapping[str, Any]) -> dict[str, float]:
        return episode_metrics(record)

    @classmethod
    def ensemble_metrics(cls, records: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
        """Context-1 (kx): the k attempts' output lists fused with RRF (docs/methods.md section 3), scored as one."""

        return ensemble_metrics(records) if len(records) > 1 else None

    def trajectory_fields(self) -> dict[str, Any]:
        return episode_record(
            self.task.metadata,
            self._index,
            output=[(item.id, item.justification) for item in self._output],
            seen=self._seen,
            pruned=self._pruned,
            usage=self._usage,
            token_budget=self.token_budget,
        )


def _render(blocks: list[_Block]) -> str:
    return "".join(block.render() for block in blocks).strip()
