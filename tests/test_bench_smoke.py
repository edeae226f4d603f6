"""Every benchmark starts: `bench/<name>.py --help` for each script (helpers starting with `_` are not scripts), and
the `--quick` mode of each benchmark that has one (issue 36: `trainer_vs_trl.py` stopped starting when the shared
load guard added a second `--max-load`, and nothing noticed until `make bench` failed at its second command).

The quick modes run in a scratch copy of `bench/` (the rest of the tree linked in), so the result files they write
land there and never in the repository. Every quick mode takes from 30 s to 4 minutes on 2 cores (a local Ray, a
model, a training step), so each is marked `slow` (`make test-slow`) with its measured time; a benchmark that gains
a `--quick` mode runs in the default suite until it is listed here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))
QUICK = [name for name in SCRIPTS if '"--quick"' in (BENCH / name).read_text()]

# Measured on the 2-core development machine, one at a time (why each is not in the default suite).
SLOW_QUICK = {
    "async_modes.py": "~70 s: three trainer runs, each on its own local Ray",
    "coding_learning_check.py": "~40 s: task generation, SFT and RL steps with the tiny model",
    "gpu_learning.py": "~45 s: two GRPO steps of the tiny model and its held-out evals, on the CPU",
    "ingest_vs_mlflow.py": "not timed here: installs MLflow into its own virtualenv on first use (from the package "
    "index), then starts uvicorn and mlflow servers on fresh databases crucible_bench and mlflow_bench",
    "learner_ranks.py": "~150 s: learner ranks and weight broadcasts on a local Ray",
    "search_learning_check.py": "~30 s: builds an index, SFT and CISPO steps with the tiny model",
    "serving.py": "~60 s: serving engines, checkpoints and the recorder",
    "swarm.py": "~40 s: a BM25 index of the stdlib corpus and a local Ray",
    "swarm_learning_check.py": "~40 s: SFT and PARL steps with the tiny model",
    "trainer_vs_trl.py": "1.5-4 min: converts SmolLM2-135M on first use, GRPO steps of ours and of TRL",
}


def _run(args: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _failure(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout (end)\n{proc.stdout[-3000:]}\n--- stderr (end)\n{proc.stderr[-3000:]}"


def test_bench_help() -> None:
    """`--help` of every script, three at a time (each mostly imports torch and the workers: about 3 s of one core;
    one at a time they took half a minute of the suite)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:
        helps = pool.map(lambda script: _run([str(BENCH / script), "--help"], cwd=ROOT, timeout=300), SCRIPTS)
        procs = dict(zip(SCRIPTS, helps, strict=True))
    failed = {name: _failure(proc) for name, proc in procs.items() if proc.returncode or "usage:" not in proc.stdout}
    assert not failed, "\n\n".join(f"{name}: {why}" for name, why in failed.items())


def test_every_make_bench_script_exists() -> None:
    """`make bench` names scripts that this smoke test covers (a renamed script fails here, not at bench time)."""
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    named = [word.split("/", 1)[1] for word in recipe.split() if word.startswith("bench/") and word.endswith(".py")]
    assert named, "no bench/*.py found in the Makefile's bench target"
    assert set(named) <= set(SCRIPTS), sorted(set(named) - set(SCRIPTS))


def _scratch_tree(tmp: Path) -> Path:
    """A copy of bench/ (its results folder empty) beside links to everything else at the repository root."""
    root = tmp / "tree"
    (root / "bench" / "results").mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name != "bench":
            (root / entry.name).symlink_to(entry)
    for entry in BENCH.iterdir():
        if entry.is_file():
            (root / "bench" / entry.name).write_bytes(entry.read_bytes())
    return root


@pytest.mark.parametrize(
    "script",
    [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_QUICK else name for name in QUICK],
)
def test_bench_quick(script: str, tmp_path: Path) -> None:
    root = _scratch_tree(tmp_path)
    help_text = _run([str(root / "bench" / script), "--help"], cwd=root, timeout=120).stdout
    args = [str(root / "bench" / script), "--quick"]
    if "--noisy" in help_text:
        args.append("--noisy")  # this checks that it runs, not its figures: a busy machine must not skip it
    proc = _run(args, cwd=root, timeout=1800)
    assert proc.returncode == 0, _failure(proc)


def test_quick_modes_are_found() -> None:
    """The `--quick` discovery sees the benchmarks known to have one (a rename of the flag would empty the list)."""
    assert {"trainer_vs_trl.py", "swarm.py", "serving.py"} <= set(QUICK)
    assert set(SLOW_QUICK) <= set(QUICK), sorted(set(SLOW_QUICK) - set(QUICK))
