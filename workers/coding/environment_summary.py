"""Self-summarisation of the coding agent (docs/methods.md C3): the summary request and the restart texts, and
`SelfSummary`, the part of `workers.coding.environment.CodingAgentEnv` that asks for a summary, takes it and
rewrites the conversation. The environment itself (tool specs, the episode's steps) is in
`workers.coding.environment`, the episode's end and record in `workers.coding.environment_records` (whose
`EpisodeRecord` builds on `SelfSummary`), the tools' work in `workers.coding.tools`.

With `summary_threshold_tokens` > 0, when a reply's observation would bring the context past the threshold, the
observation is followed by a user message holding `SUMMARY_PROMPT`. The policy's next reply is taken as the summary
(no tool in it runs); the environment then rewrites its conversation to the system prompt, the task and "Summary of
your work so far: ..." and sets `view_changed`, so the rollout worker closes the segment and starts the next from
the rewritten conversation. The chain is one trajectory: every segment's sampled tokens (summaries included) are
trained with the episode's one reward. At most `max_summaries` summaries; `context_limit` (threshold +
`summary_headroom_tokens`) is where the worker aborts, and an observation that would leave no room for the summary
request is cut to fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from workers.coding.tools import EpisodeState
from workers.envs.base import MESSAGE_OVERHEAD_TOKENS, Message, Observation, StepResult, ToolUseEnvironment
from workers.envs.toolcalls import parse_tool_calls

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


class SelfSummary(ToolUseEnvironment):
    """Self-summarisation for a tool-use environment; the environment that inherits it sets these (its
    constructor checks their ranges) and ends episodes with `_end`."""

    summary_threshold_tokens: int
    summary_headroom_tokens: int
    max_summaries: int
    _count: Callable[[str], int]
    _state: EpisodeState
    _view_changed: bool

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

    def _end(self, *, answer: str | None, reason: str, error: str | None = None) -> None:
        raise NotImplementedError

    def _view_tokens(self, extra: Sequence[str] = ()) -> int:
        texts = [*(m["content"] for m in self._messages), *extra]
        return sum(self._count(text) + MESSAGE_OVERHEAD_TOKENS for text in texts)

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
