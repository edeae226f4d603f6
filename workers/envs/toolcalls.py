"""Tool calls in model output: the one format environments accept, its parser and the prompt that teaches it.

The format (Hermes style, which SmolLM2-Instruct and most open chat models emit when shown tool schemas):

    <tool_call>{"name": "calculate", "arguments": {"expression": "12 * (3 + 4)"}}</tool_call>

- One call per `<tool_call>...</tool_call>` block; a reply may hold several blocks, run in order.
- The block holds exactly one JSON object with a string `name` (a tool the environment offers) and an
  `arguments` object (may be omitted when the tool takes none). No other keys.
- Text outside the blocks is the reply's `final_text`; a reply with no block at all is a final answer.

Anything else inside or around the tags (invalid JSON, an unknown tool, a missing or mistyped argument, an
unclosed tag) is a malformed call: it is not run, and `parse_tool_calls` returns an error string the
environment sends back to the model as a `tool` message ("error: ...; expected format: ..."), so the model can
correct itself and the episode counts the mistake.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FORMAT_HINT = '<tool_call>{"name": "<tool name>", "arguments": {"<argument>": <value>}}</tool_call>'

ParamType = Literal["string", "integer", "number", "boolean", "array", "object"]

_TYPE_WORDS: dict[str, str] = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a JSON array",
    "object": "a JSON object",
}
_PLACEHOLDERS: dict[str, str] = {
    "string": '"<string>"',
    "integer": "<integer>",
    "number": "<number>",
    "boolean": "<true|false>",
    "array": "[...]",
    "object": "{...}",
}


@dataclass(frozen=True)
class ToolParameter:
    """One argument of a tool, typed with a JSON Schema primitive type."""

    name: str
    type: ParamType
    description: str
    required: bool = True


@dataclass(frozen=True)
class ToolSpec:
    """A tool an environment offers: its name, what it does and its arguments."""

    name: str
    description: str
    parameters: tuple[ToolParameter, ...] = ()

    def json_schema(self) -> dict[str, Any]:
        """The tool as a function schema ({"type": "function", "function": {...}}), as chat templates expect."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: {"type": p.type, "description": p.description} for p in self.parameters},
                    "required": [p.name for p in self.parameters if p.required],
                },
            },
        }

    def example_call(self) -> str:
        """A correctly formed call with placeholders, shown to the model after a mistake with this tool."""
        args = ", ".join(f'"{p.name}": {_PLACEHOLDERS[p.type]}' for p in self.parameters)
        return f'{TOOL_CALL_OPEN}{{"name": "{self.name}", "arguments": {{{args}}}}}{TOOL_CALL_CLOSE}'


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call to a known tool, its arguments checked against the tool's parameters."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParseResult:
    """What a model reply holds: the valid calls (in order), one error string per malformed call, and the text
    outside the tool-call blocks (stripped)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    final_text: str = ""

    @property
    def has_tool_calls(self) -> bool:
        """Whether the reply tried to call a tool at all (well-formed or not); if not, it is a final answer."""
        return bool(self.calls or self.errors)


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """Write one call in the accepted format (for scripted agents, demos and tests)."""
    return TOOL_CALL_OPEN + json.dumps({"name": name, "arguments": arguments}) + TOOL_CALL_CLOSE


def render_tool_prompt(tools: Sequence[ToolSpec]) -> str:
    """System-prompt text that lists `tools` as JSON schemas and explains the call format; "" without tools."""
    if not tools:
        return ""
    schemas = "\n".join(json.dumps(tool.json_schema()) for tool in tools)
    return (
        "You can call tools to help you. The available tools, as JSON schemas:\n"
        f"<tools>\n{schemas}\n</tools>\n"
        "To call a tool, write a JSON object with the tool's name and arguments between tags, exactly like this:\n"
        f"{FORMAT_HINT}\n"
        "You may make several calls in one reply. Each result comes back to you in a message from the tool. "
        "When you know the final answer, reply with the answer as plain text and no tool call."
    )


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a valid JSON number")


def json_kind(value: object) -> str:
    """How an error message names a JSON value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _matches(value: object, kind: ParamType) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    return isinstance(value, dict)


