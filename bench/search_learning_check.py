"""Learning check for the Context-1 recipe on a CPU: SFT warm-up, then CISPO, on the demo search tasks.

    .venv/bin/python bench/search_learning_check.py            # docs/recipe-learning-checks.md's figures (hours)
    .venv/bin/python bench/search_learning_check.py --quick    # a smoke run with the tiny test model

Everything is the project's own code, in one process (no Ray, no control plane), so the numbers come from the
same harness, reward, filter, learner and rollout code a run uses:
1. corpus: the built-in Python docs (`workers.search.stdlib_corpus`), chunked and indexed (BM25 + MiniLM, RRF,
   rerank); tasks: the template generator, split by task id hash into train and held-out;
2. base: SmolLM2-135M-Instruct evaluated greedily on the held-out tasks (one episode per task);
3. SFT warm-up: the scripted search teacher's trajectories on the train tasks, rejection-filtered
   (`workers.search.rejection`), fine-tune the base model on them; evaluate;
4. RL: CISPO with LoRA from the SFT model on the train tasks (Context-1 reward, F-beta anneal), once per
   --seeds (same SFT model, other draws and samples); evaluate.
Held out twice: tasks of the training corpus that neither SFT nor RL saw, and tasks of --eval-corpora, corpora
that neither saw at all (those of `bench/retrieval_eval.py`'s evaluation split: reStructuredText and Python
source, indexed with the same defaults). Each evaluation is paired per held-out task; the script prints the mean
output recall with a paired bootstrap 95% interval of the difference, a Wilcoxon signed-rank test and a sign
test (RL seeds pooled per task by their mean, and each seed alone), and writes bench/results/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scipy import stats  # noqa: E402

from workers.models import make_backend  # noqa: E402
from workers.models.registry import SMOLLM2, TINY_LLAMA, resolve_base_model  # noqa: E402
from workers.rewards.schema import context1_spec  # noqa: E402
from workers.rl.config import TrainConfig  # noqa: E402
from workers.rl.learner import Learner  # noqa: E402
from workers.rl.rollout import RolloutWorker  # noqa: E402
from workers.rl.sampling import Curriculum  # noqa: E402
from workers.rl.weightsync import WeightSyncReceiver  # noqa: E402
from workers.search import synth, synth_steps  # noqa: E402
from workers.search.corpus import build_corpus  # noqa: E402
from workers.search.index import IndexConfig, SearchIndex  # noqa: E402
from workers.search.index_store import save_index  # noqa: E402
from workers.search.metrics import mean_metrics  # noqa: E402
from workers.search.rejection import select_trajectories  # noqa: E402
from workers.search.stdlib_corpus import stdlib_documents  # noqa: E402

ENV = {
    "token_budget": 3072,
    "reserve_tokens": 256,
    "result_budget": 320,
    "top_k": 3,
    "max_turns": 3,
    "max_calls_per_turn": 3,
    "max_output_docs": 5,
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def held_out(task_id: str) -> bool:
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 3 == 0


def evaluate(worker: RolloutWorker, tasks: list[dict[str, Any]], label: str) -> list[dict[str, float]]:
    """One greedy episode per task, in the evaluation harness (no soft-threshold message)."""
    started = time.perf_counter()
    out: list[dict[str, float]] = []
    for at in range(0, len(tasks), 16):
        result = worker.rollout(tasks[at : at + 16], group_size=1, seed=0, id_prefix=f"eval-{label}-")
        out += [s.episode_metrics for s in result.samples]
    means = mean_metrics(out)
    log(
        f"{label}: output recall {means['output_recall']:.3f}, final answer found {means['final_answer_found']:.3f}, "
        f"trajectory recall {means['trajectory_recall']:.3f} ({time.perf_counter() - started:.0f}s)"
    )
    return out


def paired(after: list[dict[str, float]], before: list[dict[str, float]], metric: str = "output_recall") -> dict:
    a = np.array([row[metric] for row in after])
    b = np.array([row[metric] for row in before])
    diff = a - b
    rng = np.random.default_rng(0)
    boots = [diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(10_000)]
    nonzero = diff[diff != 0]
    wilcoxon_p = float(stats.wilcoxon(a, b, zero_method="pratt").pvalue) if len(nonzero) else 1.0
    sign_p = float(stats.binomtest(int((nonzero > 0).sum()), len(nonzero), 0.5).pvalue) if len(nonzero) else 1.0
    return {
        "metric": metric,
        "tasks": len(diff),
        "before": float(b.mean()),
        "after": float(a.mean()),
        "difference": float(diff.mean()),
        "ci95": [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))],
        "improved": int((diff > 0).sum()),
        "worse": int((diff < 0).sum()),
        "wilcoxon_p": wilcoxon_p,
        "sign_test_p": sign_p,
    }


def unseen_corpus(name: str, tasks: int, work: Path, dense: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A corpus from the retrieval harness's evaluation split, indexed with the defaults; its verified tasks."""
    sys.path.insert(0, str(ROOT / "bench"))
    from retrieval_eval import documents

    cache = Path.home() / ".cache" / "crucible" / "retrieval-bench"
    cache.mkdir(parents=True, exist_ok=True)
    chunks, _ = build_corpus(documents(name, cache), source=name)
    index_uri = f"file://{work}/index-{name}"
    if not (work / f"index-{name}").exists():  # built once per work directory (--reuse keeps it)
        save_index(SearchIndex.build(chunks, IndexConfig(dense=dense)), index_uri)
    corpus = synth.SynthCorpus(chunks)
    made = synth.synthesize(
        corpus, synth.SynthParams(num_tasks=tasks, max_hops=2, seed=0), synth_steps.TemplateGenerator(corpus)
    )
    log(f"{name}: {len(chunks)} chunks indexed, {len(made.tasks)} tasks")
    return {**ENV, "index_uri": index_uri, "training": False}, made.tasks


