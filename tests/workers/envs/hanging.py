"""A test environment that never returns from its first step: the stall watchdog's end-to-end test trains with it
(loaded through CRUCIBLE_ENVIRONMENTS, as a user's own environment would be)."""

from __future__ import annotations

import time
from typing import ClassVar

from workers.envs.base import StepResult
from workers.envs.exact_answer import ExactAnswerEnv


def wait_for_a_tool_that_never_answers() -> None:
    while True:
        time.sleep(0.2)


class HangingEnv(ExactAnswerEnv):
    name: ClassVar[str] = "hanging"
    description: ClassVar[str] = "Test only: the first step waits forever, as an environment stuck on a tool would."

    def step(self, action_text: str) -> StepResult:
        wait_for_a_tool_that_never_answers()
        return super().step(action_text)
