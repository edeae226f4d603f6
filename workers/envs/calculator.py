"""A small multi-turn environment with one real tool: a calculator over arithmetic word problems.

The model may call `calculate{expression}` as often as it likes (up to `max_turns` replies); a reply without a
tool call is its final answer, whose last number becomes the trajectory's `answer`.

Expressions are evaluated by walking Python's AST and allowing only numbers, + - * / // % **, unary minus
and parentheses: no names, attributes, calls, subscripts or strings, so a model cannot reach the interpreter.
Sizes are bounded (expression length, exponent, every intermediate magnitude), so no call can take long or
allocate much.
"""

from __future__ import annotations

import ast
import math
import operator
import random
from collections.abc import Callable
from typing import Any, ClassVar

from workers.envs.answers import AnswerFormat
from workers.envs.base import ToolError, ToolUseEnvironment
from workers.envs.toolcalls import ToolCall, ToolParameter, ToolSpec

Number = int | float

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 10**18
"""Bound on the absolute value of every literal, intermediate and result."""
MAX_EXPONENT = 100
"""Bound on the absolute value of an exponent."""

_ALLOWED = "numbers, + - * / // % **, unary minus and parentheses"

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot compute; the message is shown to the model."""


def _bounded(value: object) -> Number:
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalculatorError(f"unexpected value {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError(f"number too large (the limit is {MAX_MAGNITUDE:.0e})")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"number too large (the limit is {MAX_MAGNITUDE:.0e})")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exponent} is too large (the limit is {MAX_EXPONENT})")
    if base < 0 and not float(exponent).is_integer():
        raise CalculatorError("a negative number to a fractional power is not a real number")
    # Refuse before computing: an int power's digits grow with exponent·log10(base), and this bound keeps the
    # work small whatever the exponent.
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE) + 1:
        raise CalculatorError(f"number too large (the limit is {MAX_MAGNITUDE:.0e})")
    try:
        return _bounded(operator.pow(base, exponent))
    except ZeroDivisionError:
        raise CalculatorError("division by zero")
    except OverflowError:
        raise CalculatorError(f"number too large (the limit is {MAX_MAGNITUDE:.0e})")


def _evaluate(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculatorError(f"only numbers are allowed, not {node.value!r}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _evaluate(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left)
        right = _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        apply = _BINARY.get(type(node.op))
        if apply is None:
            raise CalculatorError(f"operator {type(node.op).__name__} is not allowed; use {_ALLOWED}")
        try:
            return _bounded(apply(left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero")
        except OverflowError:
            raise CalculatorError(f"number too large (the limit is {MAX_MAGNITUDE:.0e})")
    if isinstance(node, ast.Name):
        raise CalculatorError(f"names are not allowed ({node.id!r}); use {_ALLOWED}")
    if isinstance(node, ast.Attribute):
        raise CalculatorError(f"attribute access is not allowed; use {_ALLOWED}")
    if isinstance(node, ast.Call):
        raise CalculatorError(f"function calls are not allowed; use {_ALLOWED}")
    raise CalculatorError(f"{type(node).__name__} is not allowed; use {_ALLOWED}")


def evaluate_expression(expression: str) -> Number:
    """Value of an arithmetic expression (int, or float once / or a float literal is involved).

    Raises `CalculatorError` for anything but numbers, + - * / // % **, unary +/- and parentheses, for an
    expression over `MAX_EXPRESSION_CHARS` characters, an exponent beyond `MAX_EXPONENT`, a magnitude beyond
    `MAX_MAGNITUDE`, division by zero or a non-real result.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"expression too long ({len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS})"
        )
    if not expression.strip():
        raise CalculatorError("the expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not a valid arithmetic expression: {expression!r}; use {_ALLOWED}")
    except (MemoryError, RecursionError):
        raise CalculatorError("the expression is nested too deeply")
    return _evaluate(tree.body)


def format_number(value: Number) -> str:
    """A result as the model sees it: integers without a decimal point, other floats to 12 significant digits."""
    if isinstance(value, float):
        if value.is_integer():
            return str(int(value))
        return f"{value:.12g}"
    return str(value)


CALCULATE = ToolSpec(
    name="calculate",
    description=f"Evaluate an arithmetic expression and return its value. Supports {_ALLOWED}.",
    parameters=(ToolParameter("expression", "string", "The expression, e.g. (12 + 7) * 3"),),
)

DEFAULT_SYSTEM_PROMPT = (
    "Solve the problem. Use the calculate tool for the arithmetic. When you are done, reply with the final "
    "answer as a number, without a tool call."
)


class CalculatorEnv(ToolUseEnvironment):
    """Arithmetic word problems with a `calculate` tool; the last number of the final reply is the answer."""

    name: ClassVar[str] = "calculator"
    description: ClassVar[str] = (
        "Multi-turn: the model may call a calculate(expression) tool several times, then answers with a number. "
        "Task rows need id, prompt and a numeric answer."
    )
    tools: ClassVar[tuple[ToolSpec, ...]] = (CALCULATE,)

    def __init__(
        self,
        *,
        max_turns: int = 6,
        answer_format: AnswerFormat = "last_number",
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        max_calls_per_turn: int = 4,
    ) -> None:
        super().__init__(
            max_turns=max_turns,
            answer_format=answer_format,
            system_prompt=system_prompt,
            max_calls_per_turn=max_calls_per_turn,
        )

    def run_tool(self, call: ToolCall) -> str:
        try:
            return format_number(evaluate_expression(call.arguments["expression"]))
        except CalculatorError as exc:
            raise ToolError(str(exc))


def _problem(rng: random.Random) -> tuple[str, int]:
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(12, 48), rng.randint(6, 36)
        return f"A crate holds {a} bottles. How many bottles are there in {b} crates?", a * b
    if kind == 1:
        a, b, c = rng.randint(150, 900), rng.randint(20, 140), rng.randint(15, 95)
        return (
            f"Sam had {a} marbles. He gave away {b} and then bought {c} more. How many marbles does Sam have now?",
            a - b + c,
        )
    if kind == 2:
        a, b, c = rng.randint(45, 120), rng.randint(2, 9), rng.randint(10, 60)
        return (
            f"A train travels {a} km every hour for {b} hours and then {c} km more. How many km does it travel?",
            a * b + c,
        )
    if kind == 3:
        each, children = rng.randint(7, 45), rng.randint(3, 12)
        return (
            f"{each * children} stickers are shared equally among {children} children. "
            "How many stickers does each child get?",
            each,
        )
    book, pen, books, pens = rng.randint(8, 30), rng.randint(2, 7), rng.randint(2, 9), rng.randint(3, 12)
    return (
        f"A book costs {book} dollars and a pen costs {pen} dollars. "
        f"How many dollars do {books} books and {pens} pens cost together?",
        book * books + pen * pens,
    )


def word_problem_tasks(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` arithmetic word problems as task rows ({"id", "prompt", "answer"}); the same `seed` gives the same
    rows. Answers are integers written as strings."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for index in range(n):
        question, answer = _problem(rng)
        rows.append(
            {
                "id": f"calc-{seed}-{index}",
                "prompt": f"{question} Give the final answer as a number.",
                "answer": str(answer),
            }
        )
    return rows
