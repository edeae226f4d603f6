"""Supervised fine-tuning (the SFT warm-up before RL, and RFT after it): the teacher's episodes as samples in the
student's tokens (`generate`: a scripted agent or a model), stored trajectory records as samples
(`record_samples`), and the cross-entropy over sampled tokens in packed micro-batches (`fine_tune`).
`workers.jobs.sft` is the job that runs them."""

from __future__ import annotations

import random
from typing import Any

from workers.coding.scripted import SCRIPTED_CODING_TEACHERS, coding_teacher_for
from workers.envs.base import Message
from workers.models import make_backend
from workers.models.base import encode_chat
from workers.models.registry import resolve_base_model
from workers.rl.batching import flatten_segments, micro_batches, padded, per_sample
from workers.rl.config_sections import SFTConfig
from workers.rl.packing import completion_logprobs
from workers.rl.rollout import RolloutWorker, Sample, chatml_continuation
from workers.rl.teacher import AgentFor, teacher_rollout, the_same_agent
from workers.search.teacher import SCRIPTED_TEACHER, ScriptedSearchAgent
from workers.swarm.scripted import SCRIPTED_SWARM_TEACHER, ScriptedOrchestrator


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


def shown_names(names: list[str]) -> str:
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