def pooled(per_seed: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Per task, the mean of each metric over the RL seeds (one paired row per task)."""
    return [
        {k: float(np.mean([rows[i][k] for rows in per_seed])) for k in per_seed[0][i]} for i in range(len(per_seed[0]))
    ]


def sft_warm_up(
    sft_config: Any,
    train: list[dict[str, Any]],
    reward: dict[str, Any],
    base_path: str,
    sft_path: str,
    examples: int = 0,
) -> dict[str, Any]:
    """The scripted teacher's trajectories on the train tasks, rejection-filtered; the base model fine-tuned on
    them (a seeded draw of `examples` kept ones when it is above 0: a lighter warm-up) and saved to `sft_path`. Returns
    the filter report and the losses."""
    import torch

    from workers.rl.sft import fine_tune, generate

    teacher_samples = generate(sft_config, train, reward)
    selected = select_trajectories([s.trajectory for s in teacher_samples], sft_config.filter)
    report = selected.report(len(teacher_samples))
    report["teacher_metrics"] = mean_metrics(s.episode_metrics for s in teacher_samples)
    log(f"teacher: {report}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    student: Any = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, local_files_only=True)
    sft_started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if done % 10 == 0 or done == total:
            log(f"SFT: {done}/{total} packs ({time.perf_counter() - sft_started:.0f}s)")

    kept = selected.kept
    if 0 < examples < len(kept):  # a seeded draw, so both hop counts stay in it
        kept = sorted(random.Random(0).sample(list(kept), examples))
    losses = fine_tune(student, [teacher_samples[i] for i in kept], sft_config, progress)
    student.save_pretrained(sft_path)
    AutoTokenizer.from_pretrained(base_path, local_files_only=True).save_pretrained(sft_path)
    del student
    log(f"SFT on {len(kept)} trajectories: loss {losses} ({time.perf_counter() - sft_started:.0f}s)")
    return {"filter": report, "loss": losses, "trained_on": len(kept)}


def chart_path(results: Path) -> Path:
    """The signal chart of a results file goes where the docs site shows it: docs/figures/<results name>.svg."""
    return ROOT / "docs" / "figures" / results.with_suffix(".svg").name


def signal_chart(runs: list[dict[str, Any]], path: Path) -> None:
    """An SVG of what each RL step had to learn from (per seed): groups dropped for equal rewards out of the step's
    groups, the mean |advantage| of the kept samples, and the training episodes' output recall. No plotting library:
    bars and polylines written by hand, so the docs can show it."""
    rows = [
        ("groups dropped (equal rewards)", "dropped_groups"),
        ("mean |advantage|", "advantage_abs_mean"),
        ("output recall (training episodes)", "output_recall"),
    ]
    width, row_h, left = 640, 90, 200
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{row_h * len(rows) + 30}" '
        'font-family="sans-serif" font-size="11">'
    ]
    colors = ["#2563eb", "#dc2626", "#16a34a"]
    for r, (label, key) in enumerate(rows):
        top = 10 + r * row_h
        top_value = 1.0
        out.append(f'<text x="4" y="{top + 40}">{label}</text>')
        out.append(f'<line x1="{left}" y1="{top + 70}" x2="{width - 10}" y2="{top + 70}" stroke="#999"/>')
        for s_i, run in enumerate(runs):
            history = run["history"]
            steps = len(history)
            span = (width - 10 - left) / max(steps, 1)
            top_value = max(max(float(h.get("groups", 1)) for h in history), 1.0) if key == "dropped_groups" else 1.0
            points = []
            for i, h in enumerate(history):
                x = left + i * span + span / 2
                y = top + 70 - 60 * float(h.get(key, 0.0)) / top_value
                if key == "dropped_groups":
                    bar = span / (len(runs) + 1)
                    x0 = left + i * span + s_i * bar + bar / 2
                    out.append(
                        f'<rect x="{x0:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{top + 70 - y:.1f}" '
                        f'fill="{colors[s_i % 3]}" opacity="0.7"><title>step {h["step"]}: '
                        f"{h.get(key, 0):.0f} of {h.get('groups', 0):.0f}</title></rect>"
                    )
                else:
                    points.append(f"{x:.1f},{y:.1f}")
            if points:
                out.append(
                    f'<polyline fill="none" stroke="{colors[s_i % 3]}" stroke-width="1.5" points="{" ".join(points)}"/>'
                )
        scale = top_value if key == "dropped_groups" else 1.0
        out.append(f'<text x="{left - 4}" y="{top + 14}" text-anchor="end">{scale:g}</text>')
        out.append(f'<text x="{left - 4}" y="{top + 72}" text-anchor="end">0</text>')
    steps = len(runs[0]["history"]) if runs else 0
    out.append(f'<text x="{left}" y="{row_h * len(rows) + 24}">step 1</text>')
    out.append(f'<text x="{width - 10}" y="{row_h * len(rows) + 24}" text-anchor="end">step {steps}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def summarise(
    figures: dict[str, Any],
    held: list[str],
    base_eval: dict[str, list[dict[str, float]]],
    sft_eval: dict[str, list[dict[str, float]]],
    rl_evals: list[dict[str, list[dict[str, float]]]],
) -> None:
    """Paired comparisons per held-out set (RL seeds pooled per task, and each seed alone), and the unseen
    corpora's tasks together."""
    figures["comparisons"] = {}
    figures["means"] = {}
    for name in held:
        rl_rows = pooled([e[name] for e in rl_evals])
        pairs = {"cispo_vs_sft": paired(rl_rows, sft_eval[name])}
        pairs.update({f"cispo_seed{s}_vs_sft": paired(e[name], sft_eval[name]) for s, e in enumerate(rl_evals)})
        if name in base_eval:
            pairs["sft_vs_base"] = paired(sft_eval[name], base_eval[name])
            pairs["cispo_vs_base"] = paired(rl_rows, base_eval[name])
        figures["comparisons"][name] = pairs
        figures["means"][name] = {"sft": mean_metrics(sft_eval[name]), "cispo": mean_metrics(rl_rows)}
        if name in base_eval:
            figures["means"][name]["base"] = mean_metrics(base_eval[name])
    unseen = [n for n in held if n != "in-domain"]
    if unseen:  # every unseen corpus's tasks in one paired test
        rl_all = [row for n in unseen for row in pooled([e[n] for e in rl_evals])]
        figures["comparisons"]["unseen corpora"] = {
            "cispo_vs_sft": paired(rl_all, [row for n in unseen for row in sft_eval[n]])
        }
    # every held-out task in one paired test: the fourth attempt's primary test, fixed before its run
    rl_every = [row for n in held for row in pooled([e[n] for e in rl_evals])]
    figures["comparisons"]["all held-out"] = {
        "cispo_vs_sft": paired(rl_every, [row for n in held for row in sft_eval[n]])
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model, few tasks: checks the script runs")
    parser.add_argument("--tasks", type=int, default=120, help="template tasks to generate (train + held-out)")
    parser.add_argument("--steps", type=int, default=10, help="CISPO steps")
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--sft-epochs", type=int, default=2)
    parser.add_argument(
        "--sft-examples", type=int, default=0, help="warm up on a seeded draw of N kept teacher trajectories (0: all)"
    )
    parser.add_argument("--lr", type=float, default=1e-4, help="CISPO learning rate (LoRA)")
    parser.add_argument("--sft-lr", type=float, default=5e-5, help="SFT warm-up learning rate (full parameters)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature of the RL rollouts (evaluation is greedy)"
    )
    parser.add_argument("--substeps", type=int, default=1, help="optimizer steps per batch (Context-1: 4)")
    parser.add_argument(
        "--curriculum", action="store_true", help="Context-1's easy -> hard draws by hop count (else the data order)"
    )
    parser.add_argument("--seeds", type=int, default=2, help="RL runs from the same SFT model, other seeds")
    parser.add_argument(
        "--eval-corpora",
        default="rst-celery,py-eval",
        help="unseen corpora to evaluate on (names of bench/retrieval_eval.py; empty: none)",
    )
    parser.add_argument("--eval-tasks", type=int, default=40, help="verified tasks per unseen corpus (at most)")
    parser.add_argument("--base-eval", action="store_true", help="also evaluate the base model on the unseen corpora")
    parser.add_argument(
        "--reuse",
        default="",
        help="the work directory of an earlier run with the same settings (printed at its start): its SFT model and "
        "its stored evaluations are reused instead of recomputed (SFT and greedy evaluation are deterministic)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=96,
        help="tokens the policy may sample per turn, in RL and evaluation (the scripted teacher's replies run to about "
        "150 tokens: at 96 a third of them cannot be reproduced)",
    )
    parser.add_argument(
        "--scale-rewards",
        choices=["group", "none"],
        default=None,
        help="divide advantages by the group std ('group', CISPO's default as Context-1 ran it) or not ('none')",
    )
    parser.add_argument("--skip-base", action="store_true", help="do not evaluate the base model")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "search_learning_check.json"))
    parser.add_argument("--chart-from", default="", help="only (re)draw the signal chart of a results file")
    args = parser.parse_args()
    if args.chart_from:
        signal_chart(json.loads(Path(args.chart_from).read_text())["rl"], chart_path(Path(args.chart_from)))
        return
    model = TINY_LLAMA if args.quick else SMOLLM2
    if args.quick:
        args.tasks, args.steps, args.prompts_per_step, args.group_size, args.sft_epochs = 12, 2, 2, 2, 1
        args.eval_tasks, args.seeds = min(args.eval_tasks, 4), min(args.seeds, 2)
    import torch

    torch.set_num_threads(args.threads)
    random.seed(0)
    started = time.perf_counter()
    figures: dict[str, Any] = {"command": " ".join(sys.argv), "model": model, "env_params": ENV}

    chunks, _ = build_corpus(stdlib_documents())
    work = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="crucible-learning-check-"))
    log(f"work directory {work}")
    stored_path = work / "evaluations.json"  # base and SFT evaluations, per held-out set, for --reuse
    stored: dict[str, Any] = json.loads(stored_path.read_text()) if stored_path.exists() else {}
    index_uri = f"file://{work}/index"
    if not (work / "index").exists():  # built once per work directory (--reuse keeps it)
        save_index(SearchIndex.build(chunks, IndexConfig(dense=not args.quick)), index_uri)
    env_params = {**ENV, "index_uri": index_uri}
    corpus = synth.SynthCorpus(chunks)
    made = synth.synthesize(
        corpus, synth.SynthParams(num_tasks=args.tasks, max_hops=2), synth_steps.TemplateGenerator(corpus)
    )
    train = [t for t in made.tasks if not held_out(t["id"])]
    test = [t for t in made.tasks if held_out(t["id"])]
    log(f"{len(chunks)} chunks indexed; {len(made.tasks)} tasks: {len(train)} train, {len(test)} held out")
    figures.update({"chunks": len(chunks), "train_tasks": len(train), "held_out_tasks": len(test)})
    # Held-out sets: "in-domain" (the training corpus's unseen tasks) and one per unseen corpus.
    held: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
        "in-domain": ({**env_params, "training": False}, test)
    }
    for name in [n for n in args.eval_corpora.split(",") if n]:
        held[name] = unseen_corpus(name, args.eval_tasks, work, dense=not args.quick)
    figures["held_out"] = {name: len(tasks) for name, (_, tasks) in held.items()}
    reward = context1_spec(beta=4.0).model_dump(mode="json")

    def evaluate_all(worker: RolloutWorker, label: str, sets: list[str]) -> dict[str, list[dict[str, float]]]:
        out = {}
        for name in sets:
            worker.env_params = held[name][0]
            out[name] = evaluate(worker, held[name][1], f"{label} {name}")
        return out

    def worker_for(path: str, temperature: float, params: dict[str, Any]) -> RolloutWorker:
        backend = make_backend("transformers", path, threads=args.threads)
        return RolloutWorker(
            backend,
            environment="search",
            env_params=params,
            reward=reward,
            temperature=temperature,
            max_new_tokens=args.max_new_tokens,
        )

    base_path = str(resolve_base_model(model))

    def evaluated(label: str, path: str, sets: list[str]) -> dict[str, list[dict[str, float]]]:
        cap = {} if args.max_new_tokens == 96 else {"max_new_tokens": args.max_new_tokens}
        key = json.dumps(
            {"label": label, "sets": {n: [t["id"] for t in held[n][1]] for n in sets}, **cap}, sort_keys=True
        )
        if key not in stored:
            stored[key] = evaluate_all(worker_for(path, 0.0, env_params), label, sets)
            stored_path.write_text(json.dumps(stored))
        else:
            log(f"{label}: evaluations reused from {stored_path}")
        result: dict[str, list[dict[str, float]]] = stored[key]
        return result

    base_eval = {} if args.skip_base else evaluated("base", base_path, list(held) if args.base_eval else ["in-domain"])

    # SFT warm-up from the scripted teacher.
    from workers.rl.config_sections import SFTConfig

    sft_config = SFTConfig(
        teacher_model="scripted-search",
        base_model=base_path,
        env_params=env_params,
        rollouts_per_task=1,
        epochs=args.sft_epochs,
        learning_rate=args.sft_lr,
        max_tokens_per_pack=4096,
    )
    sft_path = str(work / "sft")
    if args.reuse and (work / "sft" / "config.json").exists():
        log(f"SFT model reused from {sft_path}")
        figures["sft"] = {"reused": sft_path}
    else:
        figures["sft"] = sft_warm_up(sft_config, train, reward, base_path, sft_path, args.sft_examples)
    sft_eval = evaluated("sft", sft_path, list(held))
    rl_evals: list[dict[str, list[dict[str, float]]]] = []
    figures["rl"] = []
    for seed in range(args.seeds):
        settings = (
            "steps",
            "prompts_per_step",
            "group_size",
            "lr",
            "substeps",
            "curriculum",
            "sft_epochs",
            "sft_lr",
            "sft_examples",
            "temperature",
        )
        extra = {  # settings added later: in the key only when not their old value, so old keys still match
            k: getattr(args, k)
            for k, old in (("max_new_tokens", 96), ("scale_rewards", None))
            if getattr(args, k) != old
        }
        key = json.dumps(
            {
                "seed": seed,
                **{k: getattr(args, k) for k in settings},
                **extra,
                "sets": {n: len(t) for n, (_, t) in held.items()},
            },
            sort_keys=True,
        )
        if key not in stored:  # an RL seed's history and evaluations, kept for --reuse after an interruption
            state = work / f"rl-{hashlib.sha256(key.encode()).hexdigest()[:12]}"  # its steps so far, for --reuse
            history, config, rollout = rl_run(args, seed, sft_path, env_params, train, worker_for, state)
            rollout.temperature = 0.0
            evals = evaluate_all(rollout, f"cispo seed {seed}", list(held))
            del rollout
            stored[key] = {"history": history, "config": config.model_dump(mode="json"), "evals": evals}
            stored_path.write_text(json.dumps(stored))
        else:
            log(f"cispo seed {seed}: run and evaluations reused from {stored_path}")
        done = stored[key]
        figures["rl"].append({"seed": seed, "history": done["history"], "config": done["config"]})
        rl_evals.append(done["evals"])
        summarise(figures, list(held), base_eval, sft_eval, rl_evals)
        if not args.quick:  # a partial result survives an interrupted run
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({**figures, "partial": seed + 1 < args.seeds}, indent=2))
            signal_chart(figures["rl"], chart_path(Path(args.out)))

    figures["seconds"] = round(time.perf_counter() - started)
    print()
    print(
        f"{'held-out output recall':<40} {'before':>7} {'after':>7} {'diff':>7} {'95% CI':>17} {'W p':>8} {'sign p':>8}"
    )
    for name, pairs in figures["comparisons"].items():
        for label, c in pairs.items():
            ci = f"[{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"
            print(
                f"{name + ' ' + label:<40} {c['before']:7.3f} {c['after']:7.3f} {c['difference']:+7.3f} {ci:>17} "
                f"{c['wilcoxon_p']:8.4f} {c['sign_test_p']:8.4f}"
            )
    if not args.quick:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(figures, indent=2))
        log(f"wrote {args.out}")


