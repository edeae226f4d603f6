"""Learning check for Composer 2's coding agent on a CPU (issue 17 section 4): SFT warm-up, then RL with Composer's
defaults, on generated repository tasks.

    .venv/bin/python bench/coding_learning_check.py            # docs/recipe-learning-checks.md's first table (45 min)
    .venv/bin/python bench/coding_learning_check.py --quick    # a smoke run with the tiny test model

Everything is the project's own code, in one process (no Ray, no control plane), so the numbers come from the
same generator, harness, reward, SFT filter, learner and rollout code a run uses:
1. tasks: `workers.coding.generate.generate_tasks` over the vendored libraries (repair and implement families),
   each kept task verified in the sandbox; written as the codegen job writes them (repo_task/v1 rows whose
   snapshots are content-hashed tar.gz files) into a cache folder and read back on later runs; split by task-id
   hash into train and held-out;
2. base: SmolLM2-135M-Instruct, one greedy episode per held-out task in `coding_agent` (hidden tests after the
   episode: pass = every fail-to-pass and pass-to-pass test passes);
3. SFT warm-up: the scripted coding agent (`workers.coding.scripted`, teacher 'scripted-coding') solves each train
   task from its reference patch through the real tools; `CodingAgentEnv.select_for_sft` keeps the solved episodes
   (counts by reason); the base model is fine-tuned on them (full parameters, `workers.rl.sft.fine_tune`);
   evaluated the same way;
4. RL: algorithm "composer" (Composer 2's C1/C2: A = R - mean, no std division, no length normalisation, k1 KL as a
   reward penalty), with LoRA, from the SFT model on the train tasks, reward `coding_agent_spec()` (hidden tests
   all-or-nothing, broken tool calls, TODOs left, C4 length cost); evaluated the same way.
Each evaluation is paired per held-out task: pass@1 and the hidden-test pass fraction, with a paired bootstrap 95%
interval of the mean difference, a Wilcoxon signed-rank test (Pratt), a sign test and (pass@1) an exact McNemar
test. Results: bench/results/coding_learning_check.{json,txt}. The machine may be busy with other work: the load
average is recorded at every phase.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scipy import stats as scipy_stats  # noqa: E402

from workers.coding.candidates import DEFAULT_SOURCES, CodegenParams  # noqa: E402
from workers.coding.environment import CodingAgentEnv  # noqa: E402
from workers.coding.generate import generate_tasks  # noqa: E402
from workers.coding.scripted import SCRIPTED_CODING_TEACHER, SCRIPTED_CODING_TEACHERS  # noqa: E402
from workers.evals.paired import paired_bootstrap  # noqa: E402
from workers.evals.stats import mcnemar_exact, sign_test  # noqa: E402
from workers.models import make_backend  # noqa: E402
from workers.models.registry import SMOLLM2, TINY_LLAMA, resolve_base_model  # noqa: E402
from workers.rewards.schema import coding_agent_spec  # noqa: E402
from workers.rl.config import TrainConfig, settings_for  # noqa: E402
from workers.rl.learner import Learner  # noqa: E402
from workers.rl.rollout import RolloutWorker, Sample  # noqa: E402
from workers.rl.weightsync import WeightSyncReceiver  # noqa: E402

CACHE = Path("/tmp/crucible-coding-learning")
RESULTS = ROOT / "bench" / "results"
MODELS = ("base", "sft", "rl")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def held_out(task_id: str, percent: int) -> bool:
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 100 < percent


# --- tasks --------------------------------------------------------------------------------------------------------


def cached_tasks(params: CodegenParams, cache: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The generated repo_task/v1 rows for `params` (the codegen job's layout: tasks.jsonl whose snapshot uris are
    snapshots/<sha256>.tar.gz beside it) and a summary of the generation report; generated once per parameter set
    and read back on later runs (generation checks every candidate in the sandbox: minutes)."""
    key = hashlib.sha256(json.dumps(params.model_dump(mode="json", exclude={"workers"}), sort_keys=True).encode())
    folder = cache / f"tasks-{key.hexdigest()[:12]}"
    tasks_file, report_file = folder / "tasks.jsonl", folder / "report.json"
    if tasks_file.exists() and report_file.exists():
        rows = [json.loads(line) for line in tasks_file.read_text().splitlines() if line.strip()]
        log(f"{len(rows)} generated tasks read from {folder}")
        return rows, {**json.loads(report_file.read_text()), "cached": str(folder)}
    log(f"generating up to {params.max_tasks} tasks from {', '.join(params.sources)} into {folder} (minutes)")
    started = time.monotonic()

    def on_progress(checked: int, kept: int, dropped: Any) -> None:
        if checked % 10 == 0:
            log(f"  {checked} candidates checked: {kept} kept, {sum(dropped.values())} dropped")

    result = generate_tasks(params, on_progress=on_progress)
    (folder / "snapshots").mkdir(parents=True, exist_ok=True)
    uris = {}
    for sha256, archive in sorted(result.snapshots.items()):
        path = folder / "snapshots" / f"{sha256}.tar.gz"
        path.write_bytes(archive)
        uris[sha256] = f"file://{path.resolve()}"
    rows = []
    for task in result.tasks:
        snapshot = task.snapshot.model_copy(update={"uri": uris[task.snapshot.sha256]})
        rows.append(task.model_copy(update={"snapshot": snapshot}).to_row())
    report = {k: v for k, v in result.report.items() if k not in ("checked", "sources")}
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    report["load_average_after"] = load_average()
    report_file.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    tasks_file.write_text("".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows))
    log(f"kept {len(rows)} tasks of {report['candidates']} candidates in {report['wall_seconds']:.0f}s")
    return rows, {**report, "cached": None}


