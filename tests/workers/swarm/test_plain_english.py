"""Wide tasks written by anyone (issue 40 part 2): reading a question in plain English, reading a cell out of any
text, and the scripted teacher filling a table over a corpus it was not written for."""

from __future__ import annotations

import pytest

from workers.envs.base import TaskFieldError
from workers.envs.registry import make_env
from workers.search.corpus import Document, build_corpus
from workers.search.extract import entity_score, extract_cell, extract_cells
from workers.search.index import IndexConfig, SearchIndex
from workers.search.index_store import save_index
from workers.swarm.metrics import swarm_episode_metrics
from workers.swarm.scripted import ScriptedOrchestrator, run_episode
from workers.swarm.wide_reading import asked_columns, condition_terms, listed_items, read_wide_task, task_brief

HEADER = "\n\nAnswer with one Markdown table with the columns: city | population | mayor"


@pytest.mark.parametrize(
    ("question", "items"),
    [
        ("For each of these 3 cities: Springfield, Shelbyville and Ogdenville, give the population.", 3),
        ("What are the population and the mayor of Springfield, Shelbyville and Ogdenville?", 3),
        ("I need a table of these cities:\n- Springfield\n- Shelbyville\n- Ogdenville", 3),
        ("Please compare Springfield, Shelbyville and Ogdenville: for each one list the mayor.", 3),
        ('Tabulate "Springfield", "Shelbyville" and "Ogdenville".', 3),
        ("Tabulate the population, mayor and founding year of Springfield, New York City and Los Angeles.", 3),
    ],
)
def test_rows_are_read_from_the_wording(question: str, items: int) -> None:
    shape = read_wide_task(question + HEADER)
    assert shape.columns == ["city", "population", "mayor"] and shape.key == "city"
    assert len(shape.items) == items
    assert "population" not in shape.items and "mayor" not in shape.items
    if "New York City" in question:
        assert shape.items == ["Springfield", "New York City", "Los Angeles"]
    else:
        assert shape.items == ["Springfield", "Shelbyville", "Ogdenville"]


def test_a_list_of_the_columns_is_not_taken_for_the_rows() -> None:
    assert listed_items("Give the population, mayor and area of Springfield.", ["population", "mayor", "area"]) == []
    assert asked_columns("For each of these towns, give me its population, mayor and area.") == [
        "population",
        "mayor",
        "area",
    ]


def test_an_enumeration_is_a_condition_not_a_list_of_names() -> None:
    shape = read_wide_task(
        'Build a table of every package maintained by "Jane Doe <jd@x.org>", with its version.'
        "\n\nAnswer with one Markdown table with the columns: package | version"
    )
    assert shape.items == [] and shape.condition is not None
    assert condition_terms(shape.condition) == ["Jane Doe <jd@x.org>"]
    generated = read_wide_task(
        "Using the corpus, build a table of every API item (class, function or property) that document `py:csv` "
        "documents. For each give kind: x. Answer with one Markdown table with the columns: name | kind"
    )
    assert generated.document == "py:csv" and generated.items == []


def test_the_brief_states_the_columns_and_rows_the_question_leaves_out() -> None:
    table = {"columns": ["version", "package"], "key_columns": ["package"], "rows": [{"package": "a", "version": "1"}]}
    brief = task_brief("What versions do a and b have?", table, ["a", "b", "c"])
    assert "the columns: package | version" in brief  # key first
    assert "`c`" in brief and "`a`" not in brief
    assert task_brief("Rows a. Answer with one Markdown table with the columns: package | version", table, None) == ""


@pytest.mark.parametrize(
    ("text", "column", "value"),
    [
        ("Package: curl\nVersion: 7.88.1-10\nHomepage: https://curl.se/", "version", "7.88.1-10"),
        ("Package: curl\nVersion: 7.88.1-10\nHomepage: https://curl.se/", "homepage", "https://curl.se/"),
        ("| city | mayor |\n|---|---|\n| Springfield | Joe Quimby |", "mayor", "Joe Quimby"),
        ("Springfield was founded in 1796 by Jebediah Springfield.", "founding_year", "1796"),
        ("Its population is 30,720 and its mayor is Joe Quimby.", "population", "30,720"),
        ("Its population is 30,720 and its mayor is Joe Quimby.", "mayor", "Joe Quimby"),
        ("The package is maintained by Jane Doe.", "maintainer", "Jane Doe"),
        ("It is filed under the web section.", "section", "web"),
    ],
)
def test_a_cell_is_read_from_fields_tables_and_sentences(text: str, column: str, value: str) -> None:
    assert extract_cell(text, "Springfield", column) == value


def test_a_column_the_text_does_not_state_is_left_out() -> None:
    assert extract_cells("Springfield is a town.", "Springfield", ["mayor", "population"]) == {}


def test_the_document_about_the_entity_outranks_one_that_mentions_it() -> None:
    about = entity_score("Package: curl\nVersion: 1", "curl")
    mentions = entity_score("Package: libcurl4\nDescription: the library behind curl", "curl")
    assert about > mentions > 0
    assert entity_score("Package: libcurl4", "curl") == 0  # a longer name is not the entity


def test_entities_must_be_a_list_of_names() -> None:
    env = make_env("swarm", index_uri="file:///nonexistent")
    row = {"id": "t", "prompt": "q", "table": {"columns": ["a"], "key_columns": ["a"], "rows": [{"a": "x"}]}}
    with pytest.raises(TaskFieldError, match="entities"):
        env.validate_task_row({**row, "entities": "x, y"})
    with pytest.raises(TaskFieldError, match="entities"):
        env.validate_task_row({**row, "entities": ["x", ""]})
    env.validate_task_row({**row, "entities": ["x"]})


