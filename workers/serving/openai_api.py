"""The OpenAI Chat Completions wire format, and how a request becomes the prompt the environments use.

Requests are checked by pydantic models that refuse unknown fields (as OpenAI does), so a typo costs a 400 naming
the field (`APIError.param`, e.g. `messages[2].tool_calls[0].function.arguments`) instead of a silent default.

Rendering follows the environments exactly (`workers.envs.base.Environment.initial_messages`), so a served policy
sees the prompts it was trained on:
- `tools` (OpenAI function schemas) become `ToolSpec`s and are listed in the system prompt by
  `render_tool_prompt`: appended to the client's first system message after a blank line, or as a system message of
  their own when the client sent none;
- an assistant message's `tool_calls` are written back as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks after its text, one per line (`format_tool_call`);
- a `tool` message is `{"role": "tool", "content": ...}` (the environments' observation; the id is not shown);
- then the tokenizer's chat template (`workers.models.base.encode_chat`).

A reply is split into OpenAI `tool_calls` by `split_reply` (each `<tool_call>` block checked by the environments'
`parse_tool_calls` against the request's tools); a malformed block stays in `content`, where the client sees what
the model wrote. Without `tools` the content is the model's text, untouched.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workers.envs.toolcalls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParamType,
    ToolCall,
    ToolParameter,
    ToolSpec,
    format_tool_call,
    parse_tool_calls,
    render_tool_prompt,
)
from workers.serving.openai_request import (
    PARAM_TYPES,
    AssistantMessage,
    ChatCompletionRequest,
    SystemMessage,
    ToolDef,
    UserMessage,
    bad_request,
    content_text,
)

# --- rendering -----------------------------------------------------------------------------------------------------


def _param_type(schema: Mapping[str, Any], where: str) -> ParamType:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if not isinstance(kind, str) or kind not in PARAM_TYPES:
        raise bad_request(
            f"{where}.type: each parameter needs one JSON type of {', '.join(sorted(PARAM_TYPES))} "
            f"(optionally with 'null'), got {schema.get('type')!r}",
            param=f"{where}.type",
        )
    return kind  # type: ignore[return-value]


def tool_specs(tools: Sequence[ToolDef]) -> list[ToolSpec]:
    """OpenAI function schemas -> the environments' `ToolSpec`s (top-level properties, each with one type)."""
    specs: list[ToolSpec] = []
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        fn = tool.function
        where = f"tools[{index}].function"
        if fn.name in seen:
            raise bad_request(f"{where}.name: tool {fn.name!r} is listed twice", param=f"{where}.name")
        seen.add(fn.name)
        schema = fn.parameters
        if schema and schema.get("type", "object") != "object":
            raise bad_request(f"{where}.parameters.type must be 'object'", param=f"{where}.parameters.type")
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise bad_request(f"{where}.parameters.properties must be an object", param=f"{where}.parameters")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            raise bad_request(
                f"{where}.parameters.required must be a list of names", param=f"{where}.parameters.required"
            )
        params: list[ToolParameter] = []
        for name, prop in properties.items():
            at = f"{where}.parameters.properties.{name}"
            if not isinstance(prop, dict):
                raise bad_request(f"{at} must be a JSON schema object", param=at)
            description = prop.get("description", "")
            params.append(
                ToolParameter(
                    name=name,
                    type=_param_type(prop, at),
                    description=description if isinstance(description, str) else "",
                    required=name in required,
                )
            )
        specs.append(ToolSpec(name=fn.name, description=fn.description, parameters=tuple(params)))
    return specs


def _assistant_text(message: AssistantMessage, index: int) -> str:
    parts = [content_text(message.content)] if content_text(message.content) else []
    for j, call in enumerate(message.tool_calls or []):
        where = f"messages[{index}].tool_calls[{j}].function.arguments"
        try:
            arguments = json.loads(call.function.arguments) if call.function.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise bad_request(f"{where} is not valid JSON: {exc.msg}", param=where)
        if not isinstance(arguments, dict):
            raise bad_request(f"{where} must be a JSON object", param=where)
        parts.append(format_tool_call(call.function.name, arguments))
    return "\n".join(parts)


def render_messages(request: ChatCompletionRequest, tools: Sequence[ToolSpec]) -> list[dict[str, str]]:
    """The chat messages the model sees (role and content strings), the tool prompt placed as the environments
    place it."""
    out: list[dict[str, str]] = []
    for index, message in enumerate(request.messages):
        if isinstance(message, SystemMessage):
            out.append({"role": "system", "content": content_text(message.content)})
        elif isinstance(message, UserMessage):
            out.append({"role": "user", "content": content_text(message.content)})
        elif isinstance(message, AssistantMessage):
            out.append({"role": "assistant", "content": _assistant_text(message, index)})
        else:
            out.append({"role": "tool", "content": content_text(message.content)})
    prompt = render_tool_prompt(tools) if request.uses_tools else ""
    if not prompt:
        return out
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + prompt}, *out[1:]]
    return [{"role": "system", "content": prompt}, *out]


