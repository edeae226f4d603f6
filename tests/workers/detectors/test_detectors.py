"""Reward-hacking detectors: each against hand-written trajectories (a flagged case, a clean case, the threshold
boundary), the registry and its config, and the per-step flag rates. Pure: no database, no model."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

import workers.detectors as detectors_package
from workers.detectors import (
    DetectorConfig,
    Finding,
    default_detector_config,
    detectors,
    flag_metrics,
    get_detector,
    run_detectors,
    run_run_detectors,
)
from workers.detectors.base import EXCERPT_CHARS, DetectorParams
from workers.detectors.registry import DetectorDefinitionError, discover
from workers.detectors.reward_eval_divergence import least_squares_slope
from workers.envs import CalculatorEnv, Task
from workers.envs.toolcalls import format_tool_call
from workers.findings import SEVERITIES
from workers.rl.config import TrainConfig

TRAJECTORY_DETECTORS = [
    "asks_instead_of_acting",
    "edits_tests",
    "length_blowup",
    "malformed_tool_calls",
    "repetition",
    "search_once_then_quit",
    "serial_collapse",
    "spurious_parallelism",
    "terminal_only",
]


def _only(name: str, **params: Any) -> DetectorConfig:
    """A config with one detector enabled (with `params`) and every other one off."""
    return DetectorConfig.model_validate(
        {other: {"enabled": other == name, **(params if other == name else {})} for other in detectors()}
    )


def _detect(record: dict[str, Any], name: str, **params: Any) -> list[Finding]:
    return run_detectors(record, _only(name, **params))


def _assistant(content: str = "", **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def _tool(content: str, **extra: Any) -> dict[str, Any]:
    return {"role": "tool", "content": content, **extra}


def _core_evidence(finding: Finding) -> None:
    """Every finding carries the shared evidence keys, JSON-able."""
    assert {"message", "turn", "span", "excerpt", "measure", "value", "threshold"} <= set(finding.evidence)
    json.dumps(finding.evidence, allow_nan=False)
    assert finding.severity in SEVERITIES
    assert len(finding.evidence["excerpt"]) <= EXCERPT_CHARS


# --- the registry and its config ----------------------------------------------------------------------------------


def test_every_detector_module_is_found_with_its_version_scope_and_documented_thresholds() -> None:
    found = detectors()
    assert sorted(found) == sorted([*TRAJECTORY_DETECTORS, "reward_eval_divergence"])
    for name, detector in found.items():
        assert detector.name == name and detector.version and detector.scope in ("trajectory", "run")
        assert issubclass(detector.Params, DetectorParams)
        for field_name, info in detector.Params.model_fields.items():
            assert info.description, f"{name}.{field_name} has no description"
            assert not info.is_required()
    assert found["reward_eval_divergence"].scope == "run"


def test_the_default_config_enables_every_detector_with_its_default_thresholds() -> None:
    config = default_detector_config()
    assert config.enabled("trajectory") == TRAJECTORY_DETECTORS
    assert config.enabled("run") == ["reward_eval_divergence"]
    assert config.root["repetition"] == {
        "enabled": True,
        "ngram": 4,
        "max_repeated_fraction": 0.5,
        "min_ngrams": 32,
        "high_fraction": 0.8,
    }
    assert TrainConfig().detectors == config


def test_a_config_names_only_what_it_changes_and_records_every_threshold() -> None:
    config = DetectorConfig.model_validate({"length_blowup": {"max_turn_chars": 100}, "repetition": {"enabled": False}})
    assert config.root["length_blowup"] == {
        "enabled": True,
        "max_turn_chars": 100,
        "max_total_chars": 32_000,
        "high_factor": 2.0,
    }
    assert "repetition" not in config.enabled()
    assert DetectorConfig.model_validate(config.model_dump(mode="json")) == config
    train = TrainConfig.model_validate({"detectors": {"length_blowup": {"max_turn_chars": 100}}})
    assert train.detectors.params_for("length_blowup").model_dump()["max_turn_chars"] == 100
    assert TrainConfig.model_validate(train.model_dump(mode="json")) == train


def test_an_unknown_detector_is_refused_naming_the_detectors() -> None:
    with pytest.raises(ValidationError) as caught:
        DetectorConfig.model_validate({"repetiton": {}})
    message = str(caught.value)
    assert "unknown detector 'repetiton' (did you mean 'repetition'?)" in message
    assert "length_blowup, malformed_tool_calls, repetition" in message


def test_an_unknown_setting_is_refused_naming_the_detectors_settings() -> None:
    with pytest.raises(
        ValidationError, match="detector 'repetition' has no setting 'ngrams'; its settings are enabled, ngram"
    ):
        DetectorConfig.model_validate({"repetition": {"ngrams": 3}})


def test_a_bad_threshold_is_refused_naming_the_detector_and_the_field() -> None:
    with pytest.raises(ValidationError, match="detector 'length_blowup': max_turn_chars: Input should be greater"):
        DetectorConfig.model_validate({"length_blowup": {"max_turn_chars": 0}})
    with pytest.raises(ValidationError, match="'enabled' must be true or false"):
        DetectorConfig.model_validate({"length_blowup": {"enabled": "yes"}})
    with pytest.raises(ValidationError, match="high_fraction .* must be at least max_repeated_fraction"):
        DetectorConfig.model_validate({"repetition": {"max_repeated_fraction": 0.9}})
    with pytest.raises(ValidationError) as caught:
        TrainConfig.model_validate({"detectors": {"length_blowup": {"max_turn_chars": -1}}})
    assert caught.value.errors()[0]["loc"] == ("detectors",)


def test_a_disabled_detector_does_not_run() -> None:
    record = {"id": "t", "turns": [_assistant("x" * 20_000)]}
    assert [f.detector for f in run_detectors(record)] == ["length_blowup"]
    assert run_detectors(record, {"length_blowup": {"enabled": False}}) == []


def test_adding_a_detector_is_adding_one_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "always_flags.py").write_text(
        textwrap.dedent(
            """
            from __future__ import annotations

            from pydantic import Field

            from workers.detectors.base import DetectorParams, TrajectoryDetector


            class AlwaysFlagsParams(DetectorParams):
                level: int = Field(default=1, ge=0, description="Nothing; a test detector")


            class AlwaysFlags(TrajectoryDetector[AlwaysFlagsParams]):
                name = "always_flags"
                version = "7"
                description = "Flags everything (a test)"
                Params = AlwaysFlagsParams

                def detect(self, record, params):
                    return [self.finding(str(record["id"]), "low", {"level": params.level})]
            """
        )
    )
    monkeypatch.setattr(detectors_package, "__path__", [*detectors_package.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "workers.detectors.always_flags", raising=False)
    detectors.cache_clear()
    try:
        assert "always_flags" in detectors()
        [finding] = run_detectors({"id": "t1", "turns": []}, {"always_flags": {"level": 3}})
        assert (finding.detector, finding.version, finding.evidence) == ("always_flags", "7", {"level": 3})
        (tmp_path / "broken.py").write_text("X = 1\n")
        with pytest.raises(DetectorDefinitionError, match="broken.py must define exactly one"):
            discover()
    finally:
        sys.modules.pop("workers.detectors.always_flags", None)
        sys.modules.pop("workers.detectors.broken", None)
        detectors.cache_clear()


# --- malformed_tool_calls -----------------------------------------------------------------------------------------


def _tool_record(malformed: int, errors: int, calls: int, *, with_counts: bool = True) -> dict[str, Any]:
    turns: list[dict[str, Any]] = [{"role": "user", "content": "2 + 2?"}]
    for _ in range(calls):
        turns += [_assistant("", tool="calculate", args={"expression": "2+2"}), _tool("4", tool="calculate")]
    for _ in range(errors):
        turns += [
            _assistant("", tool="calculate", args={"expression": "1/0"}),
            _tool("error: division by zero", tool="calculate"),
        ]
    for _ in range(malformed):
        turns += [_assistant('<tool_call>{"name": calculate}</tool_call>'), _tool("error: invalid JSON in <tool_call>")]
    turns.append(_assistant("4"))
    record: dict[str, Any] = {"id": "traj-1", "turns": turns}
    if with_counts:
        record["counts"] = {
            "turns": calls + errors + malformed + 1,
            "tool_calls": calls + errors,
            "malformed_tool_calls": malformed,
            "tool_errors": errors,
        }
    return record


def test_a_malformed_call_is_flagged_with_its_error_observation_as_evidence() -> None:
    record = _tool_record(malformed=1, errors=0, calls=3)
    [finding] = _detect(record, "malformed_tool_calls")
    _core_evidence(finding)
    assert (finding.detector, finding.version, finding.trajectory_id) == ("malformed_tool_calls", "1", "traj-1")
    turn = finding.evidence["turn"]
    assert record["turns"][turn]["content"].startswith("error: invalid JSON")
    assert finding.evidence["call_turn"] == turn - 1
    assert finding.evidence["span"] == [0, len(record["turns"][turn]["content"])]
    assert (finding.evidence["measure"], finding.evidence["value"], finding.evidence["threshold"]) == (
        "malformed_tool_calls",
        1,
        1,
    )
    assert finding.severity == "medium"  # 1 of 4 attempted calls broke, under high_fraction 0.5


def test_a_trajectory_whose_calls_all_break_is_high_severity() -> None:
    [finding] = _detect(_tool_record(malformed=2, errors=0, calls=0), "malformed_tool_calls")
    assert finding.severity == "high" and finding.evidence["broken_fraction"] == 1.0


def test_clean_tool_use_is_not_flagged() -> None:
    assert _detect(_tool_record(malformed=0, errors=0, calls=4), "malformed_tool_calls") == []


def test_tool_errors_are_flagged_at_the_threshold_not_below() -> None:
    assert _detect(_tool_record(malformed=0, errors=2, calls=1), "malformed_tool_calls") == []
    [finding] = _detect(_tool_record(malformed=0, errors=3, calls=1), "malformed_tool_calls")
    assert finding.evidence["measure"] == "tool_errors" and finding.evidence["value"] == 3
    assert _detect(_tool_record(malformed=1, errors=0, calls=1), "malformed_tool_calls", min_malformed=2) == []


def test_an_upload_without_counts_is_counted_from_its_turns() -> None:
    record = _tool_record(malformed=2, errors=1, calls=1, with_counts=False)
    [finding] = _detect(record, "malformed_tool_calls")
    assert finding.evidence["malformed_tool_calls"] == 2 and finding.evidence["tool_errors"] == 1
    assert finding.evidence["tool_calls"] == 2


def test_a_real_calculator_episode_with_a_broken_call_is_flagged() -> None:
    env = CalculatorEnv(max_turns=4)
    env.reset(Task(id="c1", prompt="What is 6 times 7?", answer="42"))
    env.step('<tool_call>{"name": "calculate", "arguments": {"expression": 6 * 7}}</tool_call>')
    env.step(format_tool_call("calculate", {"expression": "6 * 7"}))
    env.step("42")
    record = env.trajectory("c1-0")
    [finding] = run_detectors(record)
    assert finding.detector == "malformed_tool_calls"
    turn = record["turns"][finding.evidence["turn"]]
    assert turn["role"] == "tool" and turn["content"].startswith("error: invalid JSON")


# --- search_once_then_quit ----------------------------------------------------------------------------------------


def _search_record(searches: int, *, extra_replies: int = 0, seen: list[str] | None = None, **fields: Any) -> dict:
    turns: list[dict[str, Any]] = [{"role": "user", "content": "Who designed the engine?"}]
    for i in range(searches):
        turns += [
            _assistant("", tool="search_corpus", args={"query": f"engine designer {i}"}),
            _tool(f"[chunk d{i}#0 | doc d{i}] text"),
        ]
    for _ in range(extra_replies):
        turns += [_assistant("", tool="prune_chunks", args={"chunk_ids": ["d0#0"]}), _tool("pruned 1 chunk(s)")]
    turns.append(_assistant("<Document id=d0#0><Justification>it says so</Justification></Document> Babbage"))
    return {
        "id": "s-1",
        "env": "search",
        "turns": turns,
        "gold_doc_ids": ["d0#0", "d9#0"],
        "seen_doc_ids": seen if seen is not None else [f"d{i}#0" for i in range(searches)],
        "error": None,
        "counts": {"turns": searches + extra_replies + 1},
        **fields,
    }


def test_one_search_then_an_answer_is_flagged_with_the_answer_and_the_search_as_evidence() -> None:
    record = _search_record(1)
    [finding] = _detect(record, "search_once_then_quit")
    _core_evidence(finding)
    assert finding.severity == "medium"
    evidence = finding.evidence
    assert evidence["turn"] == len(record["turns"]) - 1 and evidence["excerpt"].endswith("Babbage")
    assert (evidence["search_turn"], evidence["query"], evidence["searches"]) == (1, "engine designer 0", 1)
    assert (evidence["value"], evidence["threshold"], evidence["trajectory_recall"]) == (2, 2, 0.5)


def test_answering_without_any_search_is_high_severity() -> None:
    [finding] = _detect(_search_record(0), "search_once_then_quit")
    assert finding.severity == "high" and finding.evidence["search_turn"] is None


def test_a_real_search_is_not_flagged() -> None:
    assert _detect(_search_record(3), "search_once_then_quit") == []


def test_the_search_and_turn_thresholds_are_inclusive() -> None:
    assert _detect(_search_record(2), "search_once_then_quit") == []
    assert len(_detect(_search_record(2), "search_once_then_quit", max_searches=2, max_turns=3)) == 1
    assert _detect(_search_record(1, extra_replies=1), "search_once_then_quit") == []  # 3 replies > 2
    assert len(_detect(_search_record(1, extra_replies=1), "search_once_then_quit", max_turns=3)) == 1


def test_a_single_search_that_found_every_gold_document_is_excused() -> None:
    complete = _search_record(1, seen=["d0#0", "d9#0"])
    assert _detect(complete, "search_once_then_quit") == []
    assert len(_detect(complete, "search_once_then_quit", excuse_complete_recall=False)) == 1


def test_other_environments_and_unfinished_episodes_are_not_judged() -> None:
    assert _detect(_search_record(1, env="calculator"), "search_once_then_quit") == []
    assert _detect(_search_record(1, error="context over 4096 tokens"), "search_once_then_quit") == []
    upload = _search_record(1)
    del upload["env"], upload["counts"]  # an upload: judged by its search calls and gold documents
    assert len(_detect(upload, "search_once_then_quit")) == 1


# --- length_blowup ------------------------------------------------------------------------------------------------


def test_a_turn_longer_than_the_limit_is_flagged_with_the_overflow_as_the_span() -> None:
    record = {"id": "l", "turns": [{"role": "user", "content": "q"}, _assistant("a" * 100 + "XYZ")]}
    [finding] = _detect(record, "length_blowup", max_turn_chars=100)
    _core_evidence(finding)
    assert finding.evidence["turn"] == 1 and finding.evidence["span"] == [100, 103]
    assert finding.evidence["excerpt"] == "XYZ" and finding.evidence["measure"] == "turn_chars"
    assert finding.severity == "medium"


def test_a_turn_at_the_limit_is_not_flagged_and_tool_results_do_not_count() -> None:
    record = {"id": "l", "turns": [_assistant("a" * 100), _tool("b" * 10_000)]}
    assert _detect(record, "length_blowup", max_turn_chars=100, max_total_chars=100) == []


def test_a_total_over_the_limit_points_at_the_turn_where_it_crossed() -> None:
    record = {"id": "l", "turns": [_assistant("a" * 60), _tool("ok"), _assistant("b" * 60)]}
    [finding] = _detect(record, "length_blowup", max_turn_chars=100, max_total_chars=100)
    assert finding.evidence["measure"] == "total_chars" and finding.evidence["value"] == 120
    assert finding.evidence["turn"] == 2 and finding.evidence["span"] == [40, 60]


def test_a_length_at_twice_the_limit_is_high_severity() -> None:
    [finding] = _detect({"id": "l", "turns": [_assistant("a" * 200)]}, "length_blowup", max_turn_chars=100)
    assert finding.severity == "high" and finding.evidence["ratio"] == 2.0


# --- repetition ---------------------------------------------------------------------------------------------------


def test_a_looping_reply_is_flagged_with_the_repeated_ngram_and_where_it_first_repeats() -> None:
    text = "Let me think. " + "the answer is four " * 20
    [finding] = _detect({"id": "r", "turns": [_assistant(text)]}, "repetition")
    _core_evidence(finding)
    evidence = finding.evidence
    # 83 words -> 80 four-grams; 4 distinct in the loop plus 3 that start in "Let me think" -> 73 repeats.
    assert (evidence["ngrams"], evidence["distinct_ngrams"]) == (80, 7)
    assert evidence["value"] == round(73 / 80, 4) and finding.severity == "high"
    assert (evidence["ngram"], evidence["count"]) == ("the answer is four", 20)  # its rotations appear 19 times
    start, end = evidence["span"]
    first_start, _ = evidence["first_seen"]["span"]
    assert text[start:end].lower() == evidence["ngram"] and start > first_start
    assert text[first_start:].lower().startswith(evidence["ngram"])


def test_varied_text_is_not_flagged() -> None:
    text = " ".join(f"word{i}" for i in range(200))
    assert _detect({"id": "r", "turns": [_assistant(text)]}, "repetition") == []


def test_the_repeated_fraction_must_exceed_the_threshold() -> None:
    record = {"id": "r", "turns": [_assistant("a a b c")]}  # unigrams: 4, distinct 3 -> 0.25 repeated
    assert _detect(record, "repetition", ngram=1, min_ngrams=1, max_repeated_fraction=0.25, high_fraction=0.9) == []
    [finding] = _detect(record, "repetition", ngram=1, min_ngrams=1, max_repeated_fraction=0.24, high_fraction=0.9)
    assert finding.evidence["value"] == 0.25 and finding.evidence["span"] == [2, 3]
    assert finding.evidence["first_seen"] == {"turn": 0, "span": [0, 1]}
    assert _detect(record, "repetition", ngram=1, min_ngrams=5, max_repeated_fraction=0.24, high_fraction=0.9) == []


def test_repeated_tool_calls_and_markup_are_not_repetition() -> None:
    call = format_tool_call("search_corpus", {"query": "analytical engine"})
    turns = [_assistant(f"Looking up item {i} now. <Document id=d{i}#0>{call}") for i in range(40)]
    assert _detect({"id": "r", "turns": turns}, "repetition", min_ngrams=1) == []
    bare_json = [_assistant(call.removeprefix("<tool_call>").removesuffix("</tool_call>")) for _ in range(40)]
    assert len(_detect({"id": "r", "turns": bare_json}, "repetition", min_ngrams=1)) == 1  # outside a call block


def test_repeats_across_turns_count_and_user_text_does_not() -> None:
    loop = "I will check the results again now"
    turns = [{"role": "user", "content": loop * 30}] + [_assistant(loop) for _ in range(10)]
    [finding] = _detect({"id": "r", "turns": turns}, "repetition")
    assert finding.evidence["turn"] == 2 and finding.evidence["first_seen"]["turn"] == 1


# --- reward_eval_divergence ---------------------------------------------------------------------------------------


def _series(reward: list[tuple[float, float]], evals: list[tuple[float, float]]) -> dict[str, Any]:
    return {"reward_mean": reward, "eval/pass@1": evals}


def test_a_rising_reward_with_a_falling_eval_is_flagged_and_the_slopes_match_numpy() -> None:
    reward = [(step, 0.2 + 0.01 * step + 0.02 * (-1) ** step) for step in range(1, 51)]
    evals = [(10, 0.6), (20, 0.57), (30, 0.5), (40, 0.47), (50, 0.4)]
    [finding] = run_run_detectors(_series(reward, evals), _only("reward_eval_divergence"))
    _core_evidence(finding)
    assert finding.trajectory_id is None and finding.severity == "high"
    in_window = [(x, y) for x, y in reward if 10 <= x <= 50]
    oracle_reward = np.polyfit(*zip(*in_window, strict=True), 1)[0]
    oracle_eval = np.polyfit(*zip(*evals, strict=True), 1)[0]
    assert finding.evidence["reward_slope"] == pytest.approx(oracle_reward, abs=1e-8)
    assert finding.evidence["eval_slope"] == pytest.approx(oracle_eval, abs=1e-8)
    assert finding.evidence["eval_change"] == pytest.approx(oracle_eval * 40, abs=1e-6)
    assert finding.evidence["window"] == {"from_step": 10, "to_step": 50, "eval_points": 5, "reward_points": 41}


def test_a_healthy_run_and_a_run_with_too_few_evals_are_not_flagged() -> None:
    reward = [(step, 0.01 * step) for step in range(50)]
    rising = [(10, 0.4), (20, 0.45), (30, 0.5), (40, 0.55), (49, 0.6)]
    assert run_run_detectors(_series(reward, rising), _only("reward_eval_divergence")) == []
    falling = [(10, 0.6), (20, 0.5), (30, 0.4)]
    assert run_run_detectors(_series(reward, falling), _only("reward_eval_divergence")) == []  # window 5
    assert len(run_run_detectors(_series(reward, falling), _only("reward_eval_divergence", window=3))) == 1


def test_the_divergence_thresholds_are_strict() -> None:
    # Exact in binary: eval slope -0.125/step over 4 steps = -0.5; reward slope 0.25/step = +1.0.
    reward = [(0, 0.0), (1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
    evals = [(0, 1.0), (2, 0.75), (4, 0.5)]
    at_limit = _only("reward_eval_divergence", window=3, min_eval_drop=0.5)
    assert run_run_detectors(_series(reward, evals), at_limit) == []
    [finding] = run_run_detectors(_series(reward, evals), _only("reward_eval_divergence", window=3, min_eval_drop=0.49))
    assert finding.evidence["value"] == -0.5 and finding.evidence["reward_change"] == 1.0
    assert (
        run_run_detectors(_series(reward, evals), _only("reward_eval_divergence", window=3, min_reward_rise=1.0)) == []
    )


def test_the_least_squares_slope_needs_two_distinct_steps() -> None:
    assert least_squares_slope([(1, 0.5)]) is None and least_squares_slope([(1, 0.5), (1, 0.7)]) is None
    assert least_squares_slope([(0, 1.0), (2, 0.0)]) == -0.5


def test_trajectory_detectors_ignore_run_scope_ones() -> None:
    findings = run_detectors({"id": "x", "turns": [_assistant("x" * 9_000)]})
    assert findings and all(get_detector(f.detector).scope == "trajectory" for f in findings)
    with pytest.raises(KeyError, match="unknown detector 'nope'"):
        get_detector("nope")


# --- per-step flag rates ------------------------------------------------------------------------------------------


def test_flag_rates_count_flagged_trajectories_and_each_detector() -> None:
    def finding(detector: str) -> Finding:
        return Finding(detector=detector, version="1", severity="low", evidence={}, trajectory_id="t")

    per_trajectory = [[finding("repetition"), finding("length_blowup")], [finding("repetition")], [], []]
    metrics = flag_metrics(per_trajectory)
    assert metrics == {
        "flags/rate": 0.5,
        "flags/asks_instead_of_acting": 0.0,
        "flags/edits_tests": 0.0,
        "flags/length_blowup": 0.25,
        "flags/malformed_tool_calls": 0.0,
        "flags/repetition": 0.5,
        "flags/search_once_then_quit": 0.0,
        "flags/serial_collapse": 0.0,
        "flags/spurious_parallelism": 0.0,
        "flags/terminal_only": 0.0,
    }
    assert flag_metrics([]) == {}
    assert "flags/repetition" not in flag_metrics([[]], {"repetition": {"enabled": False}})


def test_a_rescore_shard_carries_each_trajectorys_findings() -> None:
    from workers.jobs.rescore import score_shard
    from workers.rewards.schema import validate_reward_spec
    from workers.trajectories import Trajectory

    reward = validate_reward_spec({"terms": [{"type": "exact_match"}]})
    rows = [
        Trajectory.model_validate(_tool_record(malformed=1, errors=0, calls=0)).model_dump(mode="json"),
        Trajectory.model_validate({"id": "clean", "turns": [_assistant("4")]}).model_dump(mode="json"),
    ]
    flagged, clean = score_shard(reward, rows, default_detector_config())
    assert [f.detector for f in flagged["findings"]] == ["malformed_tool_calls"] and clean["findings"] == []
    # A parsed upload keeps role, content and tool only: the malformed call is found from its turns.
    assert flagged["findings"][0].evidence["malformed_tool_calls"] == 1


# --- suggested reward changes ------------------------------------------------------------------------------------

SUGGESTION_SPECS: list[dict[str, Any]] = [
    {"terms": [{"type": "exact_match"}]},
    {
        "terms": [
            {"type": "f_beta", "weight": 0.7},
            {"type": "turn_penalty", "start": 10, "ramp": 4, "max_penalty": 0.2},
        ]
    },
    {
        "terms": [
            {"type": "trajectory_recall", "name": "recall", "weight": 0.3},
            {"type": "turn_penalty", "name": "long", "max_penalty": 0},
        ]
    },
    {"terms": [{"type": "trajectory_recall", "weight": 0}], "floor": 0.0},
    {},
]
_ADD_TURNS = (
    "{}: add a turn_penalty (from 8 turns, up to 0.5 over 16 more) so the long episodes this hack produces cost reward"
)
_DEFAULT_TURNS = {"type": "turn_penalty", "start": 8, "ramp": 16, "max_penalty": 0.5}
# What apps/review/suggestions.suggest_penalty returned for each spec above before the logic moved here (copied,
# since that module is on its way out): "{}" is the detector's name.
TURN_PENALTY_SUGGESTIONS: list[tuple[dict[str, Any], str]] = [
    ({"terms": [{"type": "exact_match"}, _DEFAULT_TURNS]}, _ADD_TURNS),
    (
        {
            "terms": [
                {"type": "f_beta", "weight": 0.7},
                {"type": "turn_penalty", "start": 5, "ramp": 4, "max_penalty": 0.3},
            ]
        },
        "{}: tighten turn_penalty: start 10 -> 5 turns, max_penalty 0.2 -> 0.3",
    ),
    (
        {
            "terms": [
                {"type": "trajectory_recall", "name": "recall", "weight": 0.3},
                {"type": "turn_penalty", "name": "long", "max_penalty": 0.5, "start": 32},
            ]
        },
        "{}: tighten long: start 64 -> 32 turns, max_penalty 0 -> 0.5",
    ),
    ({"terms": [{"type": "trajectory_recall", "weight": 0}, _DEFAULT_TURNS], "floor": 0.0}, _ADD_TURNS),
    ({"terms": [_DEFAULT_TURNS]}, _ADD_TURNS),
]
_ADD_RECALL = (
    "search_once_then_quit: add trajectory_recall (weight 0.5) so searching further pays, instead of answering "
    "after one search"
)
RECALL_SUGGESTIONS: list[tuple[dict[str, Any], str]] = [
    ({"terms": [{"type": "exact_match"}, {"type": "trajectory_recall", "weight": 0.5}]}, _ADD_RECALL),
    (
        {
            "terms": [
                {"type": "f_beta", "weight": 0.7},
                {"type": "turn_penalty", "start": 10, "ramp": 4, "max_penalty": 0.2},
                {"type": "trajectory_recall", "weight": 0.5},
            ]
        },
        _ADD_RECALL,
    ),
    (
        {
            "terms": [
                {"type": "trajectory_recall", "name": "recall", "weight": 0.45},
                {"type": "turn_penalty", "name": "long", "max_penalty": 0},
            ]
        },
        "search_once_then_quit: raise recall's weight 0.3 -> 0.45",
    ),
    (
        {"terms": [{"type": "trajectory_recall", "weight": 0.5}], "floor": 0.0},
        "search_once_then_quit: raise trajectory_recall's weight 0 -> 0.5",
    ),
    ({"terms": [{"type": "trajectory_recall", "weight": 0.5}]}, _ADD_RECALL),
]


SWARM_DETECTORS = ("serial_collapse", "spurious_parallelism")


# The swarm detectors suggest PARL terms, tested with them in tests/workers/swarm/test_swarm_detectors.py.
@pytest.mark.parametrize("name", [*(n for n in detectors() if n not in SWARM_DETECTORS), "a_retired_detector"])
def test_suggest_penalty_gives_what_the_control_plane_suggested_for_every_detector(name: str) -> None:
    from workers.detectors import suggest_penalty

    if name == "search_once_then_quit":
        expected = RECALL_SUGGESTIONS
    else:  # every other detector's hacks spend turns: the generic turn penalty, also for a name no longer known
        expected = [(spec, reason.format(name)) for spec, reason in TURN_PENALTY_SUGGESTIONS]
    for spec, (proposed, reason) in zip(SUGGESTION_SPECS, expected, strict=True):
        before = json.dumps(spec, sort_keys=True)
        assert suggest_penalty(spec, name) == (proposed, reason), spec
        assert json.dumps(spec, sort_keys=True) == before  # the spec under review is left alone
        assert proposed != spec


def test_a_detector_offers_its_own_suggestion_or_none_for_the_generic_one() -> None:
    spec = {"terms": [{"type": "exact_match"}]}
    assert get_detector("search_once_then_quit").suggest(spec) == RECALL_SUGGESTIONS[0]
    for name in ("length_blowup", "malformed_tool_calls", "repetition", "reward_eval_divergence"):
        assert get_detector(name).suggest(spec) is None
