"""The serving job's driver side: start Serve, follow the control plane's target, hot-swap, stop cleanly.

`ServingController.start()` starts Ray Serve on the spec's host and port, the job's `WeightStore` and `Recorder`
actors, and the router application at the spec's route prefix (which answers 503 until an arm is ready).
`poll_once()` reads `<control_url>target/` and reconciles (`reconcile`):

- an arm that appeared gets its own Serve application (`num_replicas = spec.replicas`), then its first weights
  (a full sync of its checkpoint, or of the base model), and joins the routing table once every replica holds them;
- an arm whose checkpoint changed is hot-swapped: the new policy state is loaded on the CPU, encoded as a delta
  against what the replicas hold (`WeightSyncSender`), published and applied by every replica; the swap is
  reported (`serve/swap_seconds`, `serve/swap_bytes`, `serve/swap_full_bytes`, `serve/policy_version/<arm>`, at a
  step counting swaps) with a log line;
- an arm that disappeared leaves the routing table first, then its application is deleted.

`stop()` deletes the applications (without waiting for Serve to finish), ends the run's event stream and flushes it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import ray
from ray import serve

from workers.rl.weightsync import WeightSyncSender, encode_full
from workers.serving.app import ArmDeployment, RouterDeployment
from workers.serving.control import Target, TargetArm, fetch_target
from workers.serving.names import NAMESPACE, Names
from workers.serving.recorder import DEFAULT_METRICS_SECONDS, Recorder
from workers.serving.weights import WeightStore, policy_state
from workers.specs import ServeSpec
from workers.storage import read_bytes

log = logging.getLogger("crucible.serve")

SYNC_TIMEOUT_SECONDS = 600.0
RETRY_SECONDS = 30.0


def _import_model_libraries() -> None:
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401


def _serve_http() -> tuple[str, int] | None:
    """Where this cluster's Serve proxy really listens (its first start decided), if Serve says."""
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        if client is None:
            return None
        return str(client.http_config.host), int(client.http_config.port)
    except Exception:
        return None


def _app_status(app: str) -> tuple[str, str]:
    """A Serve application's status (NOT_STARTED, DEPLOYING, RUNNING, DEPLOY_FAILED, ...) and its message."""
    overview = serve.status().applications.get(app)
    if overview is None:
        return "NOT_STARTED", ""
    return str(overview.status.value), overview.message


@dataclass
class _ArmState:
    name: str
    app: str
    sender: Any  # WeightSyncSender
    target: TargetArm | None = None  # what the replicas hold; None until the first sync
    ready: bool = False
    policy_version: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