# --- evaluation and statistics ------------------------------------------------------------------------------------


def outcome(sample: Sample) -> dict[str, Any]:
    """What one episode did, for the per-task table."""
    record = sample.trajectory
    hidden = record.get("hidden_tests") or {}
    metrics = sample.episode_metrics
    return {
        "resolved": 1.0 if hidden.get("resolved") else 0.0,
        "tests_passed": float(record.get("tests_passed") or 0.0),
        "fail_to_pass": f"{hidden.get('fail_to_pass_passed', 0)}/{hidden.get('fail_to_pass_total', 0)}",
        "pass_to_pass": f"{hidden.get('pass_to_pass_passed', 0)}/{hidden.get('pass_to_pass_total', 0)}",
        "reward": round(sample.reward, 4),
        "turns": int(metrics.get("turns", 0)),
        "tool_calls": int(metrics.get("tool_calls", 0)),
        "malformed_tool_calls": int(metrics.get("malformed_tool_calls", 0)),
        "summaries": int(metrics.get("summaries", 0)),
        "files_edited": int(metrics.get("files_edited", 0)),
        "sampled_tokens": sample.sampled_tokens,
        "finish_reason": record.get("finish_reason"),
        "error": (sample.error or "")[:200] or None,
        # What the policy wrote, for reading the table: its first replies and the first malformed-call message.
        "first_replies": [t["content"][:300] for t in record.get("turns", []) if t.get("role") == "assistant"][:2],
        "first_malformed": next(
            (t["content"][:300] for t in record.get("turns", []) if t.get("role") == "tool" and t.get("malformed")),
            None,
        ),
    }


def evaluate(worker: RolloutWorker, tasks: list[dict[str, Any]], label: str, batch: int) -> dict[str, Any]:
    """One greedy episode per held-out task (group size 1), as the eval job runs a coding benchmark."""
    started = time.perf_counter()
    load_before = load_average()
    temperature = worker.temperature
    worker.temperature = 0.0
    per_task: dict[str, dict[str, Any]] = {}
    for at in range(0, len(tasks), batch):
        result = worker.rollout(tasks[at : at + batch], group_size=1, seed=0, id_prefix=f"eval-{label}-")
        for sample in result.samples:
            per_task[sample.task_id] = outcome(sample)
        log(f"  {label}: {min(at + batch, len(tasks))}/{len(tasks)} held-out tasks")
    worker.temperature = temperature
    rows = list(per_task.values())
    summary = {
        "pass@1": statistics.fmean(r["resolved"] for r in rows),
        "tests_passed": statistics.fmean(r["tests_passed"] for r in rows),
        "reward": statistics.fmean(r["reward"] for r in rows),
        "turns": statistics.fmean(r["turns"] for r in rows),
        "tool_calls": statistics.fmean(r["tool_calls"] for r in rows),
        "malformed_tool_calls": statistics.fmean(r["malformed_tool_calls"] for r in rows),
        "episodes_with_an_edit": sum(1 for r in rows if r["files_edited"]),
        "summaries": sum(r["summaries"] for r in rows),
        "finish_reasons": dict(Counter(str(r["finish_reason"]) for r in rows)),
        "seconds": round(time.perf_counter() - started, 1),
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }
    log(
        f"{label}: pass@1 {summary['pass@1']:.3f}, hidden-test fraction {summary['tests_passed']:.3f}, "
        f"{summary['tool_calls']:.1f} tool calls ({summary['malformed_tool_calls']:.1f} malformed), "
        f"{summary['episodes_with_an_edit']} episodes edited a file ({summary['seconds']:.0f}s)"
    )
    return {"summary": summary, "tasks": per_task}


