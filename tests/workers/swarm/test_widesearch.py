"""WideSearch tasks as published (workers.swarm.widesearch) and the cell rules their evaluation specs name
(workers.rewards.table_widesearch), scored through the table scorer against hand-computed values."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from workers.rewards.table import gold_table_from
from workers.rewards.table_score import cell_score, score_table
from workers.rewards.table_widesearch import date_near, extract_number, in_match, norm_date, norm_str, url_match
from workers.swarm.widesearch import WideSearchError, read_widesearch_zip

LIMIT = 10_000_000
GOLD = (
    "Company Name,Founded,Revenue,Website,Summary\n"
    "Acme Corp,1999-03-15,120.5,https://www.acme.example/about,makes anvils\n"
    "Globex,2004-07-01,88,https://globex.example,sells everything\n"
)
EVALUATION = {
    "unique_columns": ["companyname"],
    "required": ["companyname", "founded", "revenue", "website", "summary"],
    "eval_pipeline": {
        "companyname": {"preprocess": ["norm_str"], "metric": ["exact_match"]},
        "founded": {"preprocess": ["norm_date"], "metric": ["date_near"]},
        "revenue": {"preprocess": ["extract_number"], "metric": ["number_near"], "criterion": 0.1},
        "website": {"metric": ["url_match"]},
        "summary": {"metric": ["llm_judge"], "criterion": "the gist of what the company does"},
    },
}


def ws_zip(rows: list[dict], tables: dict[str, str], *, queries_name: str = "widesearch.jsonl") -> bytes:  # type: ignore[type-arg]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(queries_name, "".join(json.dumps(r) + "\n" for r in rows))
        for name, text in tables.items():
            archive.writestr(f"widesearch_gold/{name}.csv", text)
    return buffer.getvalue()


def instance(**changes):  # type: ignore[no-untyped-def]
    row = {
        "instance_id": "ws_en_001",
        "query": "For each of these companies, give the founding date, revenue, website and a summary.",
        "evaluation": json.dumps(EVALUATION),  # JSON-encoded, as the Hugging Face export holds it
        "language": "en",
    }
    return {**row, **changes}


def test_a_published_task_keeps_its_own_metrics_tolerances_and_preprocessors() -> None:
    [task] = read_widesearch_zip(ws_zip([instance()], {"ws_en_001": GOLD}), judge_columns="drop", max_bytes=LIMIT).tasks
    table = task["table"]
    assert task["id"] == "ws_en_001" and task["task_kind"] == "wide" and task["language"] == "en"
    assert table["columns"] == ["Company Name", "Founded", "Revenue", "Website"]  # Summary (llm_judge) dropped
    assert table["key_columns"] == ["Company Name"] and table["aliases"] == {"Company Name": ["companyname"]}
    assert table["metrics"] == {"Founded": "date_near", "Revenue": "number_near", "Website": "url_match"}
    assert table["tolerances"] == {"Revenue": 0.1}
    assert table["preprocess"] == {
        "Company Name": ["norm_str"],
        "Founded": ["norm_date"],
        "Revenue": ["extract_number"],
    }
    assert task["widesearch"]["departures"] == ["summary: llm_judge column left out (judge_columns=drop)"]
    gold = gold_table_from(table, where="table")
    answer = (
        "| Company Name | Founded | Revenue | Website |\n| --- | --- | --- | --- |\n"
        "| Acme Corp | March 20, 1999 | $130 million | [site](http://acme.example) |\n"  # revenue 7.9% off; www. host
        "| Globex | 2005 | 88 | https://globex.example/home |\n"  # founded 6 months off
    )
    score = score_table(answer, gold)
    # Acme: date within 31 days (1), 130 vs 120.5 within 10% (1), host www.acme.example != acme.example (0) -> 3/4
    # Globex: 2005-01-01 vs 2004-07-01 is 184 days (0), revenue (1), host (1) -> 3/4
    assert score.item_f1 == pytest.approx(6 / 8) and score.row_f1 == 0.0 and score.matched_rows == 2


def test_judge_columns_refuse_by_default_and_can_be_scored_by_exact_match() -> None:
    data = ws_zip([instance()], {"ws_en_001": GOLD})
    with pytest.raises(WideSearchError, match="column 'summary' is scored by llm_judge.*judge_columns=exact_match"):
        read_widesearch_zip(data, max_bytes=LIMIT)
    [task] = read_widesearch_zip(data, judge_columns="exact_match", max_bytes=LIMIT).tasks
    assert "Summary" in task["table"]["columns"] and task["table"]["metrics"]["Summary"] == "exact_match"
    keyed = {**EVALUATION, "eval_pipeline": {"companyname": {"metric": ["llm_judge"]}}}
    with pytest.raises(WideSearchError, match="not for a key column"):
        read_widesearch_zip(
            ws_zip([instance(evaluation=keyed)], {"ws_en_001": GOLD}), judge_columns="drop", max_bytes=LIMIT
        )


@pytest.mark.parametrize(
    ("rows", "tables", "expected"),
    [
        ([instance()], {}, "widesearch.jsonl line 1: no gold table ws_en_001.csv"),
        ([instance()], {"ws_en_001": "Company Name,Founded\nAcme,1999\n"}, "ws_en_001.csv: no column revenue, website"),
        ([instance(evaluation="{oops")], {"ws_en_001": GOLD}, "line 1: field 'evaluation' is a string but not JSON"),
        ([instance(query="")], {"ws_en_001": GOLD}, "line 1: field 'query' must be a non-empty string"),
        ([instance(), instance()], {"ws_en_001": GOLD}, "line 2: instance_id 'ws_en_001' is already used on line 1"),
        (
            [instance(evaluation={**EVALUATION, "eval_pipeline": {"revenue": {"metric": ["fuzzy"]}}})],
            {"ws_en_001": GOLD},
            "field 'evaluation.eval_pipeline['revenue'].metric' is 'fuzzy'",
        ),
        (
            [
                instance(
                    evaluation={**EVALUATION, "eval_pipeline": {"revenue": {"metric": ["number_near"], "criterion": 5}}}
                )
            ],
            {"ws_en_001": GOLD},
            "criterion' must be a relative tolerance",
        ),
        (
            [instance(evaluation={**EVALUATION, "unique_columns": ["ceo"]})],
            {"ws_en_001": GOLD},
            "field 'evaluation.unique_columns' names ceo, not required",
        ),
        (
            [instance()],
            {"ws_en_001": "Company Name,Founded,Revenue,Website,Summary\nAcme,1999\n"},
            "row 2: 2 cells for 5 columns",
        ),
    ],
)
def test_malformed_tasks_are_refused_naming_the_file_line_and_field(rows, tables, expected) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WideSearchError) as caught:
        read_widesearch_zip(ws_zip(rows, tables), judge_columns="drop", max_bytes=LIMIT)
    assert any(expected in e for e in caught.value.errors), caught.value.errors


def test_archive_problems() -> None:
    with pytest.raises(WideSearchError, match="not a readable zip"):
        read_widesearch_zip(b"nope", max_bytes=LIMIT)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("a.jsonl", "")
        archive.writestr("b.jsonl", "")
    with pytest.raises(WideSearchError, match="exactly one .jsonl file"):
        read_widesearch_zip(buffer.getvalue(), max_bytes=LIMIT)
    with pytest.raises(WideSearchError, match="unpack to"):
        read_widesearch_zip(ws_zip([instance()], {"ws_en_001": GOLD}), max_bytes=10)
    with pytest.raises(WideSearchError, match="judge_columns: must be one of"):
        read_widesearch_zip(b"", judge_columns="ask", max_bytes=LIMIT)  # type: ignore[arg-type]


def test_widesearch_cell_rules_by_hand() -> None:
    assert norm_str(" Acme  Corp* ") == "acmecorp" and extract_number("$1,234.5 million") == "1234.5"
    assert extract_number("none") == "NULL" and extract_number("12.5%") == "12.5%"
    assert norm_date("3rd March 2020") == "2020-03-03" and norm_date("sometime") == "sometime"
    assert date_near("2020-01-01", "January 31, 2020") == 1.0 and date_near("2020-01-01", "2020-02-02") == 0.0
    assert date_near("soon", "later") == 1.0 and date_near("soon", "2020") == 0.0  # as WideSearch: neither a date
    assert url_match("see https://a.example/x and http://b.example", "http://b.example/y https://a.example") == 1.0
    assert url_match("https://a.example", "https://c.example") == 0.0 and url_match("n/a", "n/a") == 1.0
    assert in_match("anvil", "makes anvils") == 1.0 and in_match("anvils and more", "anvils") == 0.0
    assert cell_score("Acme  Corp", "acme corp", "exact_match", steps=["norm_str"]) == 1.0
    assert cell_score("", "2020", "date_near", steps=["norm_date"]) == 0.0  # a blank prediction still scores 0
    assert cell_score("1.05", "1", "number_near", 0.1) == 1.0 and cell_score("1.2", "1", "number_near", 0.1) == 0.0


def test_a_table_spec_with_bad_per_column_rules_is_refused() -> None:
    base = {"columns": ["k", "v"], "key_columns": ["k"], "rows": [{"k": "a", "v": "1"}]}
    from workers.rewards.table import TableSpecError

    with pytest.raises(TableSpecError, match=r"table.tolerances\['v'\] must be a relative tolerance"):
        gold_table_from({**base, "tolerances": {"v": 2}}, where="table")
    with pytest.raises(TableSpecError, match="table.preprocess names column 'w'"):
        gold_table_from({**base, "preprocess": {"w": ["norm_str"]}}, where="table")
    with pytest.raises(TableSpecError, match=r"table.preprocess\['v'\] must be a list of norm_str"):
        gold_table_from({**base, "preprocess": {"v": ["upper"]}}, where="table")
    assert "tolerances" not in gold_table_from(base, where="table").to_json()  # rows made before stay as they were


def test_a_member_that_lies_about_its_size_is_a_named_error_not_a_crash() -> None:
    from tests.workers.search.test_beir import lying_size

    with pytest.raises(WideSearchError, match="widesearch.jsonl cannot be read"):
        read_widesearch_zip(lying_size(ws_zip([instance()], {"ws_en_001": GOLD})), max_bytes=LIMIT)
