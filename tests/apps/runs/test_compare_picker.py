"""Compare picks runs by name, tag and kind (issue 39 part 6): the picker lists matching runs with whether each has
curves (an eval has none, and says so), the ticked runs stay first, the choice lives in the query string, the
metrics each run has are listed, and the drawn metrics can be chosen."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from apps.runs.models import MetricPoint, Run

pytestmark = pytest.mark.django_db


def _run(users, name: str, *, kind: str = "train", tags: list[str] | None = None, metrics=()) -> Run:  # type: ignore[no-untyped-def]
    run = Run.objects.create(kind=kind, name=name, tags=tags or [], spec={"config": {}}, created_by=users["operator"])
    now = timezone.now()
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, step=s, name=m, value=float(s), time=now) for m in metrics for s in (1, 2)
    )
    return run


def _section(html: str, marker: str) -> str:
    start = html.index(marker)
    return html[start : html.index("</table>", start)]


def test_the_picker_finds_runs_by_name_tag_and_kind_and_says_which_have_curves(client, users) -> None:
    lr = _run(users, "sweep-lr-3e-4", tags=["sweep"], metrics=("reward_mean", "loss"))
    seed = _run(users, "sweep-seed-2", tags=["sweep", "seeds"], metrics=("reward_mean", "kl"))
    other = _run(users, "unrelated", metrics=("reward_mean",))
    evaluation = _run(users, "sweep-eval", kind="eval")
    client.force_login(users["viewer"])
    found = _section(client.get("/runs/compare/", {"q": "sweep"}).content.decode(), 'id="compare-candidates"')
    assert f'value="{lr.pk}"' in found and f'value="{seed.pk}"' in found and f'value="{other.pk}"' not in found
    assert "no curves: an eval reports a result per task" in found and f'value="{evaluation.pk}"' in found
    tagged = _section(client.get("/runs/compare/", {"tag": "seeds"}).content.decode(), 'id="compare-candidates"')
    assert f'value="{seed.pk}"' in tagged and f'value="{lr.pk}"' not in tagged
    by_kind = _section(client.get("/runs/compare/", {"kind": "eval"}).content.decode(), 'id="compare-candidates"')
    assert f'value="{evaluation.pk}"' in by_kind and f'value="{lr.pk}"' not in by_kind
    none = client.get("/runs/compare/", {"q": "nothing-like-this"}).content.decode()
    assert "No run matches name “nothing-like-this”" in none


def test_ticked_runs_stay_first_and_checked_when_searching_again(client, users) -> None:
    first = _run(users, "alpha", metrics=("loss",))
    second = _run(users, "beta", metrics=("loss",))
    client.force_login(users["viewer"])
    html = client.get("/runs/compare/", {"run": [second.pk, first.pk], "q": "zzz"}).content.decode()
    rows = _section(html, 'id="compare-candidates"')
    assert rows.index(f'value="{second.pk}"') < rows.index(f'value="{first.pk}"')
    assert rows.count("checked") == 2 and "No run matches" not in rows  # ticked runs show even off the search
    series = json.loads(html.split('id="compare-series" type="application/json">')[1].split("</script>")[0])
    assert [line["run"] for line in series["loss"]] == [second.pk, first.pk]


def test_the_page_lists_the_metrics_each_run_has_and_draws_the_ones_ticked(client, users) -> None:
    a = _run(users, "a", metrics=("reward_mean", "loss", "env/turns"))
    b = _run(users, "b", metrics=("reward_mean", "kl"))
    evaluation = _run(users, "e", kind="eval")
    client.force_login(users["viewer"])
    html = client.get("/runs/compare/", {"run": [a.pk, b.pk, evaluation.pk]}).content.decode()
    matrix = _section(html, 'id="metric-matrix"')
    kl_row = matrix[matrix.index('data-metric="kl"') : matrix.index("</tr>", matrix.index('data-metric="kl"'))]
    assert kl_row.count("✓") == 1 and kl_row.count("—") == 2
    assert f"Run {evaluation.pk} (eval): no curves: an eval reports a result per task" in html
    series = json.loads(html.split('id="compare-series" type="application/json">')[1].split("</script>")[0])
    assert list(series)[:2] == ["reward_mean", "loss"]  # the run page's pinned defaults first
    only = client.get("/runs/compare/", {"run": [a.pk, b.pk], "metric": ["kl", "nope"]}).content.decode()
    drawn = json.loads(only.split('id="compare-series" type="application/json">')[1].split("</script>")[0])
    assert list(drawn) == ["kl"] and "1 of 4 metrics drawn" in only


def test_unknown_and_malformed_runs_are_named_and_change_nothing(client, users) -> None:
    a = _run(users, "a", metrics=("loss",))
    client.force_login(users["viewer"])
    html = client.get("/runs/compare/", {"run": [a.pk, 999999, "x;drop"]}).content.decode()
    assert "run 999999: no such run" in html and "pick at least two runs" in html
    assert client.get("/runs/compare/").status_code == 200
    client.logout()
    assert client.get("/runs/compare/", {"q": "a"}).status_code == 302  # login first