def group_signal(samples: list[Sample]) -> dict[str, Any]:
    """Per RL step: how many groups (the samples of one task) had rewards that differ, the
    mean within-group reward std, and how many groups had at least one resolved episode."""
    groups: dict[str, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.task_id, []).append(sample)
    spreads = [float(np.std([s.reward for s in g])) for g in groups.values()]
    solved = [sum(1 for s in g if s.episode_metrics.get("resolved")) for g in groups.values()]
    return {
        "signal/groups": len(groups),
        "signal/groups_with_signal": sum(1 for x in spreads if x > 1e-6),
        "signal/within_group_reward_std": round(statistics.fmean(spreads), 4) if spreads else 0.0,
        "signal/groups_with_a_resolved_episode": sum(1 for n in solved if n),
        "signal/resolved_per_group": solved,
    }


def paired(after: dict[str, Any], before: dict[str, Any], metric: str) -> dict[str, Any]:
    """Paired per task: mean difference with a bootstrap 95% interval, Wilcoxon signed-rank (Pratt's zeros), sign
    test and, for a pass/fail metric, the exact McNemar test on the discordant tasks."""
    ids = sorted(before["tasks"])
    b = np.array([before["tasks"][i][metric] for i in ids])
    a = np.array([after["tasks"][i][metric] for i in ids])
    diff = a - b
    mean, low, high, _ = paired_bootstrap(b.tolist(), a.tolist(), n_boot=10_000, seed=0)
    nonzero = int(np.count_nonzero(diff))
    wilcoxon_p = float(scipy_stats.wilcoxon(a, b, zero_method="pratt").pvalue) if nonzero else 1.0
    out = {
        "metric": metric,
        "tasks": len(ids),
        "before": float(b.mean()),
        "after": float(a.mean()),
        "difference": float(mean),
        "ci95": [float(low), float(high)],
        "improved": int((diff > 0).sum()),
        "worse": int((diff < 0).sum()),
        "wilcoxon_p": wilcoxon_p if np.isfinite(wilcoxon_p) else 1.0,
        "sign_test_p": sign_test(diff.tolist()),
    }
    if metric == "resolved":
        out["mcnemar_p"] = mcnemar_exact(int((diff > 0).sum()), int((diff < 0).sum()))
    return out