RECORDS = [
    (
        "springfield",
        "Springfield is a town in the state of Oregon. Its population is 30,720. "
        "Its mayor is Joe Quimby. It was founded in 1796.",
        "Oregon",
    ),
    (
        "shelbyville",
        "Shelbyville lies across the river, in the state of Oregon. Population: 25,000\nMayor: Hans Sprungfeld\n"
        "Shelbyville was founded in 1801.",
        "Oregon",
    ),
    (
        "ogdenville",
        "| town | population | mayor |\n|---|---|---|\n| Ogdenville | 8,400 | Olaf Ogden |\n"
        "Ogdenville is in the state of Kansas.",
        "Kansas",
    ),
] + [
    (f"filler-{i}", f"Filler document {i} mentions Springfield once, in passing, and has a population of {i}.", "")
    for i in range(20)
]


@pytest.fixture
def town_index(tmp_path):
    docs = [Document(doc_id=doc, text=text, title=doc) for doc, text, _ in RECORDS]
    chunks, _ = build_corpus(docs)
    index = SearchIndex.build(chunks, IndexConfig(dense=False))
    uri = f"file://{tmp_path}/towns"
    save_index(index, uri)
    return uri, index


@pytest.mark.parametrize("mode", ["single", "swarm"])
def test_the_scripted_teacher_fills_a_plain_english_table_over_an_unseen_corpus(town_index, mode: str) -> None:
    uri, index = town_index
    rows = [
        {"town": "Springfield", "population": "30,720", "mayor": "Joe Quimby"},
        {"town": "Shelbyville", "population": "25,000", "mayor": "Hans Sprungfeld"},
        {"town": "Ogdenville", "population": "8,400", "mayor": "Olaf Ogden"},
    ]
    row = {
        "id": "towns",
        "prompt": "What are the population and the mayor of Springfield, Shelbyville and Ogdenville?",
        "table": {"columns": ["town", "population", "mayor"], "key_columns": ["town"], "rows": rows},
    }
    env = make_env("swarm", index_uri=uri, subagent_runner="threads")
    env.bind_index(index)
    record = run_episode(env, ScriptedOrchestrator(mode), row)
    assert "the columns: town | population | mayor" in record["turns"][1]["content"]  # the brief the env added
    metrics = swarm_episode_metrics(record)
    assert metrics["item_f1"] == 1.0, record["answer"]
    if mode == "swarm":
        assert metrics["subagents"] == 3


def test_the_scripted_teacher_takes_rows_from_the_entities_field(town_index) -> None:
    uri, index = town_index
    row = {
        "id": "towns-given",
        "prompt": "Give the mayor of each town in the list.",
        "entities": ["Shelbyville", "Ogdenville"],
        "table": {
            "columns": ["town", "mayor"],
            "key_columns": ["town"],
            "rows": [
                {"town": "Shelbyville", "mayor": "Hans Sprungfeld"},
                {"town": "Ogdenville", "mayor": "Olaf Ogden"},
            ],
        },
    }
    env = make_env("swarm", index_uri=uri, subagent_runner="threads")
    env.bind_index(index)
    record = run_episode(env, ScriptedOrchestrator("swarm"), row)
    assert swarm_episode_metrics(record)["item_f1"] == 1.0, record["answer"]


def test_the_scripted_teacher_enumerates_every_document_that_matches(town_index) -> None:
    uri, index = town_index
    row = {
        "id": "oregon",
        "prompt": 'Build a table of every town that lies in the state of "Oregon", with its population.',
        "table": {
            "columns": ["town", "population"],
            "key_columns": ["town"],
            "rows": [{"town": "springfield", "population": "30,720"}, {"town": "shelbyville", "population": "25,000"}],
        },
    }
    env = make_env("swarm", index_uri=uri, subagent_runner="threads")
    env.bind_index(index)
    record = run_episode(env, ScriptedOrchestrator("swarm"), row)
    assert swarm_episode_metrics(record)["item_f1"] == 1.0, record["answer"]


def test_the_sft_warm_up_keeps_wide_episodes_whose_table_is_right(town_index) -> None:
    """Context-1's recall filter would drop every episode of a task without chunk gold (a WideSearch import): the
    swarm's own rule keeps a wide episode when its table is right, once per answer."""
    from workers.swarm.environment import SwarmEnv

    uri, index = town_index
    rows = [{"town": "Springfield", "mayor": "Joe Quimby"}, {"town": "Ogdenville", "mayor": "Olaf Ogden"}]
    row = {
        "id": "mayors",
        "prompt": "Who are the mayors of Springfield and Ogdenville?",
        "table": {"columns": ["town", "mayor"], "key_columns": ["town"], "rows": rows},
    }
    wrong = {**row, "id": "wrong", "table": {**row["table"], "rows": [{"town": "Springfield", "mayor": "Bob"}]}}
    records = []
    for task in (row, row, wrong):
        env = make_env("swarm", index_uri=uri, subagent_runner="threads")
        env.bind_index(index)
        records.append(run_episode(env, ScriptedOrchestrator("swarm"), task))
    kept, report = SwarmEnv.select_for_sft(records)  # type: ignore[misc]
    assert kept == [0]
    assert report["dropped"] == {"error": 0, "table_wrong": 1, "duplicate": 1} and report["rule"] == "item_f1"
    assert SwarmEnv.select_for_sft([{"task_id": "deep", "answer": "x"}]) is None  # no table: the job's filter
