"""One arm of a serving run: `ArmReplica`, a policy backend behind a lock that follows its arm's weights.

It waits for its first weights from the store (the arm's full sync) before answering, renders the request as the
environments render prompts, generates, splits tool calls out of the reply and answers; then it hands the turn to
its `Shipper`, so the recording happens after the response exists and never on its path. A background thread
long-polls the store for new weights and applies them (`apply_update`) under the generation lock: a request that
holds the lock finishes on the weights it started with, and every response carries the policy version that
produced it. The router that forwards to it is `workers.serving.app`.

Streaming: the transformers backend samples a whole completion before it returns, so a streamed response is
generated first, then sent as one chunk per sampled token (`text_pieces`: the token's text delta, with its
logprob when asked).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from workers.models import make_backend
from workers.models.base import SamplingParams
from workers.reporting import configure_logging
from workers.rl.weightsync import WeightSyncError, WeightSyncReceiver
from workers.serving.names import Names, named_actor
from workers.serving.openai_api import (
    Envelope,
    completion_body,
    make_reply,
    render_messages,
    stream_chunks,
    tool_specs,
)
from workers.serving.openai_request import APIError, parse_request
from workers.serving.recorder import Shipper

log = logging.getLogger("crucible.serve")

FIRST_SYNC_WAIT_SECONDS = 300.0


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
        self.shipper = Shipper(lambda: named_actor(self.names.recorder))
        self._sync_thread = threading.Thread(target=self._follow_weights, name="crucible-weights", daemon=True)
        self._sync_thread.start()

    # --- weights -------------------------------------------------------------------------------------------------
    def _follow_weights(self) -> None:
        store: Any = None
        while not self._stop.is_set():
            try:
                if store is None:
                    store = named_actor(self.names.store)
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
        # One function on purpose: one request, in order: parse, render, check the context, sample, answer; each
        # refusal names its field.
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
