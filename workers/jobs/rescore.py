"""Offline re-scoring: score every stored trajectory with a reward config version, on Ray.

Shards of trajectories are scored by Ray tasks in parallel, and the enabled trajectory detectors run on each
trajectory (workers.detectors); as each shard completes the job reports per-trajectory summaries and their flags,
progress, running per-term means and flag rates, and the reward histogram, and at the end writes the scores (with
each trajectory's flags) as JSONL to `output_uri` and registers it as an artifact.

Served sessions re-score the same way: a `session/v1` row (`"format": "session/v1"`, a cycle's collected sessions)
is read as the trajectory `workers.realtime.samples.session_to_trajectory` makes of it, so a new session reward
version re-scores stored sessions. Their scores also hold `turn_rewards` (one per served turn, null where the
reward drops the turn). A session the reward drops (no feedback under `no_feedback="drop"`) is scored
`"dropped": true` with no reward, and counts in no mean or histogram.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import ray

from workers.detectors.registry import DetectorConfig, flag_metrics, run_detectors
from workers.findings import Finding
from workers.jobs.common import load_spec, reporter_for
from workers.realtime.reward import score_session
from workers.realtime.samples import trajectory_from_row
from workers.reporting import configure_logging, report_flags
from workers.rewards.schema import RewardSpec, validate_reward_spec
from workers.rewards.score import histogram, score_trajectory
from workers.specs import RescoreSpec
from workers.storage import read_bytes, write_bytes
from workers.trajectories import Trajectory, parse_trajectories_jsonl

log = logging.getLogger("crucible.rescore")


def score_shard(
    reward: RewardSpec, rows: list[dict[str, Any]], detectors: DetectorConfig | None = None
) -> list[dict[str, Any]]:
    """Score one shard; returns one summary dict per trajectory (reward, unweighted terms, turns, error) with the
    detectors' `findings` (a list of `Finding`) on it."""
    out: list[dict[str, Any]] = []
    for row in rows:
        trajectory = Trajectory.model_validate(row)
        item: dict[str, Any]
        if trajectory.session_turns:
            scored = score_session(reward, trajectory)
            result = scored.result
            item = {"turn_rewards": scored.turn_rewards}
        else:
            result = score_trajectory(reward, trajectory)
            item = {}
        out.append(
            {
                "trajectory_id": trajectory.id,
                "task_id": trajectory.task_id,
                "reward": None if result.dropped else result.reward,
                "terms": dict(result.terms),
                "num_turns": trajectory.num_turns,
                "error": trajectory.error,
                "dropped": result.dropped,
                **item,
                "findings": run_detectors(row, detectors),
            }
        )
    return out


def _flag_row(finding: Finding) -> dict[str, Any]:
    return {
        "detector": finding.detector,
        "detector_version": finding.version,
        "severity": finding.severity,
        "evidence": finding.evidence,
    }


_score_shard_remote = ray.remote(num_cpus=1)(score_shard)


def run(spec: RescoreSpec) -> dict[str, Any]:
    # One function on purpose: a job's wiring, read top to bottom (read, score, write, report).
    started = time.monotonic()
    reward = validate_reward_spec(spec.reward)
    with reporter_for(spec) as reporter:
        reporter.log(f"reading {spec.input_uri}")
        parsed = parse_trajectories_jsonl(read_bytes(spec.input_uri, spec.storage_options), convert=trajectory_from_row)
        if parsed.errors:
            first = parsed.errors[0]
            raise SystemExit(f"input has {len(parsed.errors)} bad line(s); first: line {first.line}: {first.message}")
        rows = [t.model_dump(mode="json") for t in parsed.trajectories]
        total = len(rows)
        reporter.progress(0, total)
        shard_size = spec.shard_size or max(1, -(-total // 24))
        reporter.log(f"scoring {total} trajectories in shards of {shard_size} on Ray")

        ray.init(ignore_reinit_error=True, log_to_driver=False)
        reward_ref = ray.put(reward)
        detectors_ref = ray.put(spec.detectors)
        pending = [
            _score_shard_remote.remote(reward_ref, rows[i : i + shard_size], detectors_ref)
            for i in range(0, total, shard_size)
        ]
        scored: list[dict[str, Any]] = []
        findings_per_trajectory: list[list[Finding]] = []
        flag_counts: dict[str, int] = {}
        term_sums: dict[str, float] = {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for shard in ray.get(ready):
                for item in shard:
                    findings: list[Finding] = item.pop("findings")
                    event = {k: v for k, v in item.items() if k not in ("dropped", "turn_rewards")}
                    reporter.trajectory(**event, storage_uri=spec.input_uri)
                    report_flags(reporter, findings, step=0)  # after its trajectory, so ingest links them
                    item["flags"] = [_flag_row(finding) for finding in findings]
                    scored.append(item)
                    findings_per_trajectory.append(findings)
                    for finding in findings:
                        flag_counts[finding.detector] = flag_counts.get(finding.detector, 0) + 1
                    if item["dropped"]:
                        continue
                    for name, value in item["terms"].items():
                        term_sums[name] = term_sums.get(name, 0.0) + value
            done = len(scored)
            rewards = [s["reward"] for s in scored if not s["dropped"]]
            values: dict[str, float] = {}
            if rewards:
                values["reward_mean"] = sum(rewards) / len(rewards)
                values.update({f"term/{name}": value_sum / len(rewards) for name, value_sum in term_sums.items()})
            if len(rewards) < done:
                values["dropped"] = float(done - len(rewards))
            values.update(flag_metrics(findings_per_trajectory, spec.detectors))
            if values:
                reporter.metric(done, values)
            reporter.progress(done, total)
            hist = histogram(rewards, bins=spec.histogram_bins)
            reporter.histogram("reward", hist["edges"], hist["counts"])

        payload = "".join(json.dumps(s, sort_keys=True) + "\n" for s in scored).encode()
        write_bytes(spec.output_uri, payload, spec.storage_options)
        reporter.artifact("scores.jsonl", spec.output_uri, size_bytes=len(payload), meta={"rows": len(scored)})
        rewards = [s["reward"] for s in scored if not s["dropped"]]
        summary = {
            "trajectories": len(scored),
            "dropped": len(scored) - len(rewards),
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "reward_min": min(rewards) if rewards else None,
            "reward_max": max(rewards) if rewards else None,
            "term_means": {name: v / len(rewards) for name, v in term_sums.items()} if rewards else {},
            "flag_counts": flag_counts,
            "seconds": round(time.monotonic() - started, 3),
        }
        reporter.summary(summary)
        reporter.log(f"done: {len(scored)} trajectories, mean reward {summary['reward_mean']}")
    return summary


def main() -> None:
    configure_logging()
    run(load_spec(RescoreSpec))


if __name__ == "__main__":
    main()
