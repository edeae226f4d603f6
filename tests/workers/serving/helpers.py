"""A serving run on a local Ray for tests: a stub control plane (target, key verification, ingest) and a real
Ray Serve app with the tiny model, driven by `ServingController` (no Django, no mocks of our code).

    with StubControlPlane() as plane, ServingHarness(plane) as serving:
        serving.set_arms([{"name": "a", "weight": 1.0}])   # what GET target/ answers, then one reconcile
        client = serving.openai_client()                   # the official `openai` client on the endpoint

`ServingHarness` does not own Ray: call `ray.init` before (the session fixture in conftest.py does) and
`ray.shutdown` after. Its `close` deletes the run's Serve applications and flushes its recorder.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

INGEST_TOKEN = "cri_9001_testtoken"
GOOD_KEY = "crk_serve_key"
NO_SCOPE_KEY = "crk_no_serve_scope"
SIM_KEY = "cri_77_simulator"
MODEL_NAME = "crucible-test"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class StubControlPlane:
    """Stands in for the control plane's serving endpoints (helper CONTROL builds the real ones):

    - `GET /control/target/` answers `self.target` (revision bumped by `set_target`);
    - `POST /control/keys/verify/` knows GOOD_KEY (token 5), SIM_KEY (a simulate run: no token id) and
      NO_SCOPE_KEY (403); anything else is 401; a request without the run's ingest token gets a 403 itself;
    - `POST /ingest/` stores every event it receives (`events`, `turns()`, `metrics()`), answering 200.
    """

    def __init__(self, token: str = INGEST_TOKEN) -> None:
        self.token = token
        self.target: dict[str, Any] = {"revision": "0", "model_name": "", "arms": []}
        self.events: list[dict[str, Any]] = []
        self.verify_calls = 0
        self.fail_ingest = False
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def control_url(self) -> str:
        return f"{self.url}/control/"

    @property
    def ingest_url(self) -> str:
        return f"{self.url}/ingest/"

    def __enter__(self) -> StubControlPlane:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def set_target(self, arms: list[dict[str, Any]], model_name: str = "") -> None:
        with self._lock:
            revision = str(int(self.target["revision"]) + 1)
            self.target = {"revision": revision, "model_name": model_name, "arms": arms}

    def turns(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["kind"] == "session_turn"]

    def metrics(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["kind"] == "metric"]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for the stub control plane to see it")
            time.sleep(0.05)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {plane.token}":
                    self._answer(403, {"detail": "not this run's token"})
                    return False
                return True

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if self.path == "/control/target/":
                    with plane._lock:
                        self._answer(200, plane.target)
                else:
                    self._answer(404, {"detail": "not found"})

            def do_POST(self) -> None:
                if not self._authorised():
                    return
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/control/keys/verify/":
                    plane.verify_calls += 1
                    key = body.get("key")
                    if key == GOOD_KEY:
                        self._answer(200, {"valid": True, "token_id": 5, "user": "alice"})
                    elif key == SIM_KEY:
                        self._answer(200, {"valid": True, "token_id": None, "user": "sim"})
                    elif key == NO_SCOPE_KEY:
                        self._answer(200, {"valid": False, "status": 403, "reason": "this key lacks the serve scope"})
                    else:
                        self._answer(200, {"valid": False, "status": 401, "reason": "unknown API key"})
                elif self.path == "/ingest/":
                    if plane.fail_ingest:
                        self._answer(503, {"detail": "down"})
                        return
                    with plane._lock:
                        plane.events.extend(body["events"])
                    self._answer(200, {"accepted": len(body["events"])})
                else:
                    self._answer(404, {"detail": "not found"})

        return Handler


def write_checkpoint(path: Path, *, seed: int, scale: float = 1e-3) -> str:
    """A trainer checkpoint of the tiny model with its weights nudged (as a training step would); its file URI."""
    import torch

    from workers.models.registry import TINY_LLAMA, resolve_base_model
    from workers.rl.config import TrainConfig
    from workers.rl.learner import Learner

    config = TrainConfig(base_model=TINY_LLAMA, prompts_per_step=1, group_size=2, loss={"kl_coef": 0.0})
    learner = Learner(str(resolve_base_model(TINY_LLAMA)), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in learner.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    path.write_bytes(learner.checkpoint_bytes(data_position=0))
    return path.as_uri()


class ServingHarness:
    """A serving run against `plane`, on the Ray already initialised in this process."""

    def __init__(self, plane: StubControlPlane, *, run_id: int = 9001, record: bool = True, **spec: Any) -> None:
        from workers.models.registry import TINY_LLAMA
        from workers.specs import ServeSpec

        self.plane = plane
        self.port = free_port()
        fields = {
            "run_id": run_id,
            "kind": "serve",
            "ingest_url": plane.ingest_url,
            "model_name": MODEL_NAME,
            "base_model": TINY_LLAMA,
            "control_url": plane.control_url,
            "route_prefix": f"/serve/{run_id}",
            "http_port": self.port,
            "replicas": 1,
            "threads": 1,
            "max_new_tokens": 1500,
            "max_context": 1024,
            "poll_seconds": 0.2,
            "key_cache_seconds": 2.0,
            "record": record,
            **spec,
        }
        self.spec = ServeSpec.model_validate(fields)
        self.controller: Any = None

    @property
    def base_url(self) -> str:
        """The endpoint's OpenAI base URL: Serve's real address (a second run in one Ray shares the first's port)."""
        if self.controller is not None:
            return str(self.controller.base_path)
        return f"http://127.0.0.1:{self.port}{self.spec.route_prefix}/v1"

    def __enter__(self) -> ServingHarness:
        from workers.serving.controller import ServingController

        self.controller = ServingController(self.spec, self.plane.token, metrics_seconds=0.5, spool=False)
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> dict[str, int]:
        totals: dict[str, int] = self.controller.stop() if self.controller is not None else {}
        self.controller = None
        return totals

    def set_arms(self, arms: list[dict[str, Any]]) -> bool:
        """Publish `arms` as the target and reconcile once (deploys, swaps, removes); returns whether it changed."""
        self.plane.set_target(arms)
        changed: bool = self.controller.poll_once()
        return changed

    def openai_client(self, key: str = GOOD_KEY, **options: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=60.0, **options)

    def arm_status(self, arm: str = "a") -> dict[str, Any]:
        from ray import serve

        from workers.serving.names import ARM_DEPLOYMENT

        handle = serve.get_deployment_handle(ARM_DEPLOYMENT, app_name=self.controller.names.arm_app(arm))
        status: dict[str, Any] = handle.status.remote().result(timeout_s=30)
        return status

    def store_status(self) -> dict[str, Any]:
        import ray

        status: dict[str, Any] = ray.get(self.controller.store.status.remote())
        return status


def sse_events(raw: bytes) -> Iterator[str]:
    for block in io.BytesIO(raw).read().decode().split("\n\n"):
        if block.startswith("data: "):
            yield block.removeprefix("data: ")
