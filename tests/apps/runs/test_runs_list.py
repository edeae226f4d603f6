"""The runs list page (`/`): filters, pagination, reward sparklines, and a query count that does not grow."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.runs.models import MetricPoint, Run
from apps.runs.selectors_list import RunListFilters, run_list_page, run_sparklines

pytestmark = pytest.mark.django_db


def _runs(owner, count: int, **fields) -> list[Run]:  # type: ignore[no-untyped-def]
    return [
        Run.objects.create(
            kind=fields.get("kind", "rescore"),
            spec={},
            created_by=owner,
            name=f"run-{i}",
            **{k: v for k, v in fields.items() if k != "kind"},
        )
        for i in range(count)
    ]


def _reward(run: Run, values: list[float], steps: list[int] | None = None, name: str = "reward_mean") -> None:
    now = timezone.now()
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, step=s, name=name, value=v, time=now)
        for s, v in zip(steps or range(len(values)), values, strict=True)
    )


def _ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<td><a href="/runs/(\d+)/">\1</a></td>', html)]


def test_anonymous_users_are_sent_to_login(client) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/")
    assert response.status_code == 302
    assert "login" in response["Location"]


def test_a_viewer_sees_runs_with_tags_status_owner_and_a_reward_sparkline(client, users) -> None:  # type: ignore[no-untyped-def]
    (run,) = _runs(users["operator"], 1, tags=["ctx1", "baseline"], status="running")
    _reward(run, [0.1, 0.4, 0.3, 0.9])
    client.force_login(users["viewer"])
    html = client.get("/").content.decode()
    assert _ids(html) == [run.pk]
    assert ">ctx1</a>" in html and ">baseline</a>" in html
    assert '<span class="badge running">running</span>' in html
    assert users["operator"].username in html
    points = re.search(r'<polyline [^>]*points="([^"]+)"', html)
    assert points is not None and len(points.group(1).split()) == 4
    assert "0.900" in html  # the last value beside the line


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status=failed", {"failed-one"}),
        ("kind=train", {"train-one"}),
        ("tag=hack", {"tagged-one"}),
        ("owner=admin-user", {"admins-one"}),
        ("q=TAGGED", {"tagged-one"}),
        ("status=failed&kind=train", set()),
        ("", {"plain", "failed-one", "train-one", "tagged-one", "admins-one"}),
    ],
)
def test_each_filter_narrows_the_list(client, users, query: str, expected: set[str]) -> None:  # type: ignore[no-untyped-def]
    operator = users["operator"]
    Run.objects.create(kind="rescore", spec={}, created_by=operator, name="plain", tags=["hackish"])
    Run.objects.create(kind="rescore", spec={}, created_by=operator, name="failed-one", status="failed")
    Run.objects.create(kind="train", spec={}, created_by=operator, name="train-one")
    Run.objects.create(kind="rescore", spec={}, created_by=operator, name="tagged-one", tags=["a", "hack"])
    Run.objects.create(kind="rescore", spec={}, created_by=users["admin"], name="admins-one")
    page = run_list_page(filters=RunListFilters.from_query(dict(p.split("=") for p in query.split("&") if p)), page=1)
    assert {r.name for r in page} == expected
    client.force_login(users["viewer"])
    html = client.get(f"/?{query}", HTTP_HX_REQUEST="true").content.decode()
    assert set(_ids(html)) == {r.pk for r in page}
    assert "<html" not in html  # htmx gets the table partial only


def test_it_pages_fifty_runs_at_a_time_newest_first_and_keeps_the_filters_in_the_links(client, users) -> None:  # type: ignore[no-untyped-def]
    runs = _runs(users["operator"], 120, tags=["x"])
    newest_first = [r.pk for r in reversed(runs)]
    client.force_login(users["viewer"])
    pages = [_ids(client.get(f"/?tag=x&page={n}").content.decode()) for n in (1, 2, 3)]
    assert [len(p) for p in pages] == [50, 50, 20]
    assert pages[0] + pages[1] + pages[2] == newest_first
    html = client.get("/?tag=x&page=2").content.decode()
    assert "?tag=x&amp;page=3" in html and "?tag=x&amp;page=1" in html
    assert "page 2 of 3 (120 runs)" in html
    assert _ids(client.get("/?page=99").content.decode()) == pages[2]  # past the end: the last page


def test_the_sparkline_is_downsampled_in_step_order_to_at_most_fifty_points(users) -> None:  # type: ignore[no-untyped-def]
    long_run, short_run, other_metric = _runs(users["operator"], 3)
    _reward(long_run, [s / 1000 for s in range(1000)], steps=list(range(1000)))
    # Inserted out of order, on sparse steps: the series comes back sorted, every point kept.
    _reward(short_run, [0.3, 0.1, 0.2], steps=[30, 10, 20])
    _reward(other_metric, [1.0, 2.0], name="loss")
    lines = run_sparklines(run_ids=[long_run.pk, short_run.pk, other_metric.pk])
    assert set(lines) == {long_run.pk, short_run.pk}
    assert lines[short_run.pk] == [(10, 0.1), (20, 0.2), (30, 0.3)]
    steps = [s for s, _ in lines[long_run.pk]]
    assert len(steps) == 50 and steps == sorted(steps)
    # Bucket k starts at step 1000 * k / 50: the first point of each bucket, values following the steps.
    assert steps == [20 * k for k in range(50)]
    assert lines[long_run.pk][-1] == (980, 0.98)


def test_the_number_of_queries_does_not_depend_on_the_page_size(client, users) -> None:  # type: ignore[no-untyped-def]
    client.force_login(users["viewer"])

    def queries_for(count: int) -> int:
        for run in _runs(users["operator"], count, tags=[f"t{count}"]):
            _reward(run, [0.1, 0.2, 0.3])
        with CaptureQueriesContext(connection) as ctx:
            html = client.get(f"/?tag=t{count}").content.decode()
        assert len(_ids(html)) == count and html.count("<polyline") == count
        return len(ctx.captured_queries)

    few, many = queries_for(5), queries_for(50)
    assert few == many
    # session + user, then count, page (owners joined) and all the sparklines in one query.
    assert many <= 5


def test_a_full_page_stays_within_the_query_budget(client, users, django_assert_max_num_queries) -> None:  # type: ignore[no-untyped-def]
    for run in _runs(users["operator"], 50):
        _reward(run, [0.5] * 60)
    client.force_login(users["viewer"])
    with django_assert_max_num_queries(6):  # 6th: whether the viewer launched a run (the "start here" panel)
        assert client.get("/").status_code == 200


def test_columns_from_config_and_summary_sort_numbers_as_numbers_and_filter_by_data(users):  # type: ignore[no-untyped-def]
    from tests.factories import exact_answer_version, tasks_version

    owner = users["operator"]
    tasks = tasks_version(owner=owner, rows=[{"id": "a", "prompt": "1+1?", "answer": "2"}], name="arith-data")
    reward = exact_answer_version(owner=owner, name="exact-r")
    made = {}
    for lr, algo in ((0.001, "grpo"), (1e-05, "cispo"), (0.0003, "grpo")):
        made[lr] = Run.objects.create(
            kind="train",
            name=f"lr {lr}",
            created_by=owner,
            spec={"config": {"learning_rate": lr, "algorithm": algo, "lora": {"rank": 8}}},
            summary={"eval": {"pass@1": lr * 100}},
            dataset_version=tasks if lr != 0.0003 else None,
            reward_version=reward,
        )
    filters = RunListFilters.from_query(
        {
            "cols": "config.algorithm, config.lora.rank, summary.eval.pass@1, summary.x;drop",
            "sort": "config.learning_rate",
        }
    )
    assert filters.columns() == [("config", "algorithm"), ("config", "lora.rank"), ("summary", "eval.pass@1")]
    assert [p.split("'")[1] for p in filters.column_problems()] == ["summary.x;drop"]
    page = run_list_page(filters=filters, page=1)
    assert [r.name for r in page] == ["lr 1e-05", "lr 0.0003", "lr 0.001"]  # numeric order, not text order
    assert page[0].columns == ["cispo", "8", "0.001"]
    desc = run_list_page(filters=RunListFilters.from_query({"sort": "-config.learning_rate"}), page=1)
    assert [r.name for r in desc][:3] == ["lr 0.001", "lr 0.0003", "lr 1e-05"]
    by_data = run_list_page(filters=RunListFilters.from_query({"dataset": "arith", "reward": "exact"}), page=1)
    assert {r.name for r in by_data} == {"lr 0.001", "lr 1e-05"}
    assert run_list_page(filters=RunListFilters.from_query({"sort": "password; drop"}), page=1).object_list


def test_a_new_installation_shows_where_to_start(client, users):  # type: ignore[no-untyped-def]
    client.force_login(users["operator"])
    page = client.get("/").content.decode()
    assert 'id="start-here"' in page and "/runs/new/train/" in page and "/api/v1/docs/" in page
    viewer = client.__class__()
    viewer.force_login(users["viewer"])
    assert "/runs/new/train/" not in viewer.get("/").content.decode().split('id="start-here"')[1].split("</section>")[0]


def test_where_to_start_shows_to_a_newcomer_on_a_busy_installation_until_they_launch(client, users):  # type: ignore[no-untyped-def]
    from apps.runs.models import Run

    for i in range(6):
        Run.objects.create(kind="rescore", name=f"theirs {i}", spec={}, created_by=users["admin"])
    client.force_login(users["operator"])
    assert 'id="start-here"' in client.get("/").content.decode()  # six runs, none of them the operator's
    assert 'id="start-here"' not in client.get("/?kind=rescore").content.decode()  # never on a filtered list
    Run.objects.create(kind="rescore", name="mine", spec={}, created_by=users["operator"])
    assert 'id="start-here"' not in client.get("/").content.decode()
