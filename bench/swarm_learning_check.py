"""Learning check for Kimi's agent swarm on a CPU: SFT warm-up on the scripted orchestrator, then PARL with Kimi's
loss, on wide tasks over the Python standard-library docs; and a single agent beside the swarm, same model.

    .venv/bin/python bench/swarm_learning_check.py            # SmolLM2: hours (--tasks 45 --steps 6: over one)
    .venv/bin/python bench/swarm_learning_check.py --quick    # a smoke run with the tiny test model

Everything is the project's own code in one process (no Ray, no control plane; sub-agents run on threads), so the
numbers come from the same environment, reward, SFT, learner and rollout code a run uses:
1. corpus: `workers.search.stdlib_corpus`, BM25 index (no dense part: embedding 5,300 chunks takes minutes on 2
   cores); tasks: `workers.search.wide` (listed items, columns document and kind), split by task id hash into train
   and held-out;
2. SFT warm-up, twice from SmolLM2-135M-Instruct: on the scripted orchestrator's swarm episodes (one lookup sub-agent
   per item, in parallel) and on its single-agent episodes (one search per item), each trajectory kept when its
   item-F1 is 1; both evaluated greedily on the held-out tasks (item-F1, critical steps, wall-clock per episode);
3. PARL from the swarm SFT model on the train tasks: `parl_spec` (item-F1 + λ1 r_parallel + λ2 r_finish, λ annealed
   to 0 over the steps), algorithm `kimi` (K3); evaluated the same way. The finish rate and λ are logged per step.
Paired per held-out task: item-F1 and critical steps of PARL vs SFT and of swarm vs single, with a paired bootstrap
95% interval of the difference, a Wilcoxon signed-rank test and a sign test. Results: bench/results/.

Serial collapse and the ablations (issue 37): `--start single` trains PARL from the single-agent SFT model given the
swarm tools (it never assigns a sub-agent); `--lambda1 0` / `--lambda2 0` drop r_parallel / r_finish. Each run is
kept under its `--variant` name in the JSON beside the others (the warm-ups and their evaluations are reused from
the --reuse folder), with sub-agents per task, the share of episodes that spawned any, parallelism, finish rate,
critical steps and item-F1 per step and held out:

    .venv/bin/python bench/swarm_learning_check.py --start single --reuse DIR                 # PARL
    .venv/bin/python bench/swarm_learning_check.py --start single --lambda1 0 --reuse DIR     # the ablation
    .venv/bin/python bench/swarm_learning_check.py --start swarm --lambda2 0 --reuse DIR      # spurious parallelism

A warm-up on single-agent episodes alone (`--start single`) assigns no sub-agent on held-out tasks, and one on 6
swarm episodes beside 24 single-agent ones assigned none even at temperature 1 in PARL's 16 training samples
(bench/results/swarm_parl_serial-attempt1.txt), so PARL has no parallel episode to reward. `--start mixed
--mixed-swarm N` warms up on a single-agent episode per train task plus swarm episodes on the first N of them; N
sets how often the orchestrator spawns (on 24 train tasks: 6 never did, 12 spawned on 14 of 15 held-out tasks
when greedy and in 10 of 16 samples at temperature 1; docs). `--skip-single` leaves out the other warm-ups.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from search_learning_check import held_out, log, paired  # noqa: E402  (the same split, log and paired tests)

from workers.models import make_backend  # noqa: E402
from workers.models.registry import SMOLLM2, TINY_LLAMA, resolve_base_model  # noqa: E402
from workers.rewards.schema import parl_spec  # noqa: E402
from workers.rl.config import TrainConfig  # noqa: E402
from workers.rl.config_sections import LoraConfig  # noqa: E402
from workers.rl.learner import Learner  # noqa: E402
from workers.rl.rollout import RolloutWorker  # noqa: E402
from workers.rl.weightsync import WeightSyncReceiver  # noqa: E402
from workers.search.corpus import build_corpus  # noqa: E402
from workers.search.index import IndexConfig, SearchIndex  # noqa: E402
from workers.search.index_store import save_index  # noqa: E402
from workers.search.metrics import mean_metrics  # noqa: E402
from workers.search.stdlib_corpus import stdlib_documents  # noqa: E402
from workers.search.wide import WideParams, synthesize_wide  # noqa: E402

ENV = {
    "token_budget": 4096,
    "reserve_tokens": 256,
    "result_budget": 400,
    "top_k": 3,
    "subagent_max_steps": 5,
    "subagent_runner": "threads",
}


def evaluate(worker: RolloutWorker, tasks: list[dict[str, Any]], label: str, batch: int = 1) -> list[dict[str, float]]:
    """One greedy episode per task; each row holds the episode's metrics and its wall-clock seconds. With `batch` >
    1 the episodes of `batch` tasks are generated together (several times faster on a CPU) and each row's seconds
    are its batch's divided by the batch's size, so they compare only between evaluations of the same batch."""
    out: list[dict[str, float]] = []
    started = time.perf_counter()
    for at in range(0, len(tasks), batch):
        began = time.perf_counter()
        chunk = tasks[at : at + batch]
        samples = worker.rollout(chunk, group_size=1, seed=0, id_prefix=f"eval-{label}-").samples
        by_task = {sample.task_id: sample for sample in samples}
        seconds = (time.perf_counter() - began) / len(chunk)
        out.extend({**by_task[task["id"]].episode_metrics, "seconds": seconds} for task in chunk)
    means = mean_metrics(out)
    log(
        f"{label}: item-F1 {means.get('item_f1', 0):.3f}, critical steps {means.get('critical_steps', 0):.2f}, "
        f"sub-agents {means.get('subagents', 0):.2f}, {means['seconds']:.1f} s per episode "
        f"({time.perf_counter() - started:.0f}s)"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model, few tasks: checks the script runs")
    parser.add_argument("--tasks", type=int, default=90, help="wide tasks to generate (train + held-out)")
    parser.add_argument("--steps", type=int, default=12, help="PARL steps")
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--sft-epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=2e-6, help="PARL learning rate")
    parser.add_argument(
        "--lora", type=int, default=0, help="PARL with LoRA adapters of this rank (0: full parameters, the default)"
    )
    parser.add_argument("--sft-lr", type=float, default=5e-5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--eval-batch",
        type=int,
        default=1,
        help="held-out episodes generated together (1: one at a time, so each has its own wall-clock)",
    )
    parser.add_argument(
        "--reuse", default="", help="a work folder of an earlier run: reuse its index and SFT models when present"
    )
    parser.add_argument("--skip-single", action="store_true", help="leave out the single-agent side (PARL vs SFT only)")
    parser.add_argument("--train-tasks", type=int, default=0, help="at most this many train tasks (0: all)")
    parser.add_argument("--min-rows", type=int, default=6, help="items per wide task, at least")
    parser.add_argument("--max-rows", type=int, default=8, help="items per wide task, at most")
    parser.add_argument("--max-parallel", type=int, default=8, help="assign_task calls per reply (environment)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="per orchestrator reply")
    parser.add_argument(
        "--start",
        choices=["swarm", "single", "mixed"],
        default="swarm",
        help="the policy PARL trains from: the swarm SFT model, or the single-agent SFT model given the swarm tools "
        "(serial collapse: it never assigns sub-agents, the failure PARL's r_parallel exists for), or a warm-up on "
        "single-agent episodes plus --mixed-swarm swarm episodes (how often it spawns depends on that number)",
    )
    parser.add_argument(
        "--mixed-swarm",
        type=int,
        default=4,
        help="--start mixed: swarm episodes in the warm-up, beside a single-agent episode per train task",
    )
    parser.add_argument("--lambda1", type=float, default=0.1, help="λ1, r_parallel's weight (0: the ablation)")
    parser.add_argument("--lambda2", type=float, default=0.1, help="λ2, r_finish's weight (0: the ablation)")
    parser.add_argument(
        "--variant",
        default="",
        help="the name this PARL run's results are kept under in the JSON (default: start-l1-l2); runs of other "
        "variants in the same --out are kept, so the ablations add up in one file",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "swarm_learning_check.json"))
    args = parser.parse_args()
    args.variant = args.variant or f"{args.start}-l1={args.lambda1:g}-l2={args.lambda2:g}"
    model = TINY_LLAMA if args.quick else SMOLLM2
    if args.quick:
        args.tasks, args.steps, args.prompts_per_step, args.group_size, args.sft_epochs = 9, 2, 2, 2, 1
        args.min_rows, args.max_rows = 3, 3
    # a single agent needs one search per item and a last turn for the table: the turn limit must not decide the
    # comparison, so it is the item count plus slack
    env = {**ENV, "max_parallel": args.max_parallel, "max_turns": args.max_rows + 3}
    import torch

    torch.set_num_threads(args.threads)
    random.seed(0)
    started = time.perf_counter()
    figures: dict[str, Any] = {"command": " ".join(sys.argv), "model": model, "env_params": env}

    chunks, _ = build_corpus(stdlib_documents())
    work = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="crucible-swarm-check-"))
    index_uri = f"file://{work}/index"
    if not (work / "index").exists():
        save_index(SearchIndex.build(chunks, IndexConfig(dense=False)), index_uri)
    log(f"work folder {work}")
    env_params = {**env, "index_uri": index_uri}
    made = synthesize_wide(
        chunks,
        WideParams(num_tasks=args.tasks, min_rows=args.min_rows, max_rows=args.max_rows, columns=["document", "kind"]),
    )
    train = [t for t in made.tasks if not held_out(t["id"])]
    test = [t for t in made.tasks if held_out(t["id"])]
    if args.train_tasks:
        train = train[: args.train_tasks]
    log(f"{len(chunks)} chunks; {len(made.tasks)} wide tasks: {len(train)} train, {len(test)} held out")
    figures.update({"chunks": len(chunks), "train_tasks": len(train), "held_out_tasks": len(test)})
    reward = parl_spec(lambda_parallel=args.lambda1, lambda_finish=args.lambda2, anneal_steps=args.steps).model_dump(
        mode="json"
    )
    # The warm-ups and their evaluations do not depend on the λs: kept in the work folder for the next variant.
    stored_path = work / "evaluations.json"
    stored: dict[str, Any] = json.loads(stored_path.read_text()) if stored_path.exists() else {}
    if Path(args.out).exists() and not args.quick:  # other variants' results stay in the file
        earlier = json.loads(Path(args.out).read_text())
        figures["variants"] = earlier.get("variants", {})
    eval_env = {**env_params, "training": False}

    def worker_for(path: str, temperature: float, params: dict[str, Any]) -> RolloutWorker:
        return RolloutWorker(
            make_backend("transformers", path, threads=args.threads),
            environment="swarm",
            env_params=params,
            reward=reward,
            temperature=temperature,
            max_new_tokens=args.max_new_tokens,
            max_context_tokens=8192,
        )

    base_path = str(resolve_base_model(model))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.rl.config_sections import SFTConfig
    from workers.rl.sft import fine_tune, generate

    def warm_up(mode: str) -> str:
        """SFT on the scripted orchestrator's episodes of `mode`, kept when item-F1 is 1 (or the model an earlier
        run of the same command left in the work folder)."""
        if (work / f"sft-{mode}" / "config.json").exists():
            log(f"SFT ({mode}): reusing {work / f'sft-{mode}'}")
            figures.setdefault("sft", {})[mode] = {"reused": str(work / f"sft-{mode}")}
            return str(work / f"sft-{mode}")
        from workers.rl.teacher import teacher_rollout, the_same_agent
        from workers.swarm.scripted import Mode, ScriptedOrchestrator

        config = SFTConfig(
            teacher_model="scripted-swarm",
            base_model=base_path,
            environment="swarm",
            env_params=env_params,
            rollouts_per_task=1,
            epochs=args.sft_epochs,
            learning_rate=args.sft_lr,
            max_tokens_per_pack=4096,
        )
        tokenizer = AutoTokenizer.from_pretrained(base_path, local_files_only=True)
        from workers.models.base import encode_chat

        def scripted(agent_mode: Mode, rows: list[dict[str, Any]]) -> list[Any]:
            return teacher_rollout(
                the_same_agent(ScriptedOrchestrator(agent_mode, max_parallel=env_params["max_parallel"])),
                tokenizer,
                lambda messages: encode_chat(tokenizer, messages),
                rows,
                environment="swarm",
                env_params=env_params,
                reward=reward,
            )

        if mode == "swarm":
            samples = generate(config, train, reward)
        elif mode == "single":
            samples = scripted("single", train)
        else:  # mixed<N>: single-agent episodes on every train task, swarm episodes on the first N of them
            samples = scripted("single", train) + scripted("swarm", train[: args.mixed_swarm])
        kept = [s for s in samples if s.terms.get("item_f1", 0.0) >= 1.0]
        student: Any = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, local_files_only=True)
        losses = fine_tune(student, kept, config)
        path = str(work / f"sft-{mode}")
        student.save_pretrained(path)
        tokenizer.save_pretrained(path)
        log(f"SFT ({mode}) on {len(kept)} of {len(samples)} teacher episodes: loss {[round(x, 3) for x in losses]}")
        figures.setdefault("sft", {})[mode] = {"kept": len(kept), "generated": len(samples), "loss": losses}
        return path

    def save() -> None:  # after every stage, so a stopped run keeps what it measured
        if not args.quick:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(figures, indent=2))

    def evaluated(label: str, path: str) -> list[dict[str, float]]:
        batched = {"batch": args.eval_batch} if args.eval_batch > 1 else {}  # padding can move a greedy path
        key = json.dumps({"label": label, "tasks": [t["id"] for t in test], "env": env, **batched}, sort_keys=True)
        if key not in stored:
            stored[key] = evaluate(worker_for(path, 0.0, eval_env), test, label, args.eval_batch)
            if not args.quick:
                stored_path.write_text(json.dumps(stored))
        else:
            log(f"{label}: evaluation reused from {stored_path}")
        rows: list[dict[str, float]] = stored[key]
        return rows

    figures.setdefault("eval", {})
    figures["comparisons"] = {}
    if args.start == "swarm" or not args.skip_single:
        swarm_sft = warm_up("swarm")
        sft_eval = evaluated("swarm SFT", swarm_sft)
        figures["eval"]["swarm_sft"] = sft_eval
        save()
    if not args.skip_single or args.start == "single":
        single_sft = warm_up("single")
        single_eval = evaluated("single-agent SFT", single_sft)
        figures["eval"]["single_sft"] = single_eval
        figures["comparisons"] = {
            "swarm_vs_single item_f1": paired(sft_eval, single_eval, "item_f1"),
            "swarm_vs_single critical_steps": paired(sft_eval, single_eval, "critical_steps"),
            "swarm_vs_single seconds": paired(sft_eval, single_eval, "seconds"),
        }
        save()

    if args.start == "mixed":
        start_path = warm_up(f"mixed{args.mixed_swarm}")  # its own folder per N: --reuse never mixes them up
        start_eval = evaluated(f"mixed SFT ({args.mixed_swarm} swarm episodes)", start_path)
        figures["eval"]["mixed_sft"] = start_eval
        save()
    elif args.start == "single":
        start_path, start_eval = single_sft, single_eval
    else:
        start_path, start_eval = swarm_sft, sft_eval
    config = TrainConfig(
        base_model=start_path,
        environment="swarm",
        env_params=env_params,
        algorithm="kimi",
        learning_rate=args.lr,
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_tokens_per_pack=8192,
        # Swarm episodes fill 8192-token packs: without checkpointing the learner needs ~28 GB on SmolLM2 by
        # estimate_memory_gb (a PARL step was OOM-killed at 24 GB on this 24 GB machine); with it, ~16 GB.
        gradient_checkpointing=True,
        lora=LoraConfig(rank=args.lora, alpha=2 * args.lora) if args.lora else None,
        sampling={"temperature": 1.0, "max_new_tokens": args.max_new_tokens},
    )
    from workers.rl.config import estimate_memory_gb, shape_from_hf_config

    memory = estimate_memory_gb(config, shape_from_hf_config(json.loads(Path(start_path, "config.json").read_text())))
    log(f"PARL ({args.variant}) from {start_path}; learner memory estimate: {memory}")
    learner = Learner(start_path, config, threads=args.threads)
    rollout = worker_for(start_path, 1.0, env_params)
    receiver = WeightSyncReceiver()
    blob, _ = learner.weight_update()
    receiver.receive(blob)
    from workers.rewards.schema import validate_reward_spec
    from workers.rewards.score import annealed_weights
    from workers.rl.steps import data_order

    spec = validate_reward_spec(reward)
    history = []
    for step in range(config.steps):
        order = data_order(len(train), config.seed, step, config.prompts_per_step)
        result = rollout.rollout(
            [train[i] for i in order], group_size=config.group_size, seed=step, id_prefix=f"s{step}-", step=step
        )
        metrics = learner.train_step(result.samples)
        blob, _ = learner.weight_update()
        if blob is not None:
            rollout.backend.load_state_dict(receiver.receive(blob), learner.version)
        env_means = mean_metrics(s.episode_metrics for s in result.samples)
        signal = {k: metrics[k] for k in ("reward_std", "signal_groups", "groups", "clip_fraction") if k in metrics}
        row = {"step": step + 1, "reward_mean": metrics["reward_mean"], **signal, **env_means}
        row.update(annealed_weights(spec, step))
        history.append(row)
        figures["rl"] = {"history": history}
        save()
        log(
            f"step {step + 1}/{config.steps}: reward {metrics['reward_mean']:.3f}, item-F1 "
            f"{env_means.get('item_f1', 0):.3f}, finish rate {env_means.get('finish_rate', float('nan')):.2f}, "
            f"critical steps {env_means.get('critical_steps', 0):.2f}, sub-agents {env_means.get('subagents', 0):.2f}, "
            f"spawned {env_means.get('spawned', 0):.2f}, λ1 "
            f"{row.get('reward/lambda/parallel_instantiation', 0):.3f} ({result.generation_seconds:.0f}s gen, "
            f"{metrics['train_seconds']:.0f}s train)"
        )
    figures["rl"] = {"history": history, "config": config.model_dump(mode="json")}
    rollout.temperature = 0.0
    rollout.env_params = eval_env
    rl_eval = evaluate(rollout, test, "PARL", args.eval_batch)

    figures["eval"]["parl"] = rl_eval
    versus = {
        f"parl_vs_start {metric}": paired(rl_eval, start_eval, metric)
        for metric in ("item_f1", "critical_steps", "subagents", "spawned", "parallelism")
        if all(metric in row for row in rl_eval + start_eval)
    }
    figures["comparisons"].update(versus)
    figures.setdefault("variants", {})[args.variant] = {
        "start": args.start,
        "lambda1": args.lambda1,
        "lambda2": args.lambda2,
        "command": figures["command"],
        "history": history,
        "start_means": mean_metrics(start_eval),
        "parl_means": mean_metrics(rl_eval),
        "comparisons": versus,
    }
    figures["means"] = {name: mean_metrics(rows) for name, rows in figures["eval"].items()}
    figures["seconds"] = round(time.perf_counter() - started)
    print()
    print(f"{'held-out, paired':<34} {'before':>8} {'after':>8} {'diff':>8} {'95% CI':>19} {'W p':>8} {'sign p':>8}")
    for name, c in figures["comparisons"].items():
        ci = f"[{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"
        print(
            f"{name:<34} {c['before']:8.3f} {c['after']:8.3f} {c['difference']:+8.3f} {ci:>19} "
            f"{c['wilcoxon_p']:8.4f} {c['sign_test_p']:8.4f}"
        )
    save()
    if not args.quick:
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
