"""The trajectory JSONL format and its line-accurate parser."""

from __future__ import annotations

import json

from workers.trajectories import LineError, Trajectory, parse_trajectories_jsonl, trajectory_jsonl_example


def _lines(*rows: object) -> bytes:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows).encode()


def test_example_parses_cleanly_into_two_trajectories() -> None:
    example = trajectory_jsonl_example()
    assert len(example.strip().splitlines()) == 2
    result = parse_trajectories_jsonl(example.encode())
    assert result.errors == [] and result.ok
    assert [t.id for t in result.trajectories] == ["traj-0001", "traj-0002"]
    assert result.trajectories[1].error


def test_defaults_fill_missing_optional_fields() -> None:
    traj = Trajectory.model_validate({"id": "a"})
    assert traj.task_id == "" and traj.answer is None and traj.error is None
    assert traj.gold_answers == traj.output_doc_ids == traj.seen_doc_ids == traj.answer_doc_ids == []
    assert traj.turns == [] and traj.num_turns == 0 and traj.tool_calls == []


def test_unknown_fields_are_ignored() -> None:
    traj = Trajectory.model_validate({"id": "a", "model": "gpt-oss-20b", "turns": [{"role": "user", "ts": 1}]})
    assert traj.id == "a" and traj.turns[0].role == "user"


def test_num_turns_counts_assistant_turns_and_tool_calls_keep_call_order() -> None:
    traj = Trajectory.model_validate(
        {
            "id": "a",
            "turns": [
                {"role": "system", "content": "..."},
                {"role": "user", "content": "q"},
                {"role": "assistant", "tool": "search_corpus", "args": {"query": "x"}},
                {"role": "tool", "tool": "search_corpus", "content": "results"},
                {"role": "assistant", "tool": "prune_chunks", "args": {"chunk_ids": ["c1"]}},
                {"role": "tool", "tool": "prune_chunks", "content": "ok"},
                {"role": "assistant", "content": "final"},
            ],
        }
    )
    assert traj.num_turns == 3
    assert traj.tool_calls == ["search_corpus", "prune_chunks"]
    assert traj.turns[2].args == {"query": "x"}


def test_blank_error_means_the_trajectory_completed() -> None:
    assert Trajectory.model_validate({"id": "a", "error": ""}).error is None
    assert Trajectory.model_validate({"id": "a", "error": "timeout"}).error == "timeout"


def test_blank_lines_are_skipped_and_not_counted() -> None:
    data = b'\n{"id": "a"}\n\n   \n{"id": "b"}\r\n\n'
    result = parse_trajectories_jsonl(data)
    assert result.errors == []
    assert [t.id for t in result.trajectories] == ["a", "b"]
    assert result.row_count == 2


def test_invalid_json_on_line_2_is_reported_with_its_line_number() -> None:
    result = parse_trajectories_jsonl(_lines({"id": "a"}, '{"id": "b",', {"id": "c"}))
    assert [e.line for e in result.errors] == [2]
    assert result.errors[0].message.startswith("invalid JSON")
    assert [t.id for t in result.trajectories] == ["a", "c"]
    assert result.row_count == 3 and not result.ok


def test_missing_id_error_names_the_field() -> None:
    result = parse_trajectories_jsonl(_lines({"id": "a"}, {"id": "b"}, {"task_id": "t"}))
    assert result.errors == [LineError(3, "field 'id': Field required")]
    assert str(result.errors[0]) == "line 3: field 'id': Field required"


def test_empty_id_is_rejected() -> None:
    result = parse_trajectories_jsonl(_lines({"id": ""}))
    assert result.errors[0].line == 1 and "field 'id'" in result.errors[0].message


def test_nested_schema_errors_give_the_full_field_path() -> None:
    result = parse_trajectories_jsonl(_lines({"id": "a", "turns": [{"role": "user"}, {"content": "x"}]}))
    assert result.errors[0].message == "field 'turns[1].role': Field required"


def test_several_schema_errors_on_one_line_are_reported_together() -> None:
    result = parse_trajectories_jsonl(_lines({"gold_doc_ids": "d1"}))
    (error,) = result.errors
    assert "field 'id'" in error.message and "field 'gold_doc_ids'" in error.message


def test_duplicate_id_points_at_the_first_occurrence() -> None:
    result = parse_trajectories_jsonl(_lines({"id": "a"}, {"id": "b"}, {"id": "a"}))
    (error,) = result.errors
    assert error.line == 3
    assert "field 'id'" in error.message and "duplicate" in error.message and "line 1" in error.message
    assert [t.id for t in result.trajectories] == ["a", "b"]


def test_non_object_lines_are_rejected() -> None:
    result = parse_trajectories_jsonl(_lines([1, 2], '"text"', "null", {"id": "a"}))
    assert [e.line for e in result.errors] == [1, 2, 3]
    assert "expected a JSON object, got an array" in result.errors[0].message


def test_non_utf8_line_is_reported_on_that_line() -> None:
    data = b'{"id": "a"}\n{"id": "caf\xe9"}\n{"id": "b"}\n'
    result = parse_trajectories_jsonl(data)
    (error,) = result.errors
    assert error.line == 2 and "UTF-8" in error.message
    assert [t.id for t in result.trajectories] == ["a", "b"]


def test_utf8_byte_order_mark_is_ignored() -> None:
    result = parse_trajectories_jsonl(b'\xef\xbb\xbf{"id": "a"}\n')
    assert result.errors == [] and result.trajectories[0].id == "a"


def test_max_errors_limits_the_stored_errors_but_counts_them_all() -> None:
    data = _lines(*(["not json"] * 10), {"id": "ok"})
    result = parse_trajectories_jsonl(data, max_errors=3)
    assert [e.line for e in result.errors] == [1, 2, 3]
    assert result.error_count == 10 and result.row_count == 11
    assert [t.id for t in result.trajectories] == ["ok"]


def test_trajectories_round_trip_through_model_dump() -> None:
    (traj, _) = parse_trajectories_jsonl(trajectory_jsonl_example().encode()).trajectories
    assert Trajectory.model_validate(traj.model_dump(mode="json")) == traj