def rl_run(
    args: argparse.Namespace,
    seed: int,
    sft_path: str,
    env_params: dict[str, Any],
    train: list[dict[str, Any]],
    worker_for: Any,
    state: Path,
) -> tuple[list[dict[str, Any]], TrainConfig, RolloutWorker]:
    """CISPO from the SFT model with one seed; the per-step signal an analysis of "does RL add" needs. After every
    step the learner's state (LoRA weights, optimizer, random generators) and the history so far are written to
    `state` (.ckpt, .json): a run stopped mid-way resumes at its last finished step under --reuse."""
    config = TrainConfig(
        base_model=sft_path,
        environment="search",
        env_params=env_params,
        algorithm="cispo",
        learning_rate=args.lr,
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        lora={"rank": 16, "alpha": 32},
        max_tokens_per_pack=4096,
        beta_schedule={"start": 4.0, "end": 2.0, "epochs": 3},
        sampling={"temperature": args.temperature, "max_new_tokens": args.max_new_tokens},
        loss={"kl_coef": 0.0},
        substeps=args.substeps,
        **({"scale_rewards": args.scale_rewards} if args.scale_rewards else {}),
        curriculum={"by": "hops"} if args.curriculum else {"by": "off"},
        seed=seed,
    )
    learner = Learner(sft_path, config, threads=args.threads)
    history: list[dict[str, Any]] = []
    checkpoint, steps_file = state.with_suffix(".ckpt"), state.with_suffix(".json")
    if checkpoint.exists() and steps_file.exists():
        learner.load_checkpoint(checkpoint.read_bytes())
        history = json.loads(steps_file.read_text())
        log(f"seed {seed}: resumed after step {len(history)} from {checkpoint}")
    curriculum = Curriculum.from_rows(train, config.curriculum, config.steps, config.seed) if args.curriculum else None
    rollout = worker_for(sft_path, args.temperature, env_params)
    receiver = WeightSyncReceiver()
    blob, _ = learner.weight_update()  # the engine starts from the learner's weights (a resumed run's, too)
    rollout.backend.load_state_dict(receiver.receive(blob), learner.version)
    from workers.rl.steps import data_order

    for step in range(len(history), config.steps):
        if curriculum is not None:
            order, _ = curriculum.draw(step, config.prompts_per_step)
        else:
            order = data_order(len(train), config.seed, step, config.prompts_per_step)
        beta = config.beta_schedule.beta(step * config.prompts_per_step // len(train)) if config.beta_schedule else None
        result = rollout.rollout(
            [train[i] for i in order],
            group_size=config.group_size,
            seed=seed * 1000 + step,
            id_prefix=f"r{seed}s{step}-",
            f_beta=beta,
        )
        metrics = learner.train_step(result.samples)
        blob, _ = learner.weight_update()
        if blob is not None:
            rollout.backend.load_state_dict(receiver.receive(blob), learner.version)
        env_means = mean_metrics(s.episode_metrics for s in result.samples)
        # What an analysis of "does RL add anything" needs: the signal each step had to learn from.
        signal = ("reward_std", "dropped_groups", "groups", "advantage_abs_mean", "clip_fraction", "substeps")
        terms = mean_metrics(s.terms for s in result.samples)  # the reward's parts: outcome, penalties
        answered = [
            [s.episode_metrics.get("final_answer_found", 0.0) > 0 for s in result.samples if s.group == g]
            for g in range(len(order))
        ]
        truncated = sum(1 for s in result.samples if s.finish_reason == "length")
        history.append(
            {
                "step": step + 1,
                "beta": beta,
                "reward_mean": metrics["reward_mean"],
                **{k: metrics[k] for k in signal},
                **env_means,
                **{f"term/{k}": v for k, v in terms.items()},
                # groups where no sample answered: their advantages come from trajectory recall alone
                "groups_without_answer": sum(1 for g in answered if g and not any(g)),
                "groups_all_answered": sum(1 for g in answered if g and all(g)),
                "last_reply_cut_at_cap": truncated,
                "generation_seconds": round(result.generation_seconds, 1),
                "train_seconds": round(metrics["train_seconds"], 1),
            }
        )
        checkpoint.write_bytes(learner.checkpoint_bytes(data_position=step + 1))
        steps_file.write_text(json.dumps(history))
        log(
            f"seed {seed} step {step + 1}/{config.steps}: reward {metrics['reward_mean']:.3f}, output recall "
            f"{env_means['output_recall']:.3f}, dropped groups {metrics['dropped_groups']:.0f}, "
            f"{result.generation_seconds:.0f}s gen, {metrics['train_seconds']:.0f}s train"
        )
    del learner
    return history, config, rollout


if __name__ == "__main__":
    main()