def warm_up(
    args: argparse.Namespace,
    base_path: str,
    env_params: dict[str, Any],
    train: list[dict[str, Any]],
    reward: dict[str, Any],
    sft_path: str,
    end_phase: Any,
    phases: dict[str, float],
) -> dict[str, Any]:
    """SFT warm-up from the scripted coding agent, filtered by the environment's own rule (solved episodes); the
    model is saved to `sft_path`; returns its figures."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.rl.config_sections import SFTConfig
    from workers.rl.sft import fine_tune, generate

    phase = time.perf_counter()
    sft_config = SFTConfig(
        teacher_model=args.teacher,
        base_model=base_path,
        environment="coding_agent",
        env_params=env_params,
        rollouts_per_task=1,
        epochs=args.sft_epochs,
        learning_rate=args.sft_lr,
        max_tokens_per_pack=4096,
    )
    teacher_samples = generate(sft_config, train, reward)
    kept, report = CodingAgentEnv.select_for_sft([s.trajectory for s in teacher_samples])
    tokenizer = AutoTokenizer.from_pretrained(base_path, local_files_only=True)
    reply_tokens = [
        len(tokenizer.encode(turn["content"] + "<|im_end|>", add_special_tokens=False))
        for s in teacher_samples
        for turn in s.trajectory["turns"]
        if turn["role"] == "assistant"
    ]
    report["teacher"] = {
        "seconds": round(time.perf_counter() - phase, 1),
        "resolved": sum(1 for s in teacher_samples if (s.trajectory.get("hidden_tests") or {}).get("resolved")),
        "reward_mean": statistics.fmean(s.reward for s in teacher_samples) if teacher_samples else 0.0,
        "turns_mean": statistics.fmean(s.num_turns for s in teacher_samples) if teacher_samples else 0.0,
        "summaries": sum(len(s.trajectory.get("summaries") or []) for s in teacher_samples),
        "episode_tokens_median": statistics.median(s.total_tokens for s in teacher_samples) if teacher_samples else 0,
        "episode_tokens_max": max((s.total_tokens for s in teacher_samples), default=0),
        "reply_tokens_max": max(reply_tokens, default=0),
        "replies_over_max_new_tokens": sum(1 for n in reply_tokens if n > args.max_new_tokens),
        "replies": len(reply_tokens),
    }
    end_phase("sft_teacher", phase)
    log(f"teacher: {report}")
    phase = time.perf_counter()
    student: Any = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, local_files_only=True)
    if args.sft_lora_rank:  # adapters on every linear layer of the blocks, merged into the weights afterwards
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        lora = LoraConfig(r=args.sft_lora_rank, lora_alpha=2 * args.sft_lora_rank, target_modules=targets)
        student = get_peft_model(student, lora)
    # The first --sft-examples kept episodes in the train tasks' order (the generator interleaves sources and
    # families, so a prefix keeps both).
    used = kept[: args.sft_examples] if args.sft_examples else kept
    kept_samples = [teacher_samples[i] for i in used]
    losses = fine_tune(student, kept_samples, sft_config)
    if args.sft_lora_rank:
        student = student.merge_and_unload()
    student.save_pretrained(sft_path)
    tokenizer.save_pretrained(sft_path)
    del student
    end_phase("sft_fine_tune", phase)
    log(
        f"SFT on {len(used)} of {len(kept)} kept trajectories ({sum(s.total_tokens for s in kept_samples)} tokens, "
        f"{sum(s.sampled_tokens for s in kept_samples)} trained): loss {losses} ({phases['sft_fine_tune']:.0f}s)"
    )
    return {
        "filter": report,
        "loss_per_epoch": losses,
        "examples": len(used),
        "example_tasks": [s.task_id for s in kept_samples],
        "lora_rank": args.sft_lora_rank or None,
        "tokens": sum(s.total_tokens for s in kept_samples),
        "trained_tokens": sum(s.sampled_tokens for s in kept_samples),
        "config": sft_config.model_dump(mode="json"),
    }


# --- the check ----------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model, few tasks: checks the script runs")
    parser.add_argument("--tasks", type=int, default=40, help="repository tasks to generate (train + held-out)")
    parser.add_argument("--sources", default=",".join(DEFAULT_SOURCES), help="vendored libraries to mutate")
    parser.add_argument("--gen-seed", type=int, default=0, help="task generator seed")
    parser.add_argument("--held-out-percent", type=int, default=20, help="tasks held out, by task-id hash")
    parser.add_argument("--operators", default="", help="repair operators, comma-separated (default: all)")
    parser.add_argument("--families", default="repair,implement", help="task families, comma-separated")
    parser.add_argument(
        "--single-site",
        action="store_true",
        help="only functions the operators mutate in exactly one way (CodegenParams.single_site)",
    )
    parser.add_argument("--instruction-style", choices=["varied", "pinpoint"], default="varied")
    parser.add_argument(
        "--teacher",
        choices=sorted(SCRIPTED_CODING_TEACHERS),
        default=SCRIPTED_CODING_TEACHER,
        help="scripted-coding-search finds the function the instruction names by search, as a student can",
    )
    parser.add_argument("--max-turns", type=int, default=6, help="coding_agent max_turns")
    parser.add_argument("--max-calls-per-turn", type=int, default=2, help="coding_agent max_calls_per_turn")
    parser.add_argument("--max-output-chars", type=int, default=1500, help="coding_agent tool-output limit")
    parser.add_argument(
        "--summary-threshold", type=int, default=0, help="coding_agent summary_threshold_tokens (0: no summaries)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=256, help="per reply")
    parser.add_argument("--max-context", type=int, default=4096, help="rollout worker's context limit (tokens)")
    parser.add_argument("--eval-batch", type=int, default=12, help="held-out episodes generated together")
    parser.add_argument("--sft-examples", type=int, default=10, help="kept teacher episodes fine-tuned on (0: all)")
    parser.add_argument("--sft-epochs", type=int, default=1)
    parser.add_argument("--sft-lora-rank", type=int, default=16, help="SFT with LoRA of this rank, merged; 0: full")
    parser.add_argument("--sft-lr", type=float, default=3e-4, help="SFT warm-up learning rate")
    parser.add_argument("--steps", type=int, default=2, help="RL steps (composer)")
    parser.add_argument("--prompts-per-step", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4, help="RL learning rate (LoRA rank 16)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=CACHE, help="generated tasks and the SFT model go here")
    parser.add_argument("--out", type=Path, default=RESULTS / "coding_learning_check.json")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="reuse the base evaluation, SFT model and SFT evaluation an earlier run left in --cache for the same "
        "inputs (a stopped run resumes at RL)",
    )
    parser.add_argument(
        "--stop-after-sft",
        action="store_true",
        help="stop after the SFT model's evaluation (e.g. to serve that model in bench/realtime_learning_check.py)",
    )
    args = parser.parse_args()
    model = TINY_LLAMA if args.quick else SMOLLM2
    if args.quick:
        args.sources, args.tasks, args.steps, args.prompts_per_step, args.group_size = "webcolors", 6, 1, 2, 2
        args.sft_epochs, args.max_new_tokens, args.held_out_percent = 1, 48, 50
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    random.seed(0)
    started = time.perf_counter()
    env_params: dict[str, Any] = {
        "max_turns": args.max_turns,
        "max_calls_per_turn": args.max_calls_per_turn,
        "max_output_chars": args.max_output_chars,
        "summary_threshold_tokens": args.summary_threshold,
    }
    figures: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "model": model,
        "env_params": env_params,
        "max_new_tokens": args.max_new_tokens,
        "max_context_tokens": args.max_context,
        "load_average_start": load_average(),
        "phases": {},
    }
    phases: dict[str, float] = figures["phases"]
    loads: dict[str, list[float]] = figures.setdefault("load_average_after_phase", {})

    def end_phase(name: str, since: float) -> None:
        phases[name] = round(time.perf_counter() - since, 1)
        loads[name] = load_average()

    # 1. Tasks.
    phase = time.perf_counter()
    params = CodegenParams(
        sources=args.sources.split(","),
        families=args.families.split(","),
        operators=args.operators.split(",") if args.operators else CodegenParams().operators,
        single_site=args.single_site,
        instruction_style=args.instruction_style,
        max_tasks=args.tasks,
        max_candidates=10 * args.tasks,
        seed=args.gen_seed,
    )
    rows, generation = cached_tasks(params, args.cache)
    train = [row for row in rows if not held_out(row["id"], args.held_out_percent)]
    test = [row for row in rows if held_out(row["id"], args.held_out_percent)]
    end_phase("tasks", phase)
    if not train or not test:
        raise SystemExit(f"{len(train)} train and {len(test)} held-out tasks: change --tasks or --held-out-percent")
    families = {name: dict(Counter(r["family"] for r in part)) for name, part in (("train", train), ("test", test))}
    log(f"{len(rows)} tasks: {len(train)} train, {len(test)} held out; families {families}")
    figures["tasks"] = {
        "generated": len(rows),
        "train": len(train),
        "held_out": len(test),
        "families": families,
        "sources": {
            name: dict(Counter(r["source"]["library"] for r in part))
            for name, part in (("train", train), ("test", test))
        },
        "generation": {
            k: generation.get(k)
            for k in ("params", "candidates", "kept", "dropped", "statistics", "wall_seconds", "cached")
        },
        "held_out_ids": [r["id"] for r in test],
    }

    reward = coding_agent_spec().model_dump(mode="json")

    def worker_for(path: str, temperature: float) -> RolloutWorker:
        backend = make_backend("transformers", path, threads=args.threads)
        return RolloutWorker(
            backend,
            environment="coding_agent",
            env_params=env_params,
            reward=reward,
            temperature=temperature,
            max_new_tokens=args.max_new_tokens,
            max_context_tokens=args.max_context,
        )

    # Stages already run with the same inputs (--reuse): kept in the cache folder, keyed by what they depend on.
    stages_path = args.cache / "stages.json"
    stages: dict[str, Any] = json.loads(stages_path.read_text()) if args.reuse and stages_path.exists() else {}
    inputs = {
        "model": model,
        "tasks": [r["id"] for r in rows],
        "held_out": [r["id"] for r in test],
        "env": env_params,
        "max_new_tokens": args.max_new_tokens,
        "max_context": args.max_context,
    }
    sft_inputs = {
        **inputs,
        "teacher": args.teacher,
        "sft": [args.sft_examples, args.sft_epochs, args.sft_lora_rank, args.sft_lr],
    }

    def stage_key(name: str, depends: dict[str, Any]) -> str:
        return name + ":" + hashlib.sha256(json.dumps(depends, sort_keys=True).encode()).hexdigest()[:16]

    def keep_stage(key: str, value: Any) -> None:
        stages[key] = value
        if not args.quick:
            stages_path.parent.mkdir(parents=True, exist_ok=True)
            stages_path.write_text(json.dumps(stages))

    # 2. Base.
    base_path = str(resolve_base_model(model))
    phase = time.perf_counter()
    evals: dict[str, dict[str, Any]] = {}
    key = stage_key("eval_base", inputs)
    if key in stages:
        evals["base"] = stages[key]
        log(f"base: evaluation reused from {stages_path}")
    else:
        evals["base"] = evaluate(worker_for(base_path, 0.0), test, "base", args.eval_batch)
        keep_stage(key, evals["base"])
    end_phase("eval_base", phase)

    # 3. SFT warm-up from the scripted coding agent, filtered by the environment's own rule (solved episodes).
    sft_path = str(args.cache / ("sft-quick" if args.quick else "sft"))
    sft_key = stage_key("sft", sft_inputs)
    if sft_key in stages and Path(sft_path, "config.json").exists():
        figures["sft"] = stages[sft_key]
        log(f"SFT: reusing {sft_path}")
    else:
        figures["sft"] = warm_up(args, base_path, env_params, train, reward, sft_path, end_phase, phases)
        keep_stage(sft_key, figures["sft"])
    phase = time.perf_counter()
    key = stage_key("eval_sft", sft_inputs)
    if key in stages:
        evals["sft"] = stages[key]
        log(f"sft: evaluation reused from {stages_path}")
    else:
        sft_worker = worker_for(sft_path, 0.0)
        evals["sft"] = evaluate(sft_worker, test, "sft", args.eval_batch)
        del sft_worker
        keep_stage(key, evals["sft"])
    end_phase("eval_sft", phase)
    if args.stop_after_sft:
        log(f"stopped after SFT: model {sft_path}, tasks {generation.get('cached') or args.cache}")
        for name in ("base", "sft"):
            log(f"{name}: {json.dumps(evals[name]['summary'])}")
        return

    # 4. RL with Composer's defaults (C1, C2) from the SFT model.
    from workers.rl.steps import data_order

    phase = time.perf_counter()
    config = TrainConfig(
        base_model=sft_path,
        environment="coding_agent",
        env_params=env_params,
        algorithm="composer",
        learning_rate=args.lr,
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        lora={"rank": 16, "alpha": 32},
        max_tokens_per_pack=4096,
        sampling={"temperature": 1.0, "max_new_tokens": args.max_new_tokens},
    )
    settings = settings_for(config)
    learner = Learner(sft_path, config, threads=args.threads)
    # The learner's state (LoRA weights, optimizer, random generators) and the history so far, written after every
    # step: a run stopped mid-way resumes at its last finished step under --reuse.
    # Keyed without `steps`: a run asked for more steps under --reuse continues the same run (constant learning rate,
    # and the data order depends on the step index only).
    rl_key = stage_key("rl", {**sft_inputs, "rl": config.model_dump(mode="json", exclude={"base_model", "steps"})})
    checkpoint, steps_file = (
        args.cache / f"{rl_key.replace(':', '-')}.ckpt",
        args.cache / f"{rl_key.replace(':', '-')}.json",
    )
    history: list[dict[str, Any]] = []
    log(f"RL state after each step: {checkpoint} and {steps_file.name}")
    if args.reuse and checkpoint.exists() and steps_file.exists():
        learner.load_checkpoint(checkpoint.read_bytes())
        history = json.loads(steps_file.read_text())
        if len(history) > config.steps:
            raise SystemExit(f"--steps {config.steps}: the RL run in {checkpoint} has already trained {len(history)}")
        log(f"RL: resumed after step {len(history)} from {checkpoint}")
    rollout = worker_for(sft_path, config.sampling.temperature)
    receiver = WeightSyncReceiver()
    blob, _ = learner.weight_update()
    rollout.backend.load_state_dict(receiver.receive(blob), learner.version)
    for step in range(len(history), config.steps):
        order = data_order(len(train), config.seed, step, config.prompts_per_step)
        result = rollout.rollout(
            [train[i] for i in order], group_size=config.group_size, seed=step, id_prefix=f"s{step}-"
        )
        metrics = learner.train_step(result.samples)
        blob, _ = learner.weight_update()
        if blob is not None:
            rollout.backend.load_state_dict(receiver.receive(blob), learner.version)
        episodes = [s.episode_metrics for s in result.samples]
        entry = {
            "step": step + 1,
            "tasks": [train[i]["id"] for i in order],
            "rewards": [round(s.reward, 4) for s in result.samples],
            "sampled_tokens": result.sampled_tokens,
            "generation_seconds": round(result.generation_seconds, 1),
            "load_average": load_average(),
            **{k: round(v, 6) for k, v in metrics.items()},
            **{
                f"env/{name}": round(statistics.fmean(e.get(name, 0.0) for e in episodes), 4)
                for name in ("resolved", "tests_passed", "turns", "tool_calls", "malformed_tool_calls", "summaries")
            },
            # The signal this step had to learn from: groups whose samples differ, and the spread inside them.
            **group_signal(result.samples),
        }
        history.append(entry)
        if not args.quick:
            checkpoint.write_bytes(learner.checkpoint_bytes(data_position=step + 1))
            steps_file.write_text(json.dumps(history))
        log(
            f"step {step + 1}/{config.steps}: reward {metrics['reward_mean']:.3f} (std {metrics['reward_std']:.3f}), "
            f"resolved {entry['env/resolved']:.2f}, tests passed {entry['env/tests_passed']:.2f}, "
            f"{result.sampled_tokens} sampled tokens, {entry['env/summaries']:.1f} summaries, dropped groups "
            f"{metrics['dropped_groups']:.0f} (with signal {entry['signal/groups_with_signal']}/"
            f"{entry['signal/groups']}, within-group std {entry['signal/within_group_reward_std']:.3f}, clip "
            f"{metrics.get('clip_fraction', 0.0):.3f}), kl {metrics.get('kl', 0.0):.4f}, "
            f"{result.generation_seconds:.0f}s gen, {metrics['train_seconds']:.0f}s train"
        )
    end_phase("rl", phase)
    figures["rl"] = {
        "history": history,
        "config": config.model_dump(mode="json"),
        "loss": {
            "algorithm": settings.loss.algorithm,
            "kl_coef": settings.loss.kl_coef,
            "kl_estimator": settings.loss.kl_estimator,
            "kl_placement": settings.loss.kl_placement,
            "max_completion_length": settings.loss.max_completion_length,
            "scale_rewards": settings.scale_rewards,
            "drop_equal_groups": settings.drop_equal_groups,
        },
    }
    del learner
    phase = time.perf_counter()
    evals["rl"] = evaluate(rollout, test, "rl", args.eval_batch)
    end_phase("eval_rl", phase)

    # 5. Paired comparisons.
    pairs = (("sft_vs_base", "sft", "base"), ("rl_vs_base", "rl", "base"), ("rl_vs_sft", "rl", "sft"))
    figures["comparisons"] = {
        metric: {name: paired(evals[after], evals[before], metric) for name, after, before in pairs}
        for metric in ("resolved", "tests_passed")
    }
    figures["means"] = {name: evals[name]["summary"] for name in MODELS}
    # Self-summarisation (Composer 2's C3): do the episodes that summarised gain too? Per model, its held-out
    # episodes with at least one summary and how many of them resolved their task.
    figures["summarised_episodes"] = {
        name: {
            "episodes": sum(1 for r in evals[name]["tasks"].values() if r["summaries"]),
            "resolved": sum(1 for r in evals[name]["tasks"].values() if r["summaries"] and r["resolved"]),
        }
        for name in MODELS
    }
    figures["per_task"] = {
        task_id: {
            "family": next(r["family"] for r in test if r["id"] == task_id),
            **{name: evals[name]["tasks"][task_id] for name in MODELS},
        }
        for task_id in sorted(evals["base"]["tasks"])
    }
    figures["seconds"] = round(time.perf_counter() - started)
    figures["load_average_end"] = load_average()
    text = summary_text(figures)
    print()
    print(text)
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
        args.out.with_suffix(".txt").write_text(text)
        log(f"wrote {args.out} and {args.out.with_suffix('.txt')}")


def summary_text(figures: dict[str, Any]) -> str:
    tasks, sft, means = figures["tasks"], figures["sft"], figures["means"]
    lines = [
        "Coding-agent learning check (bench/coding_learning_check.py)",
        f"command: {figures['command']}",
        f"model: {figures['model']}; env {json.dumps(figures['env_params'])}; max_new_tokens "
        f"{figures['max_new_tokens']}",
        f"tasks: {tasks['generated']} generated ({tasks['train']} train, {tasks['held_out']} held out); "
        f"held-out families {tasks['families']['test']}",
        f"SFT filter: {sft['filter']['kept']} of {sft['filter']['generated']} teacher episodes kept, dropped "
        f"{sft['filter']['dropped']}; loss per epoch {[round(x, 3) for x in sft['loss_per_epoch']]}",
        "",
        f"{'held out':<24} {'base':>8} {'SFT':>8} {'SFT+RL':>8}",
    ]
    for key, label in (("pass@1", "pass@1"), ("tests_passed", "hidden-test fraction"), ("reward", "reward")):
        lines.append(f"{label:<24} " + " ".join(f"{means[m][key]:8.3f}" for m in MODELS))
    for key, label in (("tool_calls", "tool calls / episode"), ("malformed_tool_calls", "malformed / episode")):
        lines.append(f"{label:<24} " + " ".join(f"{means[m][key]:8.2f}" for m in MODELS))
    lines.append(
        f"{'episodes with an edit':<24} " + " ".join(f"{means[m]['episodes_with_an_edit']:8d}" for m in MODELS)
    )
    lines.append("")
    lines.append(
        f"{'paired':<26} {'before':>7} {'after':>7} {'diff':>7} {'95% CI':>17} {'+/-':>5} {'W p':>7} {'sign p':>7}"
    )
    for metric, comparisons in figures["comparisons"].items():
        for name, c in comparisons.items():
            ci = f"[{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"
            lines.append(
                f"{metric + ' ' + name:<26} {c['before']:7.3f} {c['after']:7.3f} {c['difference']:+7.3f} {ci:>17} "
                f"{c['improved']:>2}/{c['worse']:<2} {c['wilcoxon_p']:7.3f} {c['sign_test_p']:7.3f}"
            )
    lines.append("")
    lines.append(
        "RL steps: "
        + "; ".join(
            f"{h['step']}: reward {h['reward_mean']:.3f}, resolved {h['env/resolved']:.2f}, groups with signal "
            f"{h.get('signal/groups_with_signal', '?')}/{h.get('signal/groups', '?')}"
            for h in figures["rl"]["history"]
        )
    )
    lines.append(
        "held-out episodes that summarised (resolved / all): "
        + "; ".join(f"{m} {v['resolved']}/{v['episodes']}" for m, v in figures["summarised_episodes"].items())
    )
    lines.append(f"phases (s): {figures['phases']}; total {figures['seconds']} s")
    lines.append(f"load average: start {figures['load_average_start']}, end {figures['load_average_end']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
