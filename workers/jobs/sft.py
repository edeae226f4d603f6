"""The SFT warm-up job (`python -m workers.jobs.sft`): rejection sampling, then supervised fine-tuning.

Context-1 warmed its policy up on trajectories of the same agent loop run by a larger model, filtered by recall
(docs/methods.md section 3, "SFT warm-up"). This job does the same with any model Crucible can run:
1. generate `rollouts_per_task` episodes per task with the `teacher` model in the run's environment;
2. keep those `workers.search.rejection` selects, counting every drop by reason (the run page shows the counts);
3. fine-tune the `base_model` on the kept episodes: cross-entropy on the tokens the teacher sampled (tool results
   and prompts are context, not targets), packed like the RL learner's micro-batches;
4. save the fine-tuned model (a transformers directory) to object storage, and the kept trajectories beside it.
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from workers.coding.scripted import SCRIPTED_CODING_TEACHERS, coding_teacher_for
from workers.envs.base import Message
from workers.envs.registry import configure_storage, get_environment
from workers.jobs.common import load_spec, reporter_for
from workers.models import make_backend
from workers.models.base import encode_chat
from workers.models.registry import resolve_base_model
from workers.reporting import configure_logging
from workers.rl.batching import flatten_segments, micro_batches, padded, per_sample
from workers.rl.checkpoints import checkpoint_policy_state
from workers.rl.packing import completion_logprobs
from workers.rl.rollout import RolloutWorker, Sample, chatml_continuation
from workers.rl.teacher import AgentFor, teacher_rollout, the_same_agent
from workers.rl.trainer import trajectory_summary
from workers.search.metrics import mean_metrics
from workers.search.rejection import select_trajectories
from workers.search.teacher import SCRIPTED_TEACHER, ScriptedSearchAgent
from workers.specs import SFTConfig, SFTSpec
from workers.storage import read_bytes, write_bytes
from workers.swarm.scripted import SCRIPTED_SWARM_TEACHER, ScriptedOrchestrator

log = logging.getLogger("crucible.sft")


def _upload_dir(local: Path, uri: str, storage_options: dict[str, Any]) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            write_bytes(f"{uri.rstrip('/')}/{path.relative_to(local).as_posix()}", path.read_bytes(), storage_options)


def fine_tune(model: Any, samples: list[Any], config: SFTConfig, progress: Any = None) -> list[float]:
    """Cross-entropy on each sample's sampled tokens (loss_mask), one AdamW step per packed micro-batch; returns
    the mean loss of every epoch."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate)
    rng = random.Random(config.seed)
    losses: list[float] = []
    model.train()
    batches_total = config.epochs * len(micro_batches(samples, config.max_tokens_per_pack))
    done = 0
    for _ in range(config.epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        shuffled = [samples[i] for i in order]
        total, tokens = 0.0, 0.0
        for group in micro_batches(shuffled, config.max_tokens_per_pack):
            batch = [shuffled[i] for i in group]
            seqs, starts, owners = flatten_segments(batch)
            logps = completion_logprobs(model, seqs, starts, max_tokens_per_pack=max(len(s) for s in seqs))
            logp = per_sample(list(logps), owners, len(batch))
            mask = padded([[float(m) for m in s.loss_mask] for s in batch], torch.float32)
            count = mask.sum().clamp(min=1.0)
            loss = -(logp * mask).sum() / count
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            optimizer.step()
            total += float(loss.item()) * float(count)
            tokens += float(count)
            done += 1
            if progress is not None:
                progress(done, batches_total)
        losses.append(total / max(tokens, 1.0))
    return losses


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


RECORDS = "records"
"""`teacher_model` of an SFT run on stored trajectories (an RFT export): no teacher runs, the records are the data."""


def record_samples(records: list[dict[str, Any]], tokenizer: Any) -> list[Any]:
    """Stored trajectory records as SFT samples in the student's tokens: the conversation up to the first reply is
    the prompt, every reply (closed with `<|im_end|>`) is trained, the messages between replies are context. A reply
    that made several tool calls is stored as one assistant turn with its text and one empty turn per further call;
    those empty turns are skipped. Rewritten contexts (prunes, self-summaries) are not replayed: the record's turns
    are trained as one conversation."""

    samples: list[Any] = []
    for group, record in enumerate(records):
        turns = [t for t in record.get("turns") or [] if isinstance(t, dict)]
        messages: list[Message] = [
            {"role": str(t.get("role") or "user"), "content": str(t.get("content") or "")}
            for t in turns
            if not (t.get("role") == "assistant" and not t.get("content") and t.get("tool"))
        ]
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if first is None:
            continue
        ids: list[int] = list(encode_chat(tokenizer, messages[:first]))
        start = len(ids)
        mask: list[int] = []
        pending: list[Message] = []
        for message in messages[first:]:
            if message["role"] != "assistant":
                pending.append(message)
                continue
            if pending:
                more = chatml_continuation(tokenizer, pending, closed=True)
                ids += more
                mask += [0] * len(more)
                pending = []
            reply = tokenizer.encode(message["content"] + "<|im_end|>", add_special_tokens=False)
            ids += reply
            mask += [1] * len(reply)
        raw_counts = record.get("counts")
        counts: dict[str, Any] = raw_counts if isinstance(raw_counts, dict) else {}
        samples.append(
            Sample(
                task_id=str(record.get("task_id") or record.get("id")),
                group=group,
                token_ids=ids,
                completion_start=start,
                loss_mask=mask,
                old_logprobs=[0.0] * len(mask),
                reward=1.0,
                terms={},
                policy_version=0,
                num_turns=int(counts.get("turns", 0) or 0),
                malformed_tool_calls=int(counts.get("malformed_tool_calls", 0) or 0),
                finish_reason="stop",
                error=None,
                trajectory=record,
            )
        )
    return samples


def generate(
    config: SFTConfig, rows: list[dict[str, Any]], reward: dict[str, Any], progress: Any = None, bind: Any = None
) -> list[Any]:
    """Phase 1: the teacher's episodes on `rows` (`rollouts_per_task` each), as samples in the student's tokens.
    `progress(tasks_done)` after each batch; `bind(env)` prepares scripted-teacher environments."""

    samples: list[Any] = []
    if config.teacher_model in (SCRIPTED_TEACHER, *SCRIPTED_CODING_TEACHERS, SCRIPTED_SWARM_TEACHER):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(resolve_base_model(config.base_model)), local_files_only=True)
        for _ in range(config.rollouts_per_task):  # deterministic: repeats are dropped as duplicates by the filter
            agent_for: AgentFor
            if config.teacher_model == SCRIPTED_TEACHER:
                agent_for = the_same_agent(ScriptedSearchAgent())
            elif config.teacher_model == SCRIPTED_SWARM_TEACHER:
                # the teacher never asks for more parallel tasks per reply than the environment accepts
                max_parallel = int(config.env_params.get("max_parallel", 8))
                agent_for = the_same_agent(ScriptedOrchestrator(max_parallel=max_parallel))
            else:
                agent_for = coding_teacher_for(SCRIPTED_CODING_TEACHERS[config.teacher_model])
            samples += teacher_rollout(
                agent_for,
                tokenizer,
                lambda messages: encode_chat(tokenizer, messages),
                rows,
                environment=config.environment,
                env_params=config.env_params,
                reward=reward,
                bind=bind,
            )
            if progress is not None:
                progress(len(rows))
        return samples
    teacher = make_backend("transformers", str(resolve_base_model(config.teacher_model)), threads=config.threads)
    worker = RolloutWorker(
        teacher,
        environment=config.environment,
        env_params=config.env_params,
        reward=reward,
        temperature=config.sampling.temperature,
        top_p=config.sampling.top_p,
        max_new_tokens=config.sampling.max_new_tokens,
    )
    batch = 4
    for at in range(0, len(rows), batch):
        result = worker.rollout(
            rows[at : at + batch], group_size=config.rollouts_per_task, seed=config.seed + at, id_prefix="sft-"
        )
        samples += result.samples
        if progress is not None:
            progress(min(at + batch, len(rows)))
    return samples


