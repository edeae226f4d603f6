"""The Ray Serve side: one router application (the HTTP ingress) and one application per arm.

- `Router` (FastAPI through `@serve.ingress`, mounted at the spec's route prefix): authenticates the client's key
  (`KeyVerifier`), validates the body (`openai_request.parse_request`, 400 naming the field), checks `model` (404),
  names the session (header `X-Session-Id`, else `metadata.session_id`, else a new uuid4 hex) and its turn
  (`X-Turn-Index`, else `metadata.turn_index`, else this router's own count for the session), picks the arm by the
  session id's hash (`control.pick_arm`) and forwards to that arm's deployment. It follows the routing table the
  controller publishes in the `WeightStore` (a long poll on a thread), so arms come and go without a restart.
- `ArmReplica` (`ServeSpec.replicas` per arm, in `workers.serving.arm`): a policy backend behind a lock that
  follows its arm's weights; `ArmDeployment` below wraps it. Names of the pieces on Ray: `workers.serving.names`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from workers.reporting import configure_logging
from workers.serving.arm import ArmReplica
from workers.serving.control import KeyVerifier, pick_arm
from workers.serving.names import ARM_DEPLOYMENT, ROUTER_DEPLOYMENT, Names, named_actor
from workers.serving.openai_api import completion_id, models_body
from workers.serving.openai_request import APIError, ChatCompletionRequest, parse_request
from workers.serving.recorder import Shipper
from workers.session_records import SESSION_ID_MAX

log = logging.getLogger("crucible.serve")

MAX_BODY_BYTES = 32 * 1024 * 1024
TASK_TYPE_MAX = 100


def _error_response(error: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


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
        self.shipper = Shipper(lambda: named_actor(self.names.recorder))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow_routing, name="crucible-routing", daemon=True)
        self._thread.start()

    def _follow_routing(self) -> None:
        store: Any = None
        while not self._stop.is_set():
            try:
                if store is None:
                    store = named_actor(self.names.store)
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
        # One function on purpose: the endpoint: parse, route to an arm, stream or answer, record; the order is the
        # request's.
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
