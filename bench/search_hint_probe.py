"""Does the search check's SFT policy answer only when Context-1's training-only budget hint is shown?

    .venv/bin/python bench/search_hint_probe.py WORK_DIR [--max-new-tokens 96]

Builds (or reuses) the search learning check's index and warm-up in WORK_DIR, with the check's own functions and
the settings of its fourth to sixth attempts (150 tasks, 30 teacher trajectories, one epoch at 5e-5), then
evaluates the SFT policy greedily on the 50 held-out tasks twice: `training` false (no hint, as every evaluation)
and true (the soft-threshold message shown). Prints both means and writes WORK_DIR/hint_probe.json. The check
reuses the work directory with `--reuse WORK_DIR` (docs/recipe-learning-checks.md, "Looking for the cause").
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import search_learning_check as check  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    import torch

    from workers.rl.config_sections import SFTConfig

    torch.set_num_threads(2)
    random.seed(0)
    args.work.mkdir(parents=True, exist_ok=True)
    chunks, _ = check.build_corpus(check.stdlib_documents())
    index_uri = f"file://{args.work}/index"
    if not (args.work / "index").exists():
        check.save_index(check.SearchIndex.build(chunks, check.IndexConfig(dense=True)), index_uri)
    env_params = {**check.ENV, "index_uri": index_uri}
    corpus = check.synth.SynthCorpus(chunks)
    made = check.synth.synthesize(
        corpus, check.synth.SynthParams(num_tasks=150, max_hops=2), check.synth_steps.TemplateGenerator(corpus)
    )
    train = [t for t in made.tasks if not check.held_out(t["id"])]
    test = [t for t in made.tasks if check.held_out(t["id"])]
    reward = check.context1_spec(beta=4.0).model_dump(mode="json")
    base_path = str(check.resolve_base_model(check.SMOLLM2))
    sft_path = str(args.work / "sft")
    if not (args.work / "sft" / "config.json").exists():
        config = SFTConfig(
            teacher_model="scripted-search",
            base_model=base_path,
            env_params=env_params,
            rollouts_per_task=1,
            epochs=1,
            learning_rate=5e-5,
            max_tokens_per_pack=4096,
        )
        check.sft_warm_up(config, train, reward, base_path, sft_path, examples=30)
    out: dict[str, dict[str, float]] = {}
    for training in (False, True):
        worker = check.RolloutWorker(
            check.make_backend("transformers", sft_path, threads=2),
            environment="search",
            env_params={**env_params, "training": training},
            reward=reward,
            temperature=0.0,
            max_new_tokens=args.max_new_tokens,
        )
        out[f"training={training}"] = check.mean_metrics(check.evaluate(worker, test, f"sft training={training}"))
    (args.work / "hint_probe.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
