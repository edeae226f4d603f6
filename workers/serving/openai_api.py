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
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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

MAX_STOP = 4
MAX_TOOLS = 128
MAX_METADATA = 16
_PARAM_TYPES: frozenset[str] = frozenset(("string", "integer", "number", "boolean", "array", "object"))


# --- errors --------------------------------------------------------------------------------------------------------


class APIError(Exception):
    """An error a client caused or must see, with its OpenAI-style body (`{"error": {...}}`) and HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def as_dict(self) -> dict[str, Any]:
        """What crosses a process boundary (a replica's answer to the router): the status and the body."""
        return {"status": self.status, **self.body()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> APIError:
        error = data["error"]
        return cls(
            int(data["status"]),
            str(error["message"]),
            type=str(error["type"]),
            param=error.get("param"),
            code=error.get("code"),
        )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


_UNION_NOISE = frozenset(("str", "int", "float", "bool", "list", "dict", "none", "literal"))


def param_of(loc: Sequence[int | str]) -> str:
    """A pydantic error location as the request path a client reads: ('messages', 0, 'user', 'content') ->
    'messages[0].content' (the discriminator tag and union branch names are dropped)."""
    out = ""
    previous: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif previous is not None and isinstance(previous, int) and part in ROLES:
            pass  # the discriminator's tag: messages[0].user.content -> messages[0].content
        elif part.lower() in _UNION_NOISE or any(ch in part for ch in "[]-, "):
            pass  # a union branch: content.str / content.list[TextPart]
        else:
            out += f".{part}" if out else part
        previous = part
    return out


def validation_error(exc: ValidationError) -> APIError:
    """The first problem of a failed request validation as a 400 naming the field."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    param = param_of(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = f"unrecognized request argument: {param}"
    elif first["type"] == "missing":
        message = f"missing required field: {param}"
    else:
        message = f"{param}: {message}" if param else message
    return bad_request(message, param=param or None)


# --- request -------------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


Content = str | list[TextPart]


def content_text(content: Content | None) -> str:
    """A message's content as one string (text parts joined by newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


class FunctionCall(_Strict):
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(description="The arguments as a JSON object, in a string (OpenAI's convention)")


class ToolCallIn(_Strict):
    id: str = Field(min_length=1, max_length=200)
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Strict):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None


class UserMessage(_Strict):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[ToolCallIn] | None = None
    name: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _says_something(self) -> AssistantMessage:
        if self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs content or tool_calls")
        return self


class ToolMessage(_Strict):
    role: Literal["tool"]
    content: Content
    tool_call_id: str = Field(min_length=1, max_length=200)


ROLES = frozenset(("system", "developer", "user", "assistant", "tool"))
Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class FunctionDef(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = Field(default="", max_length=10_000)
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(_Strict):
    """The body of `POST /v1/chat/completions` (the fields this endpoint honours; others are refused by name)."""

    model: str = Field(min_length=1, max_length=200)
    messages: list[Message] = Field(min_length=1, max_length=10_000)
    tools: list[ToolDef] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["auto", "none"] | None = Field(
        default=None, description="'required' and a named function are not supported (the sampler cannot force one)"
    )
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    metadata: dict[str, str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = Field(default=None, max_length=200)
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise ValueError(f"only n=1 is supported, got {n}")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        items = [stop] if isinstance(stop, str) else (stop or [])
        if len(items) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(items)}")
        if any(not item for item in items):
            raise ValueError("stop sequences must not be empty")
        return stop

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is not None and len(metadata) > MAX_METADATA:
            raise ValueError(f"at most {MAX_METADATA} metadata pairs, got {len(metadata)}")
        for key, value in (metadata or {}).items():
            if len(key) > 64 or len(value) > 512:
                raise ValueError(f"metadata key {key[:64]!r}: keys take at most 64 characters, values 512")
        return metadata

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("top_logprobs is not supported (only the sampled token's logprob); leave it out or 0")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalties(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("penalties are not supported: the sampled distribution must be the policy's own")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value != {"type": "text"}:
            raise ValueError('only {"type": "text"} is supported')
        return value

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def max_new_tokens(self, cap: int) -> int:
        """The token budget: `max_completion_tokens`, else `max_tokens`, else `cap`; over `cap` is a 400."""
        asked, name = (
            (self.max_completion_tokens, "max_completion_tokens")
            if self.max_completion_tokens is not None
            else (self.max_tokens, "max_tokens")
        )
        if asked is None:
            return cap
        if asked > cap:
            raise bad_request(f"{name}: at most {cap} on this endpoint, got {asked}", param=name)
        return asked

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


def parse_request(body: bytes | str | Mapping[str, Any]) -> ChatCompletionRequest:
    """A request body -> the validated request; raises `APIError` (400 naming the field)."""
    if isinstance(body, bytes | str):
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise bad_request(f"the body is not valid JSON: {exc}")
    else:
        data = body
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc)


# --- rendering -----------------------------------------------------------------------------------------------------


def _param_type(schema: Mapping[str, Any], where: str) -> ParamType:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if not isinstance(kind, str) or kind not in _PARAM_TYPES:
        raise bad_request(
            f"{where}.type: each parameter needs one JSON type of {', '.join(sorted(_PARAM_TYPES))} "
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
