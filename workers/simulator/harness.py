"""The bridge between an environment's conversation and OpenAI Chat Completions, as an editor plug-in speaks it.

The environment builds its system prompt as its own prompt, a blank line, then the tool block
(`workers.envs.toolcalls.render_tool_prompt`: the tools' JSON schemas and the `<tool_call>` format). A client of the
serving endpoint sends the prompt *without* that block and the tools as OpenAI function schemas (`tools`); the
server renders them into the system prompt the same way (`render_tool_prompt` over the same schemas, each
`json.dumps`-ed in the order received), so the prompt the policy sees when serving is the prompt it sees when
training in the environment. The server parses the reply's `<tool_call>` blocks into OpenAI `tool_calls`.

Back on the client, a reply is re-encoded into the action text `env.step` takes: its text, then one `<tool_call>`
block per call (`format_tool_call`'s JSON; "</" is written "<\\/", a JSON escape, so a call whose arguments hold the
closing tag stays one block). A call whose `arguments` are not a JSON object is passed on as it is, so the
environment counts it as malformed and answers with its error, which goes back to the model as that call's `tool`
message. `<tool_call>` tags left in the reply's text are dropped (the server parsed every call it could; its
recording keeps the raw completion).

Where the two views differ: the environment records each reply as one assistant message whose text is the reply's
text and its calls' blocks joined by newlines; how the server renders an assistant message with `tool_calls` back
into the next prompt is the serving side's choice, so the two texts of a past reply may differ in whitespace. The
server records the exact token ids it scored and sampled, so training on sessions is exact either way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.envs.base import Message
from workers.envs.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolSpec, parse_tool_calls, render_tool_prompt


def openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The environment's tools as OpenAI function schemas (`tools` of a chat request)."""
    return [tool.json_schema() for tool in tools]


def request_messages(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The environment's conversation as a client sends it: the tool block cut from the system prompt (the server
    renders it from `tools`), every other message as it is."""
    block = render_tool_prompt(tools)
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        content = message["content"]
        if index == 0 and message["role"] == "system" and block:
            if content == block:
                continue  # the environment has no prompt of its own: the server's tool block is all of it
            if content.endswith("\n\n" + block):
                content = content[: -len(block) - 2]
        out.append({"role": message["role"], "content": content})
    return out


@dataclass(frozen=True)
class WireCall:
    """One tool call as the server returned it: its id, the function's name and its `arguments` string."""

    id: str
    name: str
    arguments: str


@dataclass
class Reply:
    """A completion, ready for both sides: `action_text` for `env.step`, `assistant_message` for the next request,
    and `result_ids`: the tool_call_id of each `tool` message the environment answers with, in its order."""

    action_text: str
    assistant_message: dict[str, Any]
    result_ids: list[str] = field(default_factory=list)

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.assistant_message.get("tool_calls"))


def _block(name: str, arguments: str) -> str:
    """The `<tool_call>` block of one call; arguments that are not JSON are embedded as they are (a malformed call)."""
    try:
        parsed: Any = json.loads(arguments) if arguments.strip() else {}
        body = json.dumps({"name": name, "arguments": parsed})
    except (json.JSONDecodeError, ValueError):
        body = '{"name": ' + json.dumps(name) + ', "arguments": ' + arguments + "}"
    return TOOL_CALL_OPEN + body.replace("</", "<\\/") + TOOL_CALL_CLOSE


def _without_tags(text: str) -> str:
    return text.replace(TOOL_CALL_OPEN, "").replace(TOOL_CALL_CLOSE, "")


def encode_reply(
    content: str | None, calls: Sequence[WireCall], tools: Sequence[ToolSpec], *, max_calls_per_turn: int
) -> Reply:
    """Turn a completion's message (text and tool calls) into the environment's action text, and work out which
    call each of the environment's `tool` messages answers.

    `ToolUseEnvironment.step` answers the calls it runs (the first `max_calls_per_turn` well-formed ones) in order,
    then one error per malformed call in order, then one per well-formed call past the limit."""
    text = _without_tags(content or "").strip()
    blocks = [_block(call.name, call.arguments) for call in calls]
    action_text = "\n".join(part for part in (text, *blocks) if part)
    well_formed: list[str] = []
    malformed: list[str] = []
    for call, block in zip(calls, blocks, strict=True):
        (well_formed if parse_tool_calls(block, tools).calls else malformed).append(call.id)
    run, skipped = well_formed[:max_calls_per_turn], well_formed[max_calls_per_turn:]
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls
        ]
    return Reply(action_text=action_text, assistant_message=message, result_ids=[*run, *malformed, *skipped])


def observation_messages(observation: Sequence[Message], result_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The environment's answer to a reply as chat messages: its `tool` messages each with the tool_call_id of the
    call it answers, other messages (a user message such as the self-summary request) as they are."""
    out: list[dict[str, Any]] = []
    ids = iter(result_ids)
    for message in observation:
        if message["role"] == "tool":
            call_id = next(ids, None)
            if call_id is None:  # more results than calls: cannot happen with the encoding above; keep the text
                if out and out[-1]["role"] == "tool":
                    out[-1]["content"] += "\n" + message["content"]
                    continue
                out.append({"role": "user", "content": message["content"]})
                continue
            out.append({"role": "tool", "tool_call_id": call_id, "content": message["content"]})
        else:
            out.append({"role": message["role"], "content": message["content"]})
    return out