class ServingController:
    """Everything the serving job's driver does; the job module runs it in a loop, tests drive it by hand."""

    def __init__(
        self,
        spec: ServeSpec,
        token: str,
        *,
        metrics_seconds: float = DEFAULT_METRICS_SECONDS,
        spool: bool = True,
    ) -> None:
        self.spec = spec
        self.token = token
        self.names = Names(spec.run_id)
        self.metrics_seconds = metrics_seconds
        self.spool = spool
        self.arms: dict[str, _ArmState] = {}
        self.revision: str | None = None
        self.model_names: list[str] = [spec.model_name]
        self.swaps = 0
        self.store: Any = None
        self.recorder: Any = None
        self._http = httpx.Client(timeout=30.0)
        self._target_error: str | None = None
        self._router_up = False
        self._warm: threading.Thread | None = None
        self.http_host, self.http_port = spec.http_host, spec.http_port

    # --- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        spec = self.spec
        ray.init(ignore_reinit_error=True, log_to_driver=False)
        self.recorder = (
            ray.remote(Recorder)
            .options(name=self.names.recorder, namespace=NAMESPACE, num_cpus=0, max_concurrency=8)
            .remote(
                ingest_url=spec.ingest_url, token=self.token, metrics_seconds=self.metrics_seconds, spool=self.spool
            )
        )
        self.store = ray.remote(WeightStore).options(name=self.names.store, namespace=NAMESPACE, num_cpus=0).remote()
        ray.get([self.recorder.ready.remote(), self.store.status.remote()])
        serve.start(http_options={"host": spec.http_host, "port": spec.http_port})
        actual = _serve_http()
        if actual is not None and actual != (spec.http_host, spec.http_port):
            # One Serve (one HTTP proxy) per Ray cluster: a second serving run shares the first one's address.
            self.log(
                f"Serve already listens on {actual[0]}:{actual[1]} in this Ray cluster; this run's endpoint is "
                f"there (the spec's {spec.http_host}:{spec.http_port} does not apply)"
            )
            self.http_host, self.http_port = actual
        self.recorder.summary.remote({"endpoint": self.base_path, "model": spec.model_name, "arms": []})
        self.log(
            f"serving {spec.model_name} (base model {spec.base_model}, {spec.backend}) at {self.base_path}, "
            f"{spec.replicas} replica(s) per arm, recording {'on' if spec.record else 'off'}"
        )
        router_settings = {
            "run_id": spec.run_id,
            "model_name": spec.model_name,
            "control_url": spec.control_url,
            "token": self.token,
            "key_cache_seconds": spec.key_cache_seconds,
        }
        router = RouterDeployment.options(
            num_replicas=1,
            max_ongoing_requests=1000,
            ray_actor_options={"num_cpus": 0},
            graceful_shutdown_timeout_s=5,
        ).bind(router_settings)
        # Not waited for here: the router comes up while the first arms load (`wait_for_router`).
        serve.run_many(
            [serve.RunTarget(router, name=self.names.router_app, route_prefix=spec.route_prefix)],
            wait_for_applications_running=False,
        )
        self._router_up = False
        # torch and transformers take seconds to import: do it while Serve starts the replicas.
        self._warm = threading.Thread(target=_import_model_libraries, name="crucible-warm", daemon=True)
        self._warm.start()

    def wait_for_router(self, timeout: float = 300.0) -> None:
        """Block until the router application runs (its HTTP route answers); raises if its deployment failed."""
        if self._router_up:
            return
        deadline = time.monotonic() + timeout
        while (found := _app_status(self.names.router_app))[0] != "RUNNING":
            status, message = found
            if status in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise RuntimeError(f"the router application failed to start: {message}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the router application is still {status} after {timeout:.0f}s")
            time.sleep(0.1)
        self._router_up = True
        self.log(f"endpoint up at {self.base_path}")

    @property
    def base_path(self) -> str:
        """The endpoint's OpenAI base URL (ends in /v1)."""
        return f"http://{self.http_host}:{self.http_port}{self.spec.route_prefix.rstrip('/')}/v1"

    def stop(self, outcome: str = "succeeded", error: str = "", timeout: float = 30.0) -> dict[str, int]:
        """Delete the Serve applications (Serve finishes that on its own), give the replicas' last turns a moment
        to reach the recorder, then end and flush the run's events. Turns finished later are not recorded."""
        for app in [self.names.router_app, *(arm.app for arm in self.arms.values())]:
            try:
                serve.delete(app, _blocking=False)
            except Exception as exc:
                log.warning("could not delete the serve application %s: %s", app, exc)
        self.arms.clear()
        totals: dict[str, int] = {}
        if self.recorder is not None:
            time.sleep(0.5)  # two shipper intervals
            try:
                totals = ray.get(self.recorder.close.remote(outcome, error), timeout=timeout)
            except Exception as exc:
                log.error("the recorder could not flush the run's last events: %s", exc)
        self._http.close()
        return totals

    # --- reporting -----------------------------------------------------------------------------------------------
    def log(self, line: str) -> None:
        log.info("%s", line)
        self.recorder.log.remote(line)

    # --- the control loop ----------------------------------------------------------------------------------------
    def poll_once(self) -> bool:
        """Read the target and reconcile; returns whether anything changed. A target that cannot be read leaves
        everything as it is (logged once per outage)."""
        try:
            target = fetch_target(self._http, self.spec.control_url, self.token)
        except (httpx.HTTPError, ValueError) as exc:
            message = f"the target could not be read ({exc}); serving what is deployed"
            if message != self._target_error:
                self.log(message)
                self._target_error = message
            return False
        if self._target_error is not None:
            self.log("the target is readable again")
            self._target_error = None
        return self.reconcile(target)

    def reconcile(self, target: Target) -> bool:
        names = [self.spec.model_name, target.model_name] if target.model_name else [self.spec.model_name]
        names_changed = names != self.model_names
        self.model_names = names
        if target.revision == self.revision and not names_changed:
            return False
        wanted = {arm.name: arm for arm in target.arms}
        changed = names_changed
        removed = [name for name in self.arms if name not in wanted]
        if removed:
            for name in removed:
                self.arms[name].ready = False
            self._publish_routing(wanted)
            for name in removed:
                self._remove_arm(name)
            changed = True
        new = [arm for name, arm in wanted.items() if name not in self.arms]
        if new:
            self._deploy_arms(new)
            changed = True
        for name, arm in wanted.items():
            state = self.arms[name]
            if state.target is None or state.target.weights_key != arm.weights_key:
                self.swap(name, arm)
                changed = True
            elif state.target != arm:
                state.target = arm  # a new weight or deployment id: routing only
                changed = True
        self.revision = target.revision
        self._publish_routing(wanted)
        self.wait_for_router()
        if changed:
            self.recorder.summary.remote(self.summary())
        return changed

    def summary(self) -> dict[str, Any]:
        """What the run's page shows: the endpoint and, per arm, the version served and its share of sessions."""
        return {
            "endpoint": self.base_path,
            "model": self.spec.model_name,
            "revision": self.revision,
            "arms": [
                {
                    "name": state.name,
                    "policy_version": state.policy_version,
                    "checkpoint_id": state.target.checkpoint_id if state.target else None,
                    "deployment_id": state.target.deployment_id if state.target else None,
                    "weight": state.target.weight if state.target else 0.0,
                    "ready": state.ready,
                }
                for state in self.arms.values()
            ],
            "swaps": self.swaps,
        }

    def _publish_routing(self, wanted: dict[str, TargetArm]) -> None:
        arms = [
            {
                "name": state.name,
                "app": state.app,
                "weight": wanted[state.name].weight,
                "deployment_id": wanted[state.name].deployment_id,
                "policy_version": state.policy_version,
            }
            for state in self.arms.values()
            if state.ready and state.name in wanted
        ]
        ray.get(self.store.set_routing.remote({"arms": arms, "model_names": self.model_names}))

    def _deploy_arms(self, arms: list[TargetArm]) -> None:
        """Start a Serve application per new arm, all at once; each joins with its first (full) sync in `swap`."""

        spec = self.spec
        resources: dict[str, Any] = {"num_cpus": spec.threads} if spec.backend == "transformers" else {"num_gpus": 1}
        targets = []
        for arm in arms:
            settings = {
                "arm": arm.name,
                "run_id": spec.run_id,
                "base_model": spec.base_model,
                "backend": spec.backend,
                "threads": spec.threads,
                "max_new_tokens": spec.max_new_tokens,
                "max_context": spec.max_context,
                "record": spec.record,
            }
            deployment = ArmDeployment.options(
                num_replicas=spec.replicas,
                max_ongoing_requests=64,
                ray_actor_options=resources,
                graceful_shutdown_timeout_s=30,
                health_check_period_s=10,
            ).bind(settings)
            app = self.names.arm_app(arm.name)
            targets.append(serve.RunTarget(deployment, name=app, route_prefix=None))
            self.arms[arm.name] = _ArmState(name=arm.name, app=app, sender=WeightSyncSender())
        serve.run_many(targets, wait_for_applications_running=False)
        self.log(
            f"starting {len(arms)} arm(s) ({', '.join(a.name for a in arms)}) with {spec.replicas} replica(s) each"
        )

    def _remove_arm(self, name: str) -> None:
        state = self.arms.pop(name)
        serve.delete(state.app, _blocking=False)
        ray.get(self.store.drop_arm.remote(name))
        self.log(f"arm {name} removed (it served policy version {state.policy_version})")

    def swap(self, name: str, arm: TargetArm) -> dict[str, float]:
        """Bring arm `name`'s replicas to `arm`'s checkpoint (its first weights: a full sync); returns the swap's
        figures, which are also reported."""

        # One function on purpose: a swap's phases in order (load, encode, publish, wait for every replica to apply
        # it), each timed for the swap's figures.
        state = self.arms[name]
        started = time.perf_counter()
        if self._warm is not None:
            self._warm.join()  # transformers' lazy imports are not safe from two threads at once
        uri = arm.checkpoint_uri
        blob = read_bytes(uri, self.spec.storage_options) if arm.checkpoint_id and uri else None
        weights, _ = policy_state(self.spec.base_model, blob, threads=self.spec.threads)
        loaded = time.perf_counter()
        update = state.sender.push(weights)
        encoded = time.perf_counter()
        try:
            ray.get(
                self.store.publish.remote(
                    name,
                    sync_version=update.version,
                    base=update.base_version,
                    policy_version=arm.policy_version,
                    checkpoint_id=arm.checkpoint_id,
                    blob=[ray.put(update.blob)],
                    size=len(update.blob),
                )
            )
        except Exception:
            state.sender.reset()  # the replicas never got this version: the next push must be full
            raise
        report = self._wait_synced(state, update.version)
        delivered = time.perf_counter()
        state.target = arm
        state.policy_version = arm.policy_version
        state.ready = True
        if update.kind == "full":
            full_bytes = len(update.blob)
        else:
            # The full weights once more, for replicas that join later, and as the figure the delta is weighed
            # against.
            full = encode_full(weights, version=update.version)
            full_bytes = len(full)
            ray.get(
                self.store.publish_full.remote(name, sync_version=update.version, blob=[ray.put(full)], size=full_bytes)
            )
        self.swaps += 1
        figures = {
            "serve/swap_seconds": delivered - loaded,
            "serve/swap_load_seconds": loaded - started,
            "serve/swap_encode_seconds": encoded - loaded,
            "serve/swap_apply_seconds": float(report.get("apply_seconds", 0.0)),
            "serve/swap_bytes": float(len(update.blob)),
            "serve/swap_full_bytes": float(full_bytes),
            "serve/swap_delta": 1.0 if update.kind == "delta" else 0.0,
            f"serve/policy_version/{name}": float(arm.policy_version),
        }
        state.history.append(figures)
        self.recorder.metric.remote(self.swaps, figures)
        what = f"checkpoint {arm.checkpoint_id}" if arm.checkpoint_id else "the base model"
        outcome = "" if report["ok"] else f"; only {report['acked']} of {self.spec.replicas} replicas confirmed"
        self.log(
            f"arm {name}: now serving {what} (policy version {arm.policy_version}); {update.kind} sync of "
            f"{len(update.blob):,} bytes (full {full_bytes:,}) reached {report['acked']} replica(s) in "
            f"{delivered - loaded:.2f}s (loading {loaded - started:.2f}s, encoding {encoded - loaded:.2f}s){outcome}"
        )
        return figures

    def _wait_synced(self, state: _ArmState, sync_version: int) -> dict[str, Any]:
        """Wait until every replica of the arm holds `sync_version`; raises when the arm's application failed to
        start (a replica that cannot load the model would otherwise be waited for until the timeout)."""
        deadline = time.monotonic() + SYNC_TIMEOUT_SECONDS
        while True:
            report: dict[str, Any] = ray.get(
                self.store.wait_synced.remote(state.name, sync_version, self.spec.replicas, 2.0)
            )
            if report["ok"] or time.monotonic() > deadline:
                return report
            status, message = _app_status(state.app)
            if status in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise RuntimeError(f"arm {state.name}: its replicas failed to start ({status}): {message}")

    def run(self, should_stop: Any) -> None:
        """Poll the target every `poll_seconds` until `should_stop()` is true (checked every 0.2 s)."""
        next_poll = 0.0
        while not should_stop():
            if time.monotonic() >= next_poll:
                wait = self.spec.poll_seconds
                try:
                    self.poll_once()
                except Exception as exc:  # one bad reconcile must not end a long-lived job
                    # A checkpoint that cannot be loaded or replicas that cannot start would fail again at once:
                    # wait longer before loading and encoding it again.
                    wait = max(wait, RETRY_SECONDS)
                    log.exception("reconcile failed")
                    self.log(f"reconcile failed: {type(exc).__name__}: {exc}; retrying in {wait:.0f}s")
                    self.revision = None
                next_poll = time.monotonic() + wait
            time.sleep(0.2)
