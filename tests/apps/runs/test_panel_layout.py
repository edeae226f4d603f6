"""A run page you arrange (issue 39 part 4): the layout is saved per user and scope (the run's environment) on the
server, one user's pins are not another's, bad layouts are refused naming the field and change nothing."""

from __future__ import annotations

import json

import pytest

from apps.runs.layouts import DEFAULT_PINNED, default_layout, scope_of
from apps.runs.models import PanelLayout, Run

pytestmark = pytest.mark.django_db


def _train_run(users, environment: str = "exact_answer") -> Run:  # type: ignore[no-untyped-def]
    return Run.objects.create(
        kind="train", name="r", spec={"config": {"environment": environment}}, created_by=users["operator"]
    )


def _layout_on_page(client, run: Run) -> dict:  # type: ignore[no-untyped-def,type-arg]
    html = client.get(f"/runs/{run.pk}/").content.decode()
    start = html.index('<script id="panel-layout" type="application/json">') + len(
        '<script id="panel-layout" type="application/json">'
    )
    return json.loads(html[start : html.index("</script>", start)])


def test_the_default_pins_what_rl_people_watch_and_folds_the_other_sections(client, users) -> None:
    run = _train_run(users)
    client.force_login(users["viewer"])
    layout = _layout_on_page(client, run)
    assert layout["pinned"] == DEFAULT_PINNED == ["reward_mean", "loss", "kl", "entropy", "tokens_per_second"]
    assert layout["open"] == ["key"] and layout == default_layout()


def test_a_layout_is_kept_per_user_and_per_environment(client, users) -> None:
    run, other_run = _train_run(users), _train_run(users)
    search_run = _train_run(users, "search")
    client.force_login(users["viewer"])
    mine = {"pinned": ["loss", "reward_mean", "env/turns"], "hidden": ["kl"], "open": ["key", "env"], "smoothing": 0.6}
    reply = client.post(f"/runs/{run.pk}/layout/", json.dumps(mine), content_type="application/json")
    assert reply.status_code == 200, reply.content
    assert reply.json()["scope"] == "env:exact_answer" == scope_of(other_run)
    kept = _layout_on_page(client, other_run)  # another run of the same environment, after a reload
    assert kept["pinned"] == ["loss", "reward_mean", "env/turns"] and kept["hidden"] == ["kl"]
    assert kept["smoothing"] == 0.6 and kept["open"] == ["key", "env"]
    assert _layout_on_page(client, search_run) == default_layout()  # another environment
    client.force_login(users["operator"])
    assert _layout_on_page(client, run) == default_layout()  # another user
    client.force_login(users["viewer"])
    again = {"pinned": ["reward_mean"]}
    assert client.post(f"/runs/{run.pk}/layout/", json.dumps(again), content_type="application/json").status_code == 200
    assert PanelLayout.objects.filter(user=users["viewer"]).count() == 1  # one row per user and scope, updated


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("not json", "layout"),
        ("[1, 2]", "layout"),
        (json.dumps({"pinned": "loss"}), "layout.pinned"),
        (json.dumps({"hidden": [1]}), "layout.hidden"),
        (json.dumps({"pinned": ["x" * 201]}), "layout.pinned"),
        (json.dumps({"smoothing": 2}), "layout.smoothing"),
        (json.dumps({"smoothing": True}), "layout.smoothing"),
        (json.dumps({"x": "epoch"}), "layout.x"),
        (json.dumps({"colour": "red"}), "layout.colour"),
        (json.dumps({"pinned": [f"m{i}" for i in range(201)]}), "layout.pinned"),
        (json.dumps({"log": ["m" * 199] * 100}), "layout"),  # over 16 KB
    ],
)
def test_a_bad_layout_is_refused_naming_the_field_and_changes_nothing(client, users, body, field) -> None:
    run = _train_run(users)
    client.force_login(users["viewer"])
    good = {"pinned": ["loss"]}
    client.post(f"/runs/{run.pk}/layout/", json.dumps(good), content_type="application/json")
    reply = client.post(f"/runs/{run.pk}/layout/", body, content_type="application/json")
    assert reply.status_code == 400 and field in reply.json()["fields"], reply.content
    assert _layout_on_page(client, run)["pinned"] == ["loss"]


def test_saving_needs_a_login_a_post_and_a_run(client, users) -> None:
    run = _train_run(users)
    body = json.dumps({"pinned": ["loss"]})
    assert client.post(f"/runs/{run.pk}/layout/", body, content_type="application/json").status_code == 302
    assert not PanelLayout.objects.exists()
    client.force_login(users["viewer"])
    assert client.get(f"/runs/{run.pk}/layout/").status_code == 405
    assert client.post("/runs/999999/layout/", body, content_type="application/json").status_code == 404


def test_the_summary_strip_says_the_step_and_that_health_has_no_data_yet(client, users) -> None:
    run = _train_run(users)
    Run.objects.filter(pk=run.pk).update(status="running", progress_total=12)
    client.force_login(users["viewer"])
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="summary-step"' in html and "step 0 of 12" in html
    assert 'id="summary-health"' in html and "health no data yet" in html


def test_live_frames_carry_the_summary_strip_so_a_page_that_opened_queued_follows_the_run(client, users) -> None:
    """The run's state (selectors.run_state) is the one source of the strip: the page renders it, each websocket
    frame swaps it, so a page opened while the run was queued shows 'health no data yet' once it runs."""
    from apps.runs.live import frames_for
    from apps.runs.selectors import run_state

    run = _train_run(users)
    Run.objects.filter(pk=run.pk).update(status="queued")
    client.force_login(users["viewer"])
    queued = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="summary-health"' in queued and queued.split('id="summary-health"')[1].split(">")[0].endswith(" hidden")
    Run.objects.filter(pk=run.pk).update(status="running", progress_total=3)
    [frame] = frames_for([], run_state(Run.objects.get(pk=run.pk)))
    health = frame[frame.index('id="summary-health"') : frame.index("</a>", frame.index('id="summary-health"'))]
    assert 'hx-swap-oob="true"' in health and "health no data yet" in health and "hidden" not in health
    assert "step 0 of 3" in frame
    Run.objects.filter(pk=run.pk).update(health="bad", progress_done=2)
    [later] = frames_for([], run_state(Run.objects.get(pk=run.pk)))
    assert "health bad" in later and "step 2 of 3" in later


def test_the_run_page_stores_the_health_it_shows_so_the_list_and_api_agree(client, users) -> None:
    run = _train_run(users)
    Run.objects.filter(pk=run.pk).update(status="running", health="ok")  # stale: no step has reported yet
    client.force_login(users["viewer"])
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert "health no data yet" in html and Run.objects.get(pk=run.pk).health == "unknown"
    assert client.get(f"/api/v1/runs/{run.pk}/").json()["health"] == "unknown"
