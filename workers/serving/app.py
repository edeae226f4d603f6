"""The Ray Serve side: one router application (the HTTP ingress) and one application per arm.

- `Router` (FastAPI through `@serve.ingress`, mounted at the spec's route prefix): authenticates the client's key
  (`KeyVerifier`), validates the body (`openai_request.parse_request`, 400 naming the field), checks `model` (404),
  names the session (header `X-Session-Id`, else `metadata.session_id`, else a new uuid4 hex) and its turn
  (`X-Turn-Index`, else `metadata.turn_index`, else this router's own count for the session), picks the arm by the
  session id's hash (`control.pick_arm`) and forwards to that arm's deployment. It follows the routing table the
  controller publishes in the `WeightStore` (a long poll on a thread), so arms come and go without a restart.
- `ArmReplica` (`ServeSpec.replicas` per arm): a policy backend behind a lock. It waits for its first weights from
  the store (the arm's full sync) before answering, renders the request as the environments render prompts,
  generates, splits tool calls out of the reply and answers; then it hands the turn to its `Shipper`, so the
  recording happens after the response exists and never on its path. A background thread long-polls the store for
  new weights and applies them (`apply_update`) under the generation lock: a request that holds the lock finishes
  on the weights it started with, and every response carries the policy version that produced it.

Streaming: the transformers backend samples a whole completion before it returns, so a streamed response is
generated first, then sent as one chunk per sampled token (the token's text delta, with its logprob when asked).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from workers.models import make_backend
from workers.models.base import SamplingParams
from workers.reporting import configure_logging
from workers.rl.weightsync import WeightSyncError, WeightSyncReceiver
from workers.serving.control import KeyVerifier, pick_arm
from workers.serving.openai_api import (
    Envelope,
    completion_body,
    completion_id,
    make_reply,
    models_body,
    render_messages,
    stream_chunks,
    tool_specs,
)
from workers.serving.openai_request import APIError, ChatCompletionRequest, parse_request
from workers.serving.recorder import Shipper
from workers.session_records import SESSION_ID_MAX

log = logging.getLogger("crucible.serve")

NAMESPACE = "crucible-serve"
ARM_DEPLOYMENT = "arm"
ROUTER_DEPLOYMENT = "router"
MAX_BODY_BYTES = 32 * 1024 * 1024
FIRST_SYNC_WAIT_SECONDS = 300.0
TASK_TYPE_MAX = 100


@dataclass(frozen=True)
class Names:
    """Where a serving run's pieces live: its Serve applications and its two named actors."""

    run_id: int

    @property
    def router_app(self) -> str:
        return f"crucible-serve-{self.run_id}"

    def arm_app(self, arm: str) -> str:
        return f"crucible-serve-{self.run_id}-arm-{arm}"

    @property
    def store(self) -> str:
        return f"crucible-serve-{self.run_id}-weights"

    @property
    def recorder(self) -> str:
        return f"crucible-serve-{self.run_id}-recorder"


def _actor(name: str) -> Any:
    return ray.get_actor(name, namespace=NAMESPACE)


