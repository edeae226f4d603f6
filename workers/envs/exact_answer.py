"""Single-turn verifiable tasks: the model reads a question and its one reply is the answer.

The trajectory carries `answer` and `gold_answers`, so the reward config's exact_match / normalized_match
(or final_answer_bonus) terms score it; the environment itself hands out no reward.
"""

from __future__ import annotations

from typing import ClassVar

from workers.envs.answers import AnswerFormat, extract_answer
from workers.envs.base import Environment, StepResult


class ExactAnswerEnv(Environment):
    """One question, one reply, done. `answer_format` picks how the reply becomes the answer: the whole
    stripped text ("text") or its last number ("last_number", for numeric tasks a chatty model answers in a
    sentence)."""

    name: ClassVar[str] = "exact_answer"
    description: ClassVar[str] = (
        "Single turn: the model answers a question in one reply, scored against the task's answer by the "
        "reward config's answer-match terms. Task rows need id, prompt and answer."
    )

    def __init__(self, *, answer_format: AnswerFormat = "text", system_prompt: str | None = None) -> None:
        super().__init__(max_turns=1, answer_format=answer_format, system_prompt=system_prompt)

    def step(self, action_text: str) -> StepResult:
        self._begin_step(action_text)
        self._turns.append({"role": "assistant", "content": action_text})
        self._finish(answer=extract_answer(action_text, self.answer_format))
        return StepResult(None, True, self._info(tool_calls=0, malformed_tool_calls=0, tool_errors=0))
