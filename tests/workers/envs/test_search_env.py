"""The Context-1 search harness: tools, token budget, pruning, dedup, final output, reward and metrics.

The index is real (workers.search.index, BM25 only so the tests need no embedder); the agent is scripted replies,
which is what a policy's text is to the environment.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from workers.envs.registry import make_env
from workers.envs.toolcalls import format_tool_call
from workers.rewards.schema import context1_spec, with_f_beta
from workers.rewards.score import score_trajectory
from workers.search.environment import SearchEnv
from workers.search.index import IndexConfig, SearchIndex
from workers.search.metrics import ensemble_metrics, ensemble_outputs, episode_metrics
from workers.search.tools import parse_final_output
from workers.search.types import Chunk
from workers.trajectories import Trajectory

TEXTS = {
    "lighthouse": [
        "The Bell Rock lighthouse stands on a reef off the coast of Angus and was built between 1807 and 1810.",
        "Its engineer was Robert Stevenson, whose sons also built lighthouses around Scotland.",
    ],
    "bridge": [
        "The Forth Bridge is a cantilever railway bridge across the Firth of Forth, opened in 1890.",
        "Its designers were John Fowler and Benjamin Baker.",
    ],
    "canal": [
        "The Caledonian Canal connects the east coast of Scotland at Inverness with the west coast at Corpach.",
        "Thomas Telford surveyed the route; the canal opened in 1822.",
    ],
    "castle": ["Edinburgh Castle sits on Castle Rock, a volcanic plug, and dominates the city skyline."],
    "noise": ["a" * 40 + "!"],  # makes (a|aa)+$ backtrack catastrophically
    "loch": ["Loch Ness is a large freshwater loch in the Highlands, part of the Great Glen along with the canal."],
}


def _chunks() -> list[Chunk]:
    return [
        Chunk(chunk_id=f"{doc}#{i}", doc_id=doc, position=i, text=text, title=doc.title())
        for doc, texts in TEXTS.items()
        for i, text in enumerate(texts)
    ]


@pytest.fixture(scope="module")
def index() -> SearchIndex:
    return SearchIndex.build(_chunks(), IndexConfig(dense=False))


def _task(**extra: Any) -> dict[str, Any]:
    return {
        "id": "t1",
        "prompt": "Who was the engineer of the Bell Rock lighthouse?",
        "answer": "Robert Stevenson",
        "gold_chunk_ids": ["lighthouse#0", "lighthouse#1"],
        "answer_chunk_ids": ["lighthouse#1"],
        **extra,
    }


def _env(index: SearchIndex, **params: Any) -> SearchEnv:
    env = make_env("search", index_uri="memory://test", **params)
    assert isinstance(env, SearchEnv)
    env.bind_index(index)
    env.reset(env.validate_task_row(_task()))
    return env


def _initial_usage(index: SearchIndex) -> int:
    """Tokens of the system prompt, tool schemas and question: the budget tests set their limits above it."""
    return _env(index).trajectory_fields()["token_usage"][0]


def _call(name: str, **arguments: Any) -> str:
    return format_tool_call(name, arguments)


USAGE = re.compile(r"\[Token usage: ([\d,]+)/([\d,]+)\]")


def _usage(text: str) -> int:
    match = USAGE.search(text)
    assert match, text
    return int(match.group(1).replace(",", ""))


def test_search_results_are_labelled_with_chunk_ids_and_every_turn_ends_with_the_usage_line(index) -> None:
    env = _env(index)
    result = env.step(_call("search_corpus", query="Bell Rock lighthouse engineer"))
    assert not result.done and result.observation is not None
    text = result.observation.messages[-1]["content"]
    assert "[chunk lighthouse#" in text and "| doc lighthouse" in text
    assert _usage(text) == result.info["token_usage"] > 0
    assert text.rstrip().endswith(f"/{env.token_budget:,}]")


def test_a_repeated_search_never_shows_a_chunk_twice(index) -> None:
    env = _env(index, top_k=2)
    first = env.step(_call("search_corpus", query="Scotland coast lighthouse canal"))
    second = env.step(_call("search_corpus", query="Scotland coast lighthouse canal"))
    ids = lambda r: set(re.findall(r"\[chunk (\S+) \|", r.observation.messages[-1]["content"]))  # noqa: E731
    assert ids(first) and ids(second) and not ids(first) & ids(second)
    record_turns = [t for t in env._turns if t.get("role") == "tool"]
    shown = [r["chunk_id"] for t in record_turns for r in t["results"]]
    assert len(shown) == len(set(shown)) == 4


def test_usage_grows_and_the_soft_message_appears_in_training_only(index) -> None:
    # The soft threshold sits between the first and the second turn's usage.
    initial = _initial_usage(index)
    budget = initial + 400
    for training, expect in ((True, True), (False, False)):
        env = _env(
            index,
            token_budget=budget,
            reserve_tokens=20,
            result_budget=60,
            soft_threshold=(initial + 90) / budget,
            hard_cutoff=0.99,
            training=training,
        )
        first = env.step(_call("search_corpus", query="bridge"))
        second = env.step(_call("search_corpus", query="canal"))
        assert _usage(second.observation.messages[-1]["content"]) > _usage(first.observation.messages[-1]["content"])
        assert ("Consider pruning" in second.observation.messages[-1]["content"]) is expect


def test_over_the_hard_cutoff_only_prune_runs(index) -> None:
    initial = _initial_usage(index)
    budget = initial + 400
    hard = (initial + 40) / budget
    env = _env(index, token_budget=budget, reserve_tokens=20, result_budget=120, soft_threshold=hard, hard_cutoff=hard)
    env.step(_call("search_corpus", query="bridge railway Forth"))
    refused = env.step(_call("search_corpus", query="canal"))
    text = refused.observation.messages[0]["content"]
    assert "refused" in text and "only prune_chunks" in text
    assert refused.info["tool_errors"] == 1
    seen = env.trajectory_fields()["seen_doc_ids"]
    pruned = env.step(_call("prune_chunks", chunk_ids=seen))
    assert pruned.info["tool_errors"] == 0 and pruned.info["view_changed"]


def test_results_are_cut_to_the_per_call_budget(index) -> None:
    env = _env(index, result_budget=30, top_k=5)
    result = env.step(_call("search_corpus", query="Scotland coast canal lighthouse bridge"))
    text = result.observation.messages[-1]["content"]
    assert "token budget" in text
    detail = [t for t in env._turns if t.get("role") == "tool"][-1]
    assert detail["truncated"] is True and 1 <= len(detail["results"]) < 5


def test_prune_rewrites_the_view_but_the_reward_still_sees_the_chunk(index) -> None:
    env = _env(index)
    env.step(_call("search_corpus", query="Bell Rock lighthouse"))
    shown = env.trajectory_fields()["seen_doc_ids"]
    assert "lighthouse#0" in shown
    before = env.messages[-1]["content"]
    result = env.step(_call("prune_chunks", chunk_ids=["lighthouse#0", "nope#9"]))
    assert result.info["view_changed"] is True and env.view_changed
    view = "\n".join(m["content"] for m in env.messages)
    assert "[chunk lighthouse#0 pruned]" in view and "1807 and 1810" not in view
    assert "1807 and 1810" in before
    assert "not in your context, ignored: nope#9" in result.observation.messages[0]["content"]
    env.step("<Document id=lighthouse#1><Justification>names the engineer</Justification></Document> Robert Stevenson")
    record = env.trajectory("r1")
    assert "lighthouse#0" in record["seen_doc_ids"] and record["pruned_chunk_ids"] == ["lighthouse#0"]
    assert record["counts"]["prune_chunks_calls"] == 1
    # The turn list keeps the unpruned result text for the reward and the trajectory page.
    assert any("1807 and 1810" in t["content"] for t in record["turns"] if t["role"] == "tool")


def test_a_search_and_a_prune_in_one_reply_hide_the_pruned_chunk_at_once(index) -> None:
    env = _env(index, top_k=1)
    both = _call("search_corpus", query="Bell Rock lighthouse reef") + _call("prune_chunks", chunk_ids=["lighthouse#0"])
    result = env.step(both)
    assert result.observation.messages[0]["content"].startswith("[chunk lighthouse#0 pruned]")
    assert "1807 and 1810" not in "\n".join(m["content"] for m in env.messages)


def test_pruning_only_unknown_ids_is_a_tool_error_and_changes_nothing(index) -> None:
    env = _env(index)
    env.step(_call("search_corpus", query="castle"))
    result = env.step(_call("prune_chunks", chunk_ids=["castle#7"]))
    assert result.info["tool_errors"] == 1 and not result.info["view_changed"]
    assert "use chunk ids shown in passage labels" in result.observation.messages[0]["content"]


def test_read_document_lists_its_chunks_and_an_unknown_id_is_an_error(index) -> None:
    env = _env(index)
    result = env.step(_call("read_document", doc_id="canal"))
    text = result.observation.messages[0]["content"]
    assert "[chunk canal#0" in text and "[chunk canal#1" in text
    bad = env.step(_call("read_document", doc_id="bridge#1"))
    assert (
        "unknown document 'bridge#1' (chunk bridge#1 belongs to document bridge)"
        in bad.observation.messages[0]["content"]
    )


def test_grep_matches_and_a_runaway_pattern_is_an_error_observation(index) -> None:
    env = _env(index)
    found = env.step(_call("grep_corpus", pattern=r"Telford|Stevenson"))
    assert "[chunk canal#1" in found.observation.messages[0]["content"]
    for pattern, message in (("(unclosed", "invalid regular expression"), ("(a|aa)+$", "longer than")):
        bad = env.step(_call("grep_corpus", pattern=pattern))
        assert bad.observation.messages[0]["content"].startswith("error:")
        assert message in bad.observation.messages[0]["content"]
    assert env.counts["tool_errors"] >= 1


def test_malformed_calls_and_empty_queries_come_back_as_observations(index) -> None:
    env = _env(index)
    result = env.step('<tool_call>{"name": "search_corpus", "arguments": {"q": 1}}</tool_call>')
    assert result.info["malformed_tool_calls"] == 1 and not result.done
    empty = env.step(_call("search_corpus", query="   "))
    assert "the query is empty" in empty.observation.messages[0]["content"]


def test_max_turns_ends_the_episode_without_an_answer(index) -> None:
    env = _env(index, max_turns=2)
    env.step(_call("search_corpus", query="loch"))
    last = env.step(_call("search_corpus", query="castle"))
    assert last.done and env.trajectory("x")["error"].startswith("no final answer")


def test_turns_count_replies_in_max_turns_the_metric_and_the_turn_penalty(index) -> None:
    from workers.rewards.term_types import TurnPenaltyTerm
    from workers.trajectories import Trajectory

    env = _env(index, max_turns=3)
    three_calls = "".join(_call("search_corpus", query=q) for q in ("loch", "castle", "reef"))
    env.step(three_calls)  # one reply, three calls
    env.step(_call("grep_corpus", pattern="lighthouse"))
    env.step('<Document id="lighthouse#0"></Document>')
    record = env.trajectory("x")
    trajectory = Trajectory.model_validate(record)
    assert record["counts"]["turns"] == 3 and record["counts"]["tool_calls"] == 4
    assert len(trajectory.tool_calls) == 4
    assert trajectory.num_turns == 3  # the same count max_turns allowed
    assert TurnPenaltyTerm(start=1, ramp=4).value(trajectory) == pytest.approx(0.5 * 2 / 4)


@pytest.mark.parametrize(
    ("text", "ids", "answer"),
    [
        ('<Document id="a#1"><Justification>x</Justification></Document> Answer: 7', ["a#1"], "Answer: 7"),
        ("<Document id=a#1></Document><Document id='b#2'>", ["a#1", "b#2"], None),
        ("<document ID = a#1>unclosed", ["a#1"], None),
        ("<Document id=a#1></Document><Document id=a#1></Document>", ["a#1"], None),
        ("no documents at all", [], "no documents at all"),
    ],
)
def test_final_output_parsing(text: str, ids: list[str], answer: str | None) -> None:
    items, rest = parse_final_output(text, max_items=10)
    assert [item.id for item in items] == ids
    assert rest == answer


def test_output_is_capped_at_max_output_docs() -> None:
    text = "".join(f"<Document id=d#{i}></Document>" for i in range(15))
    items, _ = parse_final_output(text, max_items=10)
    assert len(items) == 10


def _finished(index: SearchIndex, final: str) -> dict[str, Any]:
    env = _env(index)
    env.step(_call("search_corpus", query="Bell Rock lighthouse engineer Stevenson"))
    env.step(final)
    return env.trajectory("r")


def test_the_context1_reward_scores_a_finished_episode(index) -> None:
    good = _finished(index, "<Document id=lighthouse#1></Document><Document id=lighthouse#0></Document>")
    spec = context1_spec(beta=4.0)
    result = score_trajectory(spec, Trajectory.model_validate(good))
    # F_beta = 1, r_traj = 1, r_fa = 1: r = min(max(0.7 + 0.3 + 1, eps), r_pre) = 2
    assert result.terms["f_beta"] == pytest.approx(1.0)
    assert result.terms["final_answer_bonus"] == pytest.approx(1.0)
    assert result.reward == pytest.approx(2.0)
    partial = _finished(index, "<Document id=lighthouse#0></Document><Document id=castle#0></Document>")
    scored = score_trajectory(with_f_beta(spec, 2.0), Trajectory.model_validate(partial))
    # P = 1/2, R = 1/2 -> F_2 = 5 * 0.25 / (4 * 0.5 + 0.5) = 0.5; no answer chunk in the output
    assert scored.terms["f_beta"] == pytest.approx(0.5)
    assert scored.terms["final_answer_bonus"] == 0.0


def test_episode_metrics_and_the_rrf_ensemble(index) -> None:
    record = _finished(index, "<Document id=lighthouse#1></Document><Document id=castle#0></Document>")
    metrics = episode_metrics(record)
    assert metrics["final_answer_found"] == 1.0
    assert metrics["output_recall"] == 0.5 and metrics["output_precision"] == 0.5
    assert metrics["output_f1"] == pytest.approx(0.5)
    assert metrics["trajectory_recall"] == 1.0 and metrics["turns"] == 2.0
    # docs/methods.md R1 with k = 60: b is ranked 2nd and 1st -> 1/62 + 1/61 beats a's 1/61 + 0
    assert ensemble_outputs([["a", "b"], ["b"]]) == ["b", "a"]
    other = dict(record, output_doc_ids=["lighthouse#0"], seen_doc_ids=["lighthouse#0"])
    fused = ensemble_metrics([record, other, other])
    assert fused["output_recall"] == 1.0


def test_facts_are_scored_when_any_of_their_chunks_is_found(index) -> None:
    env = make_env("search", index_uri="memory://test")
    assert isinstance(env, SearchEnv)
    env.bind_index(index)
    # Two facts: the engineer (in lighthouse#1, or copied into castle#0), and the reef (lighthouse#0 only).
    facts = [["lighthouse#1", "castle#0"], ["lighthouse#0"]]
    env.reset(env.validate_task_row(_task(gold_facts=facts)))
    env.step("<Document id=castle#0></Document>")
    record = env.trajectory("x")
    assert record["gold_facts"] == facts
    metrics = episode_metrics(record)
    assert metrics["fact_recall"] == 0.5  # the first fact through its copy; the chunk recall says 0
    assert metrics["output_recall"] == 0.0
    assert "fact_recall" not in episode_metrics({**record, "gold_facts": []})
    assert SearchEnv.referenced_chunk_ids(_task(gold_facts=facts)) >= {"castle#0", "lighthouse#0"}
    with pytest.raises(ValueError, match="field 'gold_facts' must be a non-empty list of facts"):
        SearchEnv.validate_task_row(_task(gold_facts=[["a#0"], []]), index=1)


def test_task_rows_need_gold_chunk_ids() -> None:
    with pytest.raises(ValueError, match="gold_chunk_ids"):
        SearchEnv.validate_task_row({"id": 1, "prompt": "q"}, index=3)
    with pytest.raises(ValueError, match="task row 2: field 'answer_chunk_ids' must hold chunk id strings"):
        SearchEnv.validate_task_row(
            {"id": 1, "prompt": "q", "gold_chunk_ids": ["a#0"], "answer_chunk_ids": [3]}, index=2
        )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"token_budget": 10}, "token_budget must be an integer >= 256"),
        ({"soft_threshold": 1.5}, "soft_threshold must be a fraction"),
        ({"hard_cutoff": 0.2}, "hard_cutoff must be a fraction of the budget in [soft_threshold=0.5, 1]"),
        ({"reserve_tokens": 20_000}, "reserve_tokens (20000) must be under half of token_budget"),
        ({"grep_timeout_s": 0}, "grep_timeout_s must be in (0, 10]"),
    ],
)
def test_bad_knobs_are_refused_with_the_field_named(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        make_env("search", index_uri="memory://x", **params)
    assert message in str(excinfo.value)


def test_a_task_whose_gold_is_documents_scores_the_documents_of_its_output(index) -> None:
    """Document gold (a BEIR import): output, seen and gold ids are documents; the reward and the metrics use the
    same formulas on them."""
    env = make_env("search", index_uri="memory://test")
    assert isinstance(env, SearchEnv)
    env.bind_index(index)
    row = {"id": "q1", "prompt": "Who built the Forth Bridge?", "gold_doc_ids": ["bridge", "lighthouse"]}
    env.reset(env.validate_task_row(row))
    env.step(format_tool_call("search_corpus", {"query": "Forth Bridge designers"}))
    env.step("<Document id=bridge#1></Document><Document id=bridge#0></Document><Document id=castle#0></Document>")
    record = env.trajectory("x")
    assert record["gold_level"] == "document" and record["gold_doc_ids"] == ["bridge", "lighthouse"]
    assert record["output_doc_ids"] == ["bridge", "castle"]  # two chunks of one document count once
    assert "bridge" in record["seen_doc_ids"] and all("#" not in d for d in record["seen_doc_ids"])
    metrics = episode_metrics(record)
    assert metrics["output_recall"] == 0.5 and metrics["output_precision"] == 0.5
    result = score_trajectory(with_f_beta(context1_spec(beta=1.0), 1.0), Trajectory.model_validate(record))
    assert result.terms["f_beta"] == pytest.approx(0.5)
    assert SearchEnv.referenced_chunk_ids(row) == set()
    with pytest.raises(ValueError, match="task row 4: field 'gold_doc_ids' must be a non-empty list of document id"):
        SearchEnv.validate_task_row({"id": 1, "prompt": "q", "gold_doc_ids": ["a", 3]}, index=4)
    with pytest.raises(ValueError, match="missing field 'gold_chunk_ids'.*or 'gold_doc_ids'"):
        SearchEnv.validate_task_row({"id": 1, "prompt": "q"}, index=3)