def _error_response(error: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


# --- the arm -------------------------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    """A finished completion inside a replica: what the client gets, and the turn to record."""

    body: dict[str, Any]
    chunks: list[dict[str, Any]] | None
    turn: dict[str, Any] | None
    latency_ms: float
    prompt_tokens: int
    completion_tokens: int


class ArmReplica:
    """One replica of an arm: a policy backend, its weight-sync receiver and its shipper to the recorder.

    `settings`: arm, run_id, base_model, backend, threads, max_new_tokens, max_context, record."""

    def __init__(self, settings: dict[str, Any]) -> None:
        configure_logging()
        self.arm = str(settings["arm"])
        self.names = Names(int(settings["run_id"]))
        self.max_new_tokens = int(settings["max_new_tokens"])
        self.max_context = int(settings["max_context"])
        self.record = bool(settings["record"])
        kind = settings["backend"]
        options: dict[str, Any] = {"threads": int(settings["threads"])} if kind == "transformers" else {}
        self.backend = make_backend(kind, settings["base_model"], **options)
        self.tokenizer = self.backend.tokenizer
        self.replica_id = f"{self.arm}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._lock = threading.Lock()  # held while generating and while weights change
        self._receiver = WeightSyncReceiver()
        self._sync_version: int | None = None
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._in_flight = 0
        self._count_lock = threading.Lock()
        self.swaps = 0
        self.last_update: dict[str, Any] = {}
        self.shipper = Shipper(lambda: _actor(self.names.recorder))
        self._sync_thread = threading.Thread(target=self._follow_weights, name="crucible-weights", daemon=True)
        self._sync_thread.start()

    # --- weights -------------------------------------------------------------------------------------------------
    def _follow_weights(self) -> None:
        store: Any = None
        while not self._stop.is_set():
            try:
                if store is None:
                    store = _actor(self.names.store)
                plan = ray.get(store.fetch.remote(self.arm, self.replica_id, self._sync_version, 5.0), timeout=60)
                if plan is None:
                    continue
                blobs = ray.get(plan["blobs"], timeout=600)
                info = self.apply_update(blobs, int(plan["sync_version"]), int(plan["policy_version"]))
                ray.get(
                    store.ack.remote(self.arm, self.replica_id, plan["sync_version"], plan["policy_version"], info),
                    timeout=60,
                )
            except WeightSyncError as exc:
                log.warning(
                    "replica %s: weights could not be applied (%s); asking for a full sync", self.replica_id, exc
                )
                self._receiver = WeightSyncReceiver()
                self._sync_version = None
            except Exception as exc:
                if self._stop.is_set():
                    return
                if store is not None:  # once per outage: the store is gone while the job stops, or restarts
                    log.warning("replica %s: the weight store did not answer (%s); retrying", self.replica_id, exc)
                store = None
                self._stop.wait(1.0)

    def apply_update(self, blobs: Sequence[bytes], sync_version: int, policy_version: int) -> dict[str, Any]:
        """Apply weight-sync blobs (a full blob and/or deltas, in order) and serve them as `policy_version`.

        Decoding happens outside the generation lock; only the copy into the model waits for the request in
        flight, so that request finishes on the version it started on."""
        started = time.perf_counter()
        state = None
        for blob in blobs:
            state = self._receiver.receive(blob)
        if state is None:
            raise ValueError("apply_update needs at least one blob")
        decoded = time.perf_counter()
        with self._lock:
            waited = time.perf_counter() - decoded
            self.backend.load_state_dict(state, policy_version)
            self._sync_version = sync_version
        self._synced.set()
        self.swaps += 1
        self.last_update = {
            "sync_version": sync_version,
            "policy_version": policy_version,
            "apply_seconds": time.perf_counter() - started,
            "decode_seconds": decoded - started,
            "lock_wait_seconds": waited,
            "bytes": sum(len(blob) for blob in blobs),
        }
        return dict(self.last_update)

    def status(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "arm": self.arm,
            "sync_version": self._sync_version,
            "policy_version": self.backend.policy_version,
            "in_flight": self._in_flight,
            "swaps": self.swaps,
            "last_update": self.last_update,
            "record_failures": self.shipper.failures,
        }

    # --- completions ---------------------------------------------------------------------------------------------
    async def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed completion: {"status": 200, "body": ...} or an error's {"status", "error"}."""
        try:
            outcome = await asyncio.to_thread(self._run, payload, False)
        except APIError as error:
            return error.as_dict()
        self._account(outcome)
        return {"status": 200, "body": outcome.body}

    async def stream(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """A streamed completion: its chunks, or one error item {"status", "error"}."""
        try:
            outcome = await asyncio.to_thread(self._run, payload, True)
        except APIError as error:
            yield error.as_dict()
            return
        try:
            for chunk in outcome.chunks or []:
                yield chunk
        finally:
            self._account(outcome)

    def _account(self, outcome: _Outcome) -> None:
        self.shipper.observe(outcome.latency_ms, outcome.prompt_tokens, outcome.completion_tokens)
        if outcome.turn is not None:
            self.shipper.turn(outcome.turn)

    def _run(self, payload: dict[str, Any], streamed: bool) -> _Outcome:
        request = parse_request(payload["request"])
        tools = tool_specs(request.tools or []) if request.uses_tools else []
        messages = render_messages(request, tools)
        budget = request.max_new_tokens(self.max_new_tokens)
        try:
            prompt = self.backend.encode_chat(messages)
        except ValueError as exc:
            raise APIError(
                400, f"messages could not be rendered with the model's chat template: {exc}", param="messages"
            )
        if len(prompt) > self.max_context:
            raise APIError(
                400,
                f"the prompt has {len(prompt)} tokens; this endpoint takes at most {self.max_context}",
                param="messages",
                code="context_length_exceeded",
            )
        params = SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            max_new_tokens=budget,
            stop=request.stops,
            seed=request.seed,
        )
        if not self._synced.wait(FIRST_SYNC_WAIT_SECONDS):
            raise APIError(503, "this replica has not received its weights yet; retry", type="server_error")
        with self._count_lock:
            self._in_flight += 1
        try:
            with self._lock:
                try:
                    generation = self.backend.generate([prompt], params)[0]
                except ValueError as exc:  # the model's own context is too short for this prompt
                    raise APIError(400, str(exc), param="messages", code="context_length_exceeded")
        finally:
            with self._count_lock:
                self._in_flight -= 1
        finished = time.time()
        reply = make_reply(generation.text, generation.finish_reason, tools if request.uses_tools else None)
        envelope = Envelope(
            id=payload["request_id"],
            created=int(payload["created"]),
            model=request.model,
            policy_version=generation.policy_version,
            session_id=payload["session_id"],
        )
        logprobs = self._logprobs(generation.token_ids, generation.logprobs) if request.logprobs else None
        prompt_tokens, completion_tokens = len(prompt), len(generation.token_ids)
        chunks = None
        if streamed:
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            chunks = stream_chunks(
                envelope,
                reply,
                text_pieces(self.tokenizer, generation.token_ids, generation.text),
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                include_usage=include_usage,
                logprobs=logprobs,
            )
        body = completion_body(
            envelope, reply, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, logprobs=logprobs
        )
        latency_ms = max(0.0, (finished - float(payload["received_at"])) * 1000.0)
        turn = None
        if self.record:
            turn = {
                "session_id": payload["session_id"],
                "task_type": payload["task_type"],
                "token_id": payload["token_id"],
                "turn": {
                    "turn_index": payload["turn_index"],
                    "request_id": payload["request_id"],
                    "messages": payload["request"]["messages"],
                    "tools": payload["request"].get("tools") or [],
                    "response": reply.message(),
                    "prompt_token_ids": list(prompt),
                    "completion_token_ids": list(generation.token_ids),
                    "logprobs": list(generation.logprobs),
                    "policy_version": generation.policy_version,
                    "deployment_id": payload["deployment_id"],
                    "arm": payload["arm_label"],
                    "latency_ms": latency_ms,
                    "finish_reason": reply.finish_reason,
                    "created_at": finished,
                },
            }
        return _Outcome(body, chunks, turn, latency_ms, prompt_tokens, completion_tokens)

    def _logprobs(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> list[dict[str, Any]]:
        out = []
        for token_id, logprob in zip(token_ids, logprobs, strict=True):
            token = str(self.tokenizer.decode([token_id]))
            out.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []})
        return out

    def __del__(self) -> None:
        # Serve calls this when the replica shuts down (arm removed, job stopping): stop following the store and
        # hand the last turns to the recorder.
        self._stop.set()
        self.shipper.close(timeout=1.0)