def run(spec: SFTSpec) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    config, opts = spec.config, spec.storage_options
    configure_storage(opts)
    torch.manual_seed(config.seed)
    with reporter_for(spec) as reporter:
        env_cls = get_environment(config.environment)
        rows = [json.loads(line) for line in read_bytes(spec.input_uri, opts).split(b"\n") if line.strip()]
        if spec.exclude_task_ids:  # before max_tasks: an excluded task never takes an allowed one's place
            excluded = set(spec.exclude_task_ids)
            kept_rows = [row for row in rows if str(row.get("id")) not in excluded]
            reporter.log(f"{len(rows) - len(kept_rows)} excluded task(s) left out of the warm-up")
            rows = kept_rows
        rows = rows[: config.max_tasks]
        started = time.perf_counter()
        if config.teacher_model == RECORDS:
            # RFT: the rows are trajectories already filtered by reward and deduplicated by task at export.
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(resolve_base_model(config.base_model)), local_files_only=True)
            samples = record_samples(rows, tokenizer)
            reporter.log(f"{len(samples)} stored trajectories (of {len(rows)} records) as SFT examples")
            kept_indices = list(range(len(samples)))
            report: dict[str, Any] = {"source": "records", "generated": len(rows), "kept": len(samples)}
            generation_seconds = time.perf_counter() - started
        else:
            for index, row in enumerate(rows, start=1):
                env_cls.validate_task_row(row, index=index)
            reporter.log(f"{len(rows)} tasks x {config.rollouts_per_task} rollouts with {config.teacher_model}")
            samples = generate(config, rows, spec.reward, lambda done: reporter.progress(done, 2 * len(rows)))
            generation_seconds = time.perf_counter() - started
            records = [s.trajectory for s in samples]
            own_rule = env_cls.select_for_sft(records)
            if own_rule is not None:  # the environment's own rule (coding: solved episodes)
                kept_indices, report = own_rule
            else:
                selected = select_trajectories(records, config.filter)
                kept_indices, report = selected.kept, selected.report(len(records))
        teacher_metrics = mean_metrics(s.episode_metrics for s in samples)
        report["teacher_metrics"] = teacher_metrics
        reporter.summary({"sft_filter": report})
        reporter.log(f"generated {len(samples)} trajectories in {generation_seconds:.0f}s; kept {len(kept_indices)}")
        for sample in samples:
            reporter.trajectory(**trajectory_summary(sample, 0))
        kept = [samples[i] for i in kept_indices]
        write_bytes(
            f"{spec.output_prefix}/sft/kept.jsonl",
            "".join(json.dumps(s.trajectory) + "\n" for s in kept).encode(),
            opts,
        )
        if not kept:
            reporter.log("no trajectory passed the filter: nothing to fine-tune on (see the filter counts)")
            summary = {"sft_filter": report, "fine_tuned": False}
            reporter.summary(summary)
            return summary

        # Phase 2: fine-tuning (the second half).
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(resolve_base_model(config.base_model)), dtype=torch.float32, local_files_only=True
        )
        if config.checkpoint_uri:
            state, version = checkpoint_policy_state(config.base_model, config.checkpoint_uri, opts, config.threads)
            missing, unexpected = model.load_state_dict(state, strict=False)
            if unexpected:
                raise ValueError(f"{config.checkpoint_uri} holds weights {_shown(unexpected)} not in the model")
            reporter.log(f"starting from {config.checkpoint_uri} (policy version {version})")

        def progress(done: int, total: int) -> None:
            reporter.progress(len(rows) + round(len(rows) * done / max(total, 1)), 2 * len(rows))

        losses = fine_tune(model, kept, config, progress)
        for epoch, loss in enumerate(losses, start=1):
            reporter.metric(epoch, {"sft_loss": loss, "sft_examples": float(len(kept))})
        uri = f"{spec.output_prefix}/sft/model"
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(
                str(resolve_base_model(config.base_model)), local_files_only=True
            ).save_pretrained(tmp)
            _upload_dir(Path(tmp), uri, opts)
        reporter.checkpoint(config.epochs, uri, {"sft_loss": losses[-1]})
        reporter.progress(2 * len(rows), 2 * len(rows))
        summary = {"sft_filter": report, "fine_tuned": True, "model_uri": uri, "sft_loss": losses}
        reporter.summary(summary)
        return summary


def main() -> None:
    configure_logging()
    run(load_spec(SFTSpec))


if __name__ == "__main__":
    main()
