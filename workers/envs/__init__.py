"""Environments for RL rollouts: tasks in, chat observations out, one scoreable trajectory per episode.

- `base`: the interface (`Task`, `Observation`, `StepResult`, `Environment`, `ToolUseEnvironment`); `checks`: what
  a run's dataset and reward config must pass before it starts; `answers`: how a reply becomes an answer;
- `toolcalls`: the one tool-call format (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), its parser
  and the system-prompt text that teaches it;
- `exact_answer`: single-turn verifiable tasks; `calculator`: multi-turn word problems with a calculator tool;
- `registry`: environments by name, and toy task generators.
"""

from workers.envs.base import (
    Environment,
    EpisodeStateError,
    Message,
    Observation,
    StepResult,
    Task,
    TaskFieldError,
    ToolError,
    ToolUseEnvironment,
)
from workers.envs.calculator import CalculatorEnv
from workers.envs.checks import check_reward_compatible, check_task_fields, check_task_rows
from workers.envs.exact_answer import ExactAnswerEnv
from workers.envs.registry import ENVIRONMENTS, arithmetic_tasks, environment_choices, make_env
from workers.envs.toolcalls import ParseResult, ToolCall, ToolSpec, parse_tool_calls, render_tool_prompt

__all__ = [
    "ENVIRONMENTS",
    "CalculatorEnv",
    "Environment",
    "EpisodeStateError",
    "ExactAnswerEnv",
    "Message",
    "Observation",
    "ParseResult",
    "StepResult",
    "Task",
    "TaskFieldError",
    "ToolCall",
    "ToolError",
    "ToolSpec",
    "ToolUseEnvironment",
    "arithmetic_tasks",
    "check_reward_compatible",
    "check_task_fields",
    "check_task_rows",
    "environment_choices",
    "make_env",
    "parse_tool_calls",
    "render_tool_prompt",
]