def text_pieces(tokenizer: Any, token_ids: Sequence[int], text: str) -> list[str]:
    """One text delta per sampled token whose concatenation is exactly `text` (the completion as returned:
    special tokens dropped, cut before a stop string). A token that ends inside a multi-byte character, or
    decodes to nothing, gets an empty piece; whatever the prefixes never reached goes into the last piece."""
    pieces: list[str] = []
    emitted = 0
    for k in range(1, len(token_ids) + 1):
        prefix = tokenizer.decode(list(token_ids[:k]), skip_special_tokens=True)
        upto = min(len(prefix), len(text))
        if prefix.endswith("\ufffd") or upto <= emitted or prefix[:upto] != text[:upto]:
            pieces.append("")
            continue
        pieces.append(text[emitted:upto])
        emitted = upto
    if not pieces:
        return [text] if text else []
    pieces[-1] += text[emitted:]
    return pieces


# --- the router ----------------------------------------------------------------------------------------------------

api = FastAPI(title="Crucible serving", docs_url=None, redoc_url=None, openapi_url=None)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found" if exc.status_code == 404 else None
    return _error_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=kind))


class Router:
    """The ingress of a serving run. `settings`: run_id, model_name, control_url, token, key_cache_seconds."""

    def __init__(self, settings: dict[str, Any]) -> None:
        configure_logging()
        self.names = Names(int(settings["run_id"]))
        self.model_name = str(settings["model_name"])
        self.verifier = KeyVerifier(
            str(settings["control_url"]), str(settings["token"]), float(settings["key_cache_seconds"])
        )
        self.routing: dict[str, Any] = {"revision": 0, "arms": [], "model_names": [self.model_name]}
        self._handles: dict[str, Any] = {}
        self._turns: OrderedDict[str, int] = OrderedDict()
        self.shipper = Shipper(lambda: _actor(self.names.recorder))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow_routing, name="crucible-routing", daemon=True)
        self._thread.start()

    def _follow_routing(self) -> None:
        store: Any = None
        while not self._stop.is_set():
            try:
                if store is None:
                    store = _actor(self.names.store)
                table = ray.get(store.routing.remote(int(self.routing["revision"]), 5.0), timeout=60)
                if table is not None:
                    self.routing = table
            except Exception as exc:
                if store is not None:
                    log.warning("router: the weight store did not answer (%s); retrying", exc)
                store = None
                self._stop.wait(1.0)

    @property
    def model_names(self) -> list[str]:
        names = [self.model_name, *self.routing.get("model_names", [])]
        return list(dict.fromkeys(name for name in names if name))

    def _handle(self, app: str) -> Any:
        handle = self._handles.get(app)
        if handle is None:
            handle = serve.get_deployment_handle(ARM_DEPLOYMENT, app_name=app)
            self._handles[app] = handle
        return handle

    def _count(self, status: int) -> None:
        if status >= 500:
            self.shipper.count("http_5xx")
        elif status >= 400:
            self.shipper.count("http_4xx")

    @api.get("/v1/models")
    async def models(self, request: Request) -> Response:
        try:
            await self.verifier.verify(request.headers.get("authorization"))
        except APIError as error:
            self._count(error.status)
            return _error_response(error)
        return JSONResponse(models_body(self.model_names))

    @api.get("/v1/models/{model}")
    async def model(self, model: str, request: Request) -> Response:
        try:
            await self.verifier.verify(request.headers.get("authorization"))
            if model not in self.model_names:
                raise APIError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")
        except APIError as error:
            self._count(error.status)
            return _error_response(error)
        return JSONResponse(models_body([model])["data"][0])

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        received = time.time()
        headers: dict[str, str] = {}
        try:
            caller = await self.verifier.verify(request.headers.get("authorization"))
            raw = await request.body()
            if len(raw) > MAX_BODY_BYTES:
                raise APIError(413, f"the body is over {MAX_BODY_BYTES} bytes", code="request_too_large")
            body = json.loads(raw) if raw else None
            parsed = parse_request(body if body is not None else raw)
            assert isinstance(body, dict)
            if parsed.model not in self.model_names:
                raise APIError(
                    404,
                    f"the model {parsed.model!r} does not exist; this endpoint serves {', '.join(self.model_names)}",
                    param="model",
                    code="model_not_found",
                )
            session_id, turn_index, task_type = self._session(request, parsed)
            headers["X-Session-Id"] = session_id
            arms = list(self.routing.get("arms", []))
            if not arms:
                raise APIError(
                    503,
                    "nothing is deployed on this endpoint yet; retry later",
                    type="server_error",
                    code="no_deployment",
                )
            name = pick_arm(session_id, [(arm["name"], float(arm["weight"])) for arm in arms])
            arm = next(a for a in arms if a["name"] == name)
            payload = {
                "request": body,
                "request_id": completion_id(),
                "created": int(received),
                "received_at": received,
                "session_id": session_id,
                "turn_index": turn_index,
                "task_type": task_type,
                "token_id": caller.token_id,
                "deployment_id": arm.get("deployment_id"),
                "arm_label": name if len(arms) > 1 else "",
            }
            handle = self._handle(arm["app"])
            if parsed.stream:
                return await self._stream(handle, payload, headers)
            result = await handle.complete.remote(payload)
            if result["status"] != 200:
                raise APIError.from_dict(result)
            version = int(result["body"]["policy_version"])
            headers["X-Policy-Version"] = str(version)
            return JSONResponse(result["body"], headers=headers)
        except APIError as error:
            self._count(error.status)
            return _error_response(error, headers)
        except json.JSONDecodeError as exc:
            self._count(400)
            return _error_response(APIError(400, f"the body is not valid JSON: {exc}"), headers)
        except Exception as exc:  # a replica died mid-request, a bug: still an OpenAI-shaped answer
            log.exception("chat completion failed")
            self._count(500)
            failure = APIError(500, f"the completion failed: {type(exc).__name__}: {exc}", type="server_error")
            return _error_response(failure, headers)

    async def _stream(self, handle: Any, payload: dict[str, Any], headers: dict[str, str]) -> Response:
        chunks = handle.options(stream=True).stream.remote(payload)
        first = await chunks.__anext__()
        if "error" in first:
            raise APIError.from_dict(first)
        headers["X-Policy-Version"] = str(int(first["policy_version"]))

        async def events() -> AsyncIterator[bytes]:
            yield b"data: " + json.dumps(first).encode() + b"\n\n"
            async for chunk in chunks:
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    def _session(self, request: Request, parsed: ChatCompletionRequest) -> tuple[str, int, str]:
        metadata = parsed.metadata or {}
        session_id = request.headers.get("x-session-id") or metadata.get("session_id") or uuid.uuid4().hex
        if len(session_id) > SESSION_ID_MAX:
            raise APIError(400, f"X-Session-Id: at most {SESSION_ID_MAX} characters", param="X-Session-Id")
        raw_turn = request.headers.get("x-turn-index") or metadata.get("turn_index")
        if raw_turn is not None:
            try:
                turn_index = int(raw_turn)
            except ValueError:
                turn_index = -1
            if turn_index < 0:
                raise APIError(
                    400, f"X-Turn-Index: a non-negative integer, got {raw_turn[:40]!r}", param="X-Turn-Index"
                )
            self._remember_turn(session_id, turn_index + 1)
        else:
            turn_index = self._turns.get(session_id, 0)
            self._remember_turn(session_id, turn_index + 1)
        task_type = request.headers.get("x-task-type") or metadata.get("task_type") or ""
        if len(task_type) > TASK_TYPE_MAX:
            raise APIError(400, f"X-Task-Type: at most {TASK_TYPE_MAX} characters", param="X-Task-Type")
        return session_id, turn_index, task_type

    def __del__(self) -> None:
        self._stop.set()
        self.shipper.close(timeout=1.0)

    def _remember_turn(self, session_id: str, following: int) -> None:
        self._turns[session_id] = max(following, self._turns.get(session_id, 0))
        self._turns.move_to_end(session_id)
        while len(self._turns) > 100_000:
            self._turns.popitem(last=False)


RouterDeployment = serve.deployment(name=ROUTER_DEPLOYMENT)(serve.ingress(api)(Router))
ArmDeployment = serve.deployment(name=ARM_DEPLOYMENT)(ArmReplica)
