"""Readable everywhere (issue 39 part 3): a run's config and summary, a decision's rule inputs and a flag's evidence
render as labelled tables (dotted setting, value in words), the JSON kept behind a fold; never a Python repr."""

from __future__ import annotations

import pytest

from apps.common.templatetags.json_view import ROW_LIMIT, setting_rows
from apps.runs.models import Run

pytestmark = pytest.mark.django_db


def test_nested_json_flattens_to_dotted_rows_in_words() -> None:
    rows = setting_rows(
        {"lr": 1e-4, "lora": {"rank": 16, "targets": ["q_proj", "v_proj"]}, "ref": None, "on": True, "x": {}}
    )
    assert rows == [
        ("lora.rank", "16"),
        ("lora.targets", "q_proj, v_proj"),
        ("lr", "0.0001"),
        ("on", "true"),
        ("ref", "none"),
        ("x", "none"),
    ]
    assert setting_rows({"placement": [{"role": "learner", "rank": 0}], "steps": 3}) == [
        ("placement[0].rank", "0"),
        ("placement[0].role", "learner"),
        ("steps", "3"),
    ]
    assert setting_rows({"placement": [1], "steps": 3}, "placement") == [("steps", "3")]
    long = setting_rows({"values": [{"v": i} for i in range(ROW_LIMIT + 5)]})
    assert len(long) == ROW_LIMIT + 1 and long[-1] == ("…", "5 more rows: see the JSON below")


def test_a_run_page_shows_its_config_and_summary_as_tables(client, users) -> None:
    run = Run.objects.create(
        kind="train",
        name="tables",
        spec={"config": {"environment": "exact_answer", "sampling": {"max_new_tokens": 48, "stop": ["\n"]}}},
        summary={"steps_done": 3, "weight_sync": {"max_seconds": 0.25}, "placement": [{"role": "learner"}]},
        created_by=users["operator"],
    )
    client.force_login(users["viewer"])
    html = client.get(f"/runs/{run.pk}/").content.decode()
    config = html[html.index('id="config-table"') : html.index("</table>", html.index('id="config-table"'))]
    assert "<code>sampling.max_new_tokens</code></td><td>48</td>" in config
    assert "<code>environment</code></td><td>exact_answer</td>" in config
    summary = html[html.index('id="summary-table"') : html.index("</table>", html.index('id="summary-table"'))]
    assert "<code>weight_sync.max_seconds</code></td><td>0.25</td>" in summary and "placement" not in summary
    assert "{&#x27;" not in html and "{'" not in html
