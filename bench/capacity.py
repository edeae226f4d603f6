"""Capacity table: memory per learner rank for 0.135B, 1.5B, 7B and 32B models under DDP and FSDP2 (fp32, bf16,
bf16 + CPU offload) on 1, 8 and 64 GPUs, and whether it fits an 80 GB GPU (issue 20, part 5).

    .venv/bin/python bench/capacity.py [--tokens 8192] [--device-gb 80] [--no-checkpointing]

The estimate is `workers.rl.capacity.rank_memory` (its docstring has the formulas): model shapes below (SmolLM2's
own; Qwen2.5's published configs for the larger sizes), the per-token activation cost calibrated on SmolLM2-135M on
this machine, AdamW, a micro-batch of `--tokens` tokens, gradient checkpointing on (the default for large models
here), no reference model (add ~4P or 4P/N for a KL term). It runs on nothing but arithmetic. Results:
bench/results/capacity.txt.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.models.registry import BUILTINS, SMOLLM2, ModelShape  # noqa: E402
from workers.rl.capacity import rank_memory  # noqa: E402

MODELS = {
    "0.135B (SmolLM2)": BUILTINS[SMOLLM2].shape,
    "1.5B (Qwen2.5 shape)": ModelShape(parameters=1_543_714_304, layers=28, hidden=1536, vocab=151_936),
    "7B (Qwen2.5 shape)": ModelShape(parameters=7_615_616_512, layers=28, hidden=3584, vocab=152_064),
    "32B (Qwen2.5 shape)": ModelShape(parameters=32_763_876_352, layers=64, hidden=5120, vocab=152_064),
}
SETUPS = [
    ("DDP fp32", "ddp", False, False),
    ("FSDP2 fp32", "fsdp2", False, False),
    ("FSDP2 bf16", "fsdp2", True, False),
    ("FSDP2 bf16 + CPU offload", "fsdp2", True, True),
]
GPUS = [1, 8, 64]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per micro-batch")
    parser.add_argument("--device-gb", type=float, default=80.0, help="memory of one GPU (H100: 80)")
    parser.add_argument("--no-checkpointing", action="store_true", help="activations without gradient checkpointing")
    args = parser.parse_args()
    lines = [
        f"GiB per learner rank (device; host with offload), micro-batch {args.tokens} tokens, gradient checkpointing "
        f"{'off' if args.no_checkpointing else 'on'}; fits = at most {args.device_gb:g} GB per GPU",
        "",
        "| model | setup | " + " | ".join(f"{g} GPU{'s' if g > 1 else ''}" for g in GPUS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in GPUS) + " |",
    ]
    for model, shape in MODELS.items():
        for label, strategy, bf16, offload in SETUPS:
            cells = []
            for gpus in GPUS:
                memory = rank_memory(
                    shape,
                    strategy,  # type: ignore[arg-type]
                    gpus,
                    tokens=args.tokens,
                    mixed_precision=bf16,
                    cpu_offload=offload,
                    gradient_checkpointing=not args.no_checkpointing,
                )
                fits = "fits" if memory.device_gb <= args.device_gb else "does not fit"
                host = f" + {memory.host_gb:g} host" if memory.host_gb else ""
                cells.append(f"{memory.device_gb:g}{host} ({fits})")
            lines.append(f"| {model} | {label} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    out = ROOT / "bench" / "results" / "capacity.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
