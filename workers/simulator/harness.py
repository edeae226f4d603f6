"""The bridge between an environment's conversation and OpenAI Chat Completions, as an editor plug-in speaks it.

The goal: the prompt the serving endpoint renders is the prompt the environment builds, so that training on the
recorded sessions is training on the environment's prompts.

- System prompt. The environment's is its own prompt, a blank line, then the tool block
  (`workers.envs.toolcalls.render_tool_prompt`: the tools' JSON schemas and the `<tool_call>` format). The client
  sends the prompt *without* that block and the tools as OpenAI function schemas (`tools`, `ToolSpec.json_schema`);
  the server (`workers.serving.openai_api.render_messages`) turns them back into `ToolSpec`s and appends
  `render_tool_prompt` after a blank line: the same text.
- Replies. The server returns every well-formed `<tool_call>` block as an OpenAI tool call and leaves malformed
  blocks in `content`. The client writes the reply back for `env.step` as the server renders an assistant message
  (`content`, then one `format_tool_call` block per call, joined by newlines; "</" inside a block is written "<\\/", a
  JSON escape, so arguments that hold the closing tag stay one block), so the environment sees what the model wrote:
  its malformed blocks are counted and answered with an error, as in training.
- Results. The environment answers with one `tool` message per call it ran, then one per malformed block, then one
  per call past its per-reply limit; each goes back with the `tool_call_id` of the call it answers. A malformed block
  left in the text has no id from the server: its error goes back under an id of our own (`call_<turn>_x<k>`),
  which the serving endpoint accepts (it renders a `tool` message by its content only) and a strict OpenAI server
  would not (a `tool` message must answer a call of the assistant message before it). That is the one place where a
  faithful copy of the environment is not plain OpenAI usage.

The rest is identical text except the whitespace of the environment's own record of a reply (the server records
the exact token ids it scored and sampled, so training on sessions is exact either way).
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


def _block(name: str, arguments: str) -> str:
    """The `<tool_call>` block of one call (`format_tool_call`'s text); arguments that are not JSON are embedded as
    they are, so the environment finds the call malformed."""
    try:
        parsed: Any = json.loads(arguments) if arguments.strip() else {}
        body = json.dumps({"name": name, "arguments": parsed})
    except ValueError:
        body = '{"name": ' + json.dumps(name) + ', "arguments": ' + arguments + "}"
    return TOOL_CALL_OPEN + body.replace("</", "<\\/") + TOOL_CALL_CLOSE


def encode_reply(
    content: str | None, calls: Sequence[WireCall], tools: Sequence[ToolSpec], *, max_calls_per_turn: int, turn: int = 0
) -> Reply:
    """Turn a completion's message (text and tool calls) into the environment's action text, and work out which
    call each of the environment's `tool` messages answers.

    `ToolUseEnvironment.step` parses the whole action text and answers the well-formed calls it runs (the first
    `max_calls_per_turn`) in order, then each malformed block in order, then each well-formed call past the limit.
    A result answers the server's call with the same name and arguments (in order); a malformed block the server
    left in the text, and anything else the server did not return as a call, is answered under an id of our own
    (`call_<turn>_x<k>`), as the environment answers it with an error the model must see."""
    text = content or ""
    blocks = [_block(call.name, call.arguments) for call in calls]
    action_text = "\n".join(part for part in (text, *blocks) if part)
    parsed = parse_tool_calls(action_text, tools)
    own = (f"call_{turn}_x{k}" for k in range(len(parsed.calls) + len(parsed.errors) + 1))
    wire = [(call.id, parse_tool_calls(block, tools).calls) for call, block in zip(calls, blocks, strict=True)]
    pending = [(call_id, found[0]) for call_id, found in wire if len(found) == 1]
    matched: set[str] = set()
    valid_ids: list[str] = []
    for call in parsed.calls:
        if pending and pending[0][1] == call:
            valid_ids.append(pending.pop(0)[0])
            matched.add(valid_ids[-1])
        else:
            valid_ids.append(next(own))
    unmatched = [call.id for call in calls if call.id not in matched]
    # Errors come in text order: the reply's own text first, then the server's calls, so the last errors answer
    # the server's calls that were not well-formed.
    answered = min(len(parsed.errors), len(unmatched))
    error_ids = [next(own) for _ in range(len(parsed.errors) - answered)] + unmatched[len(unmatched) - answered :]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls
        ]
    run, skipped = valid_ids[:max_calls_per_turn], valid_ids[max_calls_per_turn:]
    return Reply(action_text=action_text, assistant_message=message, result_ids=[*run, *error_ids, *skipped])


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
