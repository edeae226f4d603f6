"""What comes into the OpenAI-compatible endpoint: the chat-completion request models, which refuse unknown fields as
OpenAI does, and the API errors, which name the parameter (`workers.serving.openai_api` renders and replies)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MAX_STOP = 4
MAX_TOOLS = 128
MAX_METADATA = 16
PARAM_TYPES: frozenset[str] = frozenset(("string", "integer", "number", "boolean", "array", "object"))


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


class StrictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TextPart(StrictRequest):
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


class FunctionCall(StrictRequest):
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(description="The arguments as a JSON object, in a string (OpenAI's convention)")


class ToolCallIn(StrictRequest):
    id: str = Field(min_length=1, max_length=200)
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(StrictRequest):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None


class UserMessage(StrictRequest):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(StrictRequest):
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


class ToolMessage(StrictRequest):
    role: Literal["tool"]
    content: Content
    tool_call_id: str = Field(min_length=1, max_length=200)


ROLES = frozenset(("system", "developer", "user", "assistant", "tool"))
Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class FunctionDef(StrictRequest):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = Field(default="", max_length=10_000)
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool | None = None


class ToolDef(StrictRequest):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(StrictRequest):
    include_usage: bool = False


class ChatCompletionRequest(StrictRequest):
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