def _format_error(problem: str, hint: str = FORMAT_HINT) -> str:
    return f"error: {problem}; expected format: {hint}"


def _parse_block(body: str, tools: dict[str, ToolSpec]) -> ToolCall | str:
    """One block's body -> the call, or the error string to send back to the model."""
    if not body.strip():
        return _format_error(f"empty {TOOL_CALL_OPEN} block")
    try:
        obj = json.loads(body, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        return _format_error(f"invalid JSON in {TOOL_CALL_OPEN} block: {exc.msg} (column {exc.colno})")
    except ValueError as exc:
        return _format_error(f"invalid JSON in {TOOL_CALL_OPEN} block: {exc}")
    if not isinstance(obj, dict):
        return _format_error(f"the {TOOL_CALL_OPEN} block holds {json_kind(obj)}, not an object")
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        keys = ", ".join(f"'{key}'" for key in extra)
        return _format_error(f"unexpected key {keys} in the call; use only 'name' and 'arguments'")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return _format_error("the call has no 'name' string")
    spec = tools.get(name)
    if spec is None:
        available = ", ".join(sorted(tools)) if tools else "none (answer with plain text)"
        return _format_error(f"unknown tool '{name}'; available tools: {available}")
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        return _format_error(
            f"'arguments' of '{name}' must be a JSON object, not {json_kind(arguments)}", spec.example_call()
        )
    known = {p.name: p for p in spec.parameters}
    unknown = sorted(set(arguments) - set(known))
    if unknown:
        names = ", ".join(f"'{arg}'" for arg in unknown)
        return _format_error(f"tool '{name}' has no argument {names}", spec.example_call())
    for param in spec.parameters:
        if param.name not in arguments:
            if param.required:
                return _format_error(
                    f"tool '{name}' is missing required argument '{param.name}' ({_TYPE_WORDS[param.type]})",
                    spec.example_call(),
                )
            continue
        value = arguments[param.name]
        if not _matches(value, param.type):
            return _format_error(
                f"argument '{param.name}' of tool '{name}' must be {_TYPE_WORDS[param.type]}, got {json_kind(value)}",
                spec.example_call(),
            )
    return ToolCall(name=name, arguments=dict(arguments))


def parse_tool_calls(text: str, tools: Sequence[ToolSpec]) -> ParseResult:
    """Find every `<tool_call>` block in a model reply and check it against `tools`.

    Returns the well-formed calls in order, one error string per malformed block (an unclosed `<tool_call>`
    and a stray `</tool_call>` count as one malformed call each), and the text outside the blocks.
    """
    by_name = {tool.name: tool for tool in tools}
    result = ParseResult()
    outside: list[str] = []
    pos = 0
    while True:
        start = text.find(TOOL_CALL_OPEN, pos)
        segment = text[pos:] if start < 0 else text[pos:start]
        if TOOL_CALL_CLOSE in segment:
            result.errors.append(_format_error(f"{TOOL_CALL_CLOSE} without an opening {TOOL_CALL_OPEN}"))
            segment = segment.replace(TOOL_CALL_CLOSE, "")
        outside.append(segment)
        if start < 0:
            break
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        if end < 0:
            result.errors.append(_format_error(f"{TOOL_CALL_OPEN} is never closed with {TOOL_CALL_CLOSE}"))
            break
        parsed = _parse_block(text[body_start:end], by_name)
        if isinstance(parsed, ToolCall):
            result.calls.append(parsed)
        else:
            result.errors.append(parsed)
        pos = end + len(TOOL_CALL_CLOSE)
    result.final_text = "".join(outside).strip()
    return result