# --- replies -------------------------------------------------------------------------------------------------------


def split_reply(text: str, tools: Sequence[ToolSpec]) -> tuple[str, list[ToolCall]]:
    """A model reply -> (content, calls): every well-formed `<tool_call>` block (checked by `parse_tool_calls`)
    becomes a call and leaves the text; malformed blocks, unclosed tags and stray closing tags stay in the content.
    The content is stripped when calls were taken out of it."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    while True:
        start = text.find(TOOL_CALL_OPEN, pos)
        if start < 0:
            kept.append(text[pos:])
            break
        end = text.find(TOOL_CALL_CLOSE, start + len(TOOL_CALL_OPEN))
        if end < 0:
            kept.append(text[pos:])
            break
        stop = end + len(TOOL_CALL_CLOSE)
        block = text[start:stop]
        parsed = parse_tool_calls(block, tools)
        kept.append(text[pos:start])
        if parsed.calls and not parsed.errors:
            calls.extend(parsed.calls)
        else:
            kept.append(block)
        pos = stop
    content = "".join(kept)
    return (content.strip() if calls else content), calls


@dataclass(frozen=True)
class Reply:
    """A completion as the client receives it (before the envelope)."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: Literal["stop", "length", "tool_calls"]

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def make_reply(text: str, finish_reason: Literal["stop", "length"], tools: Sequence[ToolSpec] | None) -> Reply:
    """The reply for a generation's `text`: tool calls split out when the request offered tools."""
    if not tools:
        return Reply(content=text, tool_calls=[], finish_reason=finish_reason)
    content, calls = split_reply(text, tools)
    tool_calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for call in calls
    ]
    if not tool_calls:
        return Reply(content=text, tool_calls=[], finish_reason=finish_reason)
    return Reply(content=content or None, tool_calls=tool_calls, finish_reason="tool_calls")


# --- response envelopes --------------------------------------------------------------------------------------------


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def fingerprint(policy_version: int) -> str:
    return f"crucible-v{policy_version}"


@dataclass(frozen=True)
class Envelope:
    """What every response and chunk of one completion carries."""

    id: str
    created: int
    model: str
    policy_version: int
    session_id: str

    def fields(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": fingerprint(self.policy_version),
            "policy_version": self.policy_version,
            "session_id": self.session_id,
        }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    envelope: Envelope,
    reply: Reply,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        **envelope.fields("chat.completion"),
        "choices": [
            {
                "index": 0,
                "message": reply.message(),
                "finish_reason": reply.finish_reason,
                "logprobs": {"content": logprobs} if logprobs is not None else None,
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk_body(
    envelope: Envelope,
    delta: dict[str, Any],
    *,
    finish_reason: str | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        **envelope.fields("chat.completion.chunk"),
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "finish_reason": finish_reason,
                "logprobs": {"content": logprobs} if logprobs is not None else None,
            }
        ],
    }


def stream_chunks(
    envelope: Envelope,
    reply: Reply,
    pieces: Sequence[str],
    *,
    prompt_tokens: int,
    completion_tokens: int,
    include_usage: bool,
    logprobs: Sequence[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The chunks of a streamed completion: the role, then the content in `pieces` (with tool calls the content is
    the reply's content, sent whole), the tool calls, the finish reason, and the usage when asked for.

    `pieces` are the decoded text deltas of the completion's tokens (one per token, joined they are the text);
    `logprobs` (one entry per piece) ride along when the request asked for them."""
    chunks = [chunk_body(envelope, {"role": "assistant", "content": ""})]
    if reply.tool_calls:
        if reply.content:
            chunks.append(chunk_body(envelope, {"content": reply.content}))
        chunks.append(
            chunk_body(
                envelope,
                {"tool_calls": [{"index": i, **call} for i, call in enumerate(reply.tool_calls)]},
            )
        )
    else:
        for i, piece in enumerate(pieces):
            if piece or logprobs is not None:
                entry = [logprobs[i]] if logprobs is not None and i < len(logprobs) else None
                chunks.append(chunk_body(envelope, {"content": piece}, logprobs=entry))
    chunks.append(chunk_body(envelope, {}, finish_reason=reply.finish_reason))
    if include_usage:
        chunks.append(
            {
                **envelope.fields("chat.completion.chunk"),
                "choices": [],
                "usage": usage(prompt_tokens, completion_tokens),
            }
        )
    return chunks


def models_body(names: Sequence[str]) -> dict[str, Any]:
    now = int(time.time())
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": now, "owned_by": "crucible"} for n in names],
    }
