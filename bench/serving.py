"""Serving figures (issue 18): latency with and without recording, endpoint vs backend throughput, hot-swap cost,
and how many session turns the recorder takes per second.

    .venv/bin/python bench/serving.py [--quick] [--model NAME] [--rounds R] [--requests N] [--max-tokens T]

Everything runs in one invocation on a local Ray, on the same machine, with stand-ins for the control plane
(`tests.workers.serving.helpers.StubControlPlane`: target, key verification, and an ingest endpoint that only
stores the events; the real ingest's database writes are not in these figures). Nothing asserts on time; the load
average is printed beside the figures because the machine may be shared.

1. Latency, recording on vs off, same invocation: two serving runs on the same Serve (one with `record=True`, one
   with `record=False`), one arm each on the same base model, one replica, the same threads. Rounds alternate
   between them (on/off, then off/on, ...), each round `--requests` sequential non-streamed requests from the
   official `openai` client with the same prompts, greedy, `--max-tokens`. Client-side wall time per request;
   p50/p95 over all rounds of each.
2. Throughput: the endpoint (`openai` client, sequential, then `--concurrency` threads) beside the same prompts
   generated one at a time by an `HFBackend` in this process with the same thread count (the replica serialises
   generation: there is no cross-request batching in the transformers backend). Requests/s and completion tokens/s.
3. Hot swap: base -> checkpoint 1 -> checkpoint 2 on the recording run, each checkpoint one AdamW step
   (learning rate 1e-6, as a real update) from the previous; seconds (encode, deliver and apply on every replica),
   checkpoint load seconds, delta bytes vs the full blob's bytes.
4. Recorder capacity: `--turns` synthetic turns (a 2,000-token prompt, a 256-token completion, its logprobs, six
   chat messages) submitted in batches of 64 to a `Recorder` actor; turns/s accepted (validated and numbered) and
   turns/s delivered to the stub ingest endpoint.

Results: bench/results/serving.txt and .json (serving-quick.* for --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402

FULL = {
    "model": "smollm2-135m-instruct",
    "rounds": 6,
    "requests": 20,
    "max_tokens": 64,
    "turns": 5000,
    "concurrency": 4,
}
QUICK = {
    "model": "tiny-llama-smollm2-tokenizer",
    "rounds": 2,
    "requests": 8,
    "max_tokens": 16,
    "turns": 500,
    "concurrency": 2,
}
PROMPTS = [
    "Write a Python function that reverses a string.",
    "What does HTTP status 404 mean?",
    "Explain a hash map in two sentences.",
    "Fix the bug: def add(a, b): return a - b",
    "Name three sorting algorithms.",
    "What is the capital of France?",
    "Summarise what a unit test is.",
    "Convert 100 Fahrenheit to Celsius.",
]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def percentiles(values: list[float]) -> dict[str, float]:
    from workers.serving.recorder import percentile

    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "mean": statistics.fmean(values),
        "n": len(values),
    }


def make_checkpoint(base_model: str, path: Path, *, seed: int, start: Path | None = None) -> str:
    """One AdamW step (lr 1e-6) of the base model (or of `start`) on two synthetic samples: a checkpoint whose
    change from its parent is the size a real update makes."""
    import torch

    from workers.models.registry import resolve_base_model
    from workers.rl.config import TrainConfig
    from workers.rl.learner import Learner
    from workers.rl.packing import completion_logprobs
    from workers.rl.rollout import Sample

    config = TrainConfig(
        base_model=base_model, prompts_per_step=1, group_size=2, learning_rate=1e-6, loss={"kl_coef": 0.0}
    )
    learner = Learner(str(resolve_base_model(base_model)), config)
    if start is not None:
        learner.load_checkpoint(start.read_bytes())
    rng = random.Random(seed)
    samples = []
    for i in range(2):
        prompt = [rng.randrange(100, 5000) for _ in range(16)]
        completion = [rng.randrange(100, 5000) for _ in range(16)]
        with torch.no_grad():
            (old,) = completion_logprobs(learner.model, [prompt + completion], [len(prompt)])
        samples.append(
            Sample(
                task_id="t",
                group=0,
                token_ids=prompt + completion,
                completion_start=len(prompt),
                loss_mask=[1] * len(completion),
                old_logprobs=old.tolist(),
                reward=float(i),
                terms={},
                policy_version=learner.version,
                num_turns=1,
                malformed_tool_calls=0,
                finish_reason="length",
                error=None,
                trajectory={"id": f"x{i}"},
            )
        )
    learner.train_step(samples)
    path.write_bytes(learner.checkpoint_bytes(data_position=0))
    return path.as_uri()


def timed_requests(client: Any, model: str, n: int, max_tokens: int, session: str) -> tuple[list[float], int]:
    latencies, tokens = [], 0
    for i in range(n):
        started = time.perf_counter()
        completion = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            max_tokens=max_tokens,
            temperature=0,
            extra_headers={"X-Session-Id": f"{session}-{i}", "X-Turn-Index": "0"},
        )
        latencies.append((time.perf_counter() - started) * 1000.0)
        tokens += completion.usage.completion_tokens
    return latencies, tokens


def concurrent_requests(client: Any, model: str, n: int, max_tokens: int, threads: int) -> tuple[float, int]:
    tokens: list[int] = []
    lock = threading.Lock()
    counter = iter(range(n))

    def worker() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            completion = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                max_tokens=max_tokens,
                temperature=0,
            )
            with lock:
                tokens.append(completion.usage.completion_tokens)

    started = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return time.perf_counter() - started, sum(tokens)


def direct_backend(model: str, n: int, max_tokens: int, threads: int) -> tuple[float, int]:
    from workers.models import make_backend
    from workers.models.base import SamplingParams

    backend = make_backend("transformers", model, threads=threads)
    params = SamplingParams(temperature=0, max_new_tokens=max_tokens)
    prompts = [backend.encode_chat([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]) for i in range(n)]
    backend.generate([prompts[0]], params)  # warm-up, as the replica's first request was
    started = time.perf_counter()
    tokens = sum(len(backend.generate([prompt], params)[0].token_ids) for prompt in prompts)
    return time.perf_counter() - started, tokens


def recorder_capacity(ingest_url: str, token: str, plane: Any, turns: int) -> dict[str, float]:
    import ray

    from workers.serving.recorder import Recorder

    recorder = ray.remote(Recorder).remote(ingest_url=ingest_url, token=token, metrics_seconds=3600, spool=False)
    ray.get(recorder.ready.remote())
    rng = random.Random(0)
    messages = [{"role": "user" if i % 2 else "assistant", "content": "word " * 300} for i in range(6)]

    def turn(i: int) -> dict[str, Any]:
        return {
            "session_id": f"cap-{i // 4}",
            "task_type": "coding",
            "token_id": 5,
            "turn": {
                "turn_index": i % 4,
                "request_id": f"chatcmpl-cap-{i}",
                "messages": messages,
                "tools": [],
                "response": {"role": "assistant", "content": "ok " * 100},
                "prompt_token_ids": [rng.randrange(49152) for _ in range(2000)],
                "completion_token_ids": [rng.randrange(49152) for _ in range(256)],
                "logprobs": [-rng.random() for _ in range(256)],
                "policy_version": 1,
                "deployment_id": 1,
                "arm": "",
                "latency_ms": 100.0,
                "finish_reason": "length",
                "created_at": time.time(),
            },
        }

    batches = [[turn(i) for i in range(start, min(start + 64, turns))] for start in range(0, turns, 64)]
    before = len(plane.turns())
    started = time.perf_counter()
    accepted = sum(ray.get([recorder.submit.remote(batch, [], {}) for batch in batches]))
    accepted_seconds = time.perf_counter() - started
    while len(plane.turns()) - before < accepted:
        time.sleep(0.05)
    delivered_seconds = time.perf_counter() - started
    ray.get(recorder.close.remote())
    return {
        "turns": float(accepted),
        "accepted_per_second": accepted / accepted_seconds,
        "delivered_per_second": accepted / delivered_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model and small counts (a smoke run)")
    parser.add_argument("--model")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--requests", type=int, help="requests per round and per run")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--turns", type=int, help="synthetic turns for the recorder capacity")
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each replica and the direct backend")
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)
    size = dict(QUICK if args.quick else FULL)
    for key in size:
        value = getattr(args, key.replace("-", "_"), None)
        if value is not None:
            size[key] = value

    import ray
    from ray import serve

    from tests.workers.serving.helpers import GOOD_KEY, ServingHarness, StubControlPlane
    from workers.models.registry import resolve_base_model

    model = str(size["model"])
    resolve_base_model(model)  # builds a built-in model's directory once, outside every timing
    results: dict[str, Any] = {"size": size, "threads": args.threads, "loadavg_before": loadavg()}
    ray.init(num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    spec = {
        "base_model": model,
        "threads": args.threads,
        "max_new_tokens": int(size["max_tokens"]),
        "max_context": 4096,
    }
    with (
        StubControlPlane() as on_plane,
        StubControlPlane() as off_plane,
        ServingHarness(on_plane, run_id=1, record=True, **spec) as on,
        ServingHarness(off_plane, run_id=2, record=False, **spec) as off,
        tempfile.TemporaryDirectory() as scratch,
    ):
        log("starting two serving runs (recording on and off)")
        on.set_arms([{"name": "a", "weight": 1.0, "deployment_id": 1, "checkpoint_id": None}])
        off.set_arms([{"name": "a", "weight": 1.0, "deployment_id": 1, "checkpoint_id": None}])
        name = on.spec.model_name
        clients = {"on": on.openai_client(GOOD_KEY), "off": off.openai_client(GOOD_KEY)}
        for client in clients.values():
            timed_requests(client, name, 2, int(size["max_tokens"]), "warm")

        log("1. latency, recording on vs off, alternating rounds")
        latencies: dict[str, list[float]] = {"on": [], "off": []}
        tokens_per_run: dict[str, int] = {"on": 0, "off": 0}
        for round_index in range(int(size["rounds"])):
            order = ["on", "off"] if round_index % 2 == 0 else ["off", "on"]
            for which in order:
                values, tokens = timed_requests(
                    clients[which], name, int(size["requests"]), int(size["max_tokens"]), f"r{round_index}{which}"
                )
                latencies[which] += values
                tokens_per_run[which] += tokens
        results["latency_ms"] = {which: percentiles(values) for which, values in latencies.items()}
        results["latency_completion_tokens"] = tokens_per_run
        on_plane.wait_for(lambda: len(on_plane.turns()) >= int(size["rounds"]) * int(size["requests"]), timeout=120)
        results["recorded_turns"] = len(on_plane.turns())

        log("2. throughput: endpoint vs the backend called directly")
        n = int(size["requests"]) * 2
        direct_seconds, direct_tokens = direct_backend(model, n, int(size["max_tokens"]), args.threads)
        _, endpoint_seq_tokens = timed_requests(clients["off"], name, 1, int(size["max_tokens"]), "tp-warm")
        started = time.perf_counter()
        _, endpoint_seq_tokens = timed_requests(clients["off"], name, n, int(size["max_tokens"]), "tp")
        endpoint_seq_seconds = time.perf_counter() - started
        conc_seconds, conc_tokens = concurrent_requests(
            clients["off"], name, n, int(size["max_tokens"]), int(size["concurrency"])
        )
        results["throughput"] = {
            "requests": n,
            "direct": {"rps": n / direct_seconds, "tokens_per_s": direct_tokens / direct_seconds},
            "endpoint_sequential": {
                "rps": n / endpoint_seq_seconds,
                "tokens_per_s": endpoint_seq_tokens / endpoint_seq_seconds,
            },
            f"endpoint_{size['concurrency']}_clients": {
                "rps": n / conc_seconds,
                "tokens_per_s": conc_tokens / conc_seconds,
            },
        }

        log("3. hot swap: base -> checkpoint 1 -> checkpoint 2 (one AdamW step each)")
        first = Path(scratch) / "ckpt-1.pt"
        second = Path(scratch) / "ckpt-2.pt"
        uri1 = make_checkpoint(model, first, seed=1)
        uri2 = make_checkpoint(model, second, seed=2, start=first)
        for checkpoint_id, uri in ((1, uri1), (2, uri2)):
            on.set_arms(
                [
                    {
                        "name": "a",
                        "weight": 1.0,
                        "deployment_id": 1,
                        "checkpoint_id": checkpoint_id,
                        "checkpoint_uri": uri,
                    }
                ]
            )
        initial = on.controller.arms["a"].history[0]
        swaps = on.controller.arms["a"].history[1:]
        results["hot_swap"] = {
            "initial_full_sync": {k.removeprefix("serve/"): v for k, v in initial.items()},
            "swaps": [{k.removeprefix("serve/"): v for k, v in figures.items()} for figures in swaps],
        }

        log("4. recorder capacity")
        results["recorder"] = recorder_capacity(on_plane.ingest_url, on_plane.token, on_plane, int(size["turns"]))
    serve.shutdown()
    ray.shutdown()
    results["loadavg_after"] = loadavg()
    report(results, quick=args.quick)


def report(results: dict[str, Any], *, quick: bool) -> None:
    lat = results["latency_ms"]
    tp = results["throughput"]
    lines = [
        f"serving bench ({'quick' if quick else 'full'}): model {results['size']['model']}, "
        f"{results['threads']} thread(s) per replica, "
        f"load average {results['loadavg_before']} -> {results['loadavg_after']}",
        "",
        "latency per request (ms, client side, non-streamed, greedy, "
        f"max_tokens {results['size']['max_tokens']}, {results['size']['rounds']} alternating rounds):",
        f"  recording on : p50 {lat['on']['p50']:8.1f}  p95 {lat['on']['p95']:8.1f}  (n={lat['on']['n']})",
        f"  recording off: p50 {lat['off']['p50']:8.1f}  p95 {lat['off']['p95']:8.1f}  (n={lat['off']['n']})",
        f"  p50 on/off: {lat['on']['p50'] / lat['off']['p50']:.3f}; turns recorded: {results['recorded_turns']}",
        "",
        f"throughput ({tp['requests']} requests):",
    ]
    for name, figures in tp.items():
        if isinstance(figures, dict):
            lines.append(
                f"  {name:<22} {figures['rps']:7.2f} req/s  {figures['tokens_per_s']:9.1f} completion tokens/s"
            )
    lines.append("")
    lines.append("hot swap (every replica serving the new version; bytes of the sync blob):")
    initial = results["hot_swap"]["initial_full_sync"]
    lines.append(
        f"  first weights (full, the replicas starting meanwhile): {initial['swap_seconds']:.3f} s, "
        f"{initial['swap_bytes'] / 1e6:.2f} MB"
    )
    for index, swap in enumerate(results["hot_swap"]["swaps"], start=1):
        lines.append(
            f"  checkpoint {index} (delta): {swap['swap_seconds']:.3f} s (encode {swap['swap_encode_seconds']:.3f}, "
            f"apply {swap['swap_apply_seconds']:.3f}; load {swap['swap_load_seconds']:.3f}), "
            f"{swap['swap_bytes'] / 1e6:.2f} MB vs full {swap['swap_full_bytes'] / 1e6:.2f} MB "
            f"({swap['swap_bytes'] / swap['swap_full_bytes']:.1%})"
        )
    rec = results["recorder"]
    lines += [
        "",
        f"recorder: {rec['turns']:.0f} turns (2,000 prompt + 256 completion tokens each): "
        f"{rec['accepted_per_second']:.0f} turns/s accepted, {rec['delivered_per_second']:.0f} turns/s delivered "
        "to a stub ingest endpoint",
    ]
    text = "\n".join(lines)
    print(text)
    stem = "serving-quick" if quick else "serving"
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.txt").write_text(text + "\n")
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
