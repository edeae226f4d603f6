"""The codegen job in process on a tiny budget, through a real `Reporter` against a mock ingest endpoint: it writes
each kept task's snapshot under its content hash, rows that name them, and a self-describing report, and reports
progress as it goes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from workers.coding.generate import DROP_REASONS
from workers.coding.task import parse_repo_task_row
from workers.coding.workspace import Snapshot
from workers.jobs import codegen
from workers.reporting import Reporter
from workers.specs import JOB_SPECS, CodegenSpec


@pytest.fixture
def ingested(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        events.extend(json.loads(request.content)["events"])
        return httpx.Response(200, json={})

    def reporter_for(spec: Any) -> Reporter:
        client = httpx.Client(transport=httpx.MockTransport(handler))
        return Reporter(ingest_url="http://cp/api/v1/runs/7/ingest/", token="cri_x", client=client, flush_seconds=60)

    monkeypatch.setattr(codegen, "reporter_for", reporter_for)
    yield events


def _spec(tmp_path: Path, **params: Any) -> CodegenSpec:
    return CodegenSpec.model_validate(
        {
            "run_id": 7,
            "kind": "codegen",
            "ingest_url": "http://cp/api/v1/runs/7/ingest/",
            "output_uri": f"file://{tmp_path}/out/tasks.jsonl",
            "report_uri": f"file://{tmp_path}/out/report.json",
            "snapshot_root": f"file://{tmp_path}/snapshots",
            **params,
        }
    )


def test_the_job_writes_snapshots_rows_and_report_and_reports_progress(
    ingested: list[dict[str, Any]], tmp_path: Path
) -> None:
    spec = _spec(tmp_path, sources=["webcolors"], max_tasks=1, max_candidates=4, seed=2)
    summary = codegen.run(spec)

    rows = [json.loads(line) for line in (tmp_path / "out/tasks.jsonl").read_text().splitlines()]
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert summary["kept"] == report["kept"] == len(rows) == 1
    for index, row in enumerate(rows, start=1):
        task = parse_repo_task_row(row, index=index)
        archive = tmp_path / "snapshots" / f"{task.snapshot.sha256}.tar.gz"
        assert task.snapshot.uri == f"file://{archive}"
        assert Snapshot.load(task.snapshot).sha256 == task.snapshot.sha256  # the archive holds what the row names
        assert task.provenance["ids"]["run"] == "7" and task.provenance["ids"]["seed"] == "2"
        assert row["schema"] == "repo_task/v1" and row["prompt"] == task.instruction
    assert report["outputs"]["snapshots"] == {r["snapshot"]["sha256"]: r["snapshot"]["uri"] for r in rows}
    assert report["params"]["sources"] == ["webcolors"] and "refused" not in report
    assert set(report["dropped"]) <= set(DROP_REASONS) and len(report["checked"]) == report["candidates"]

    kinds = [event["kind"] for event in ingested]
    assert kinds.count("progress") >= 2 and "metric" in kinds and kinds[-1] == "end"
    progress = [event for event in ingested if event["kind"] == "progress"]
    assert progress[-1]["done"] == 1 and progress[-1]["total"] == 1
    metrics = [event["values"] for event in ingested if event["kind"] == "metric"]
    assert metrics[-1]["candidates"] == report["candidates"] and metrics[-1]["kept"] == 1
    artifacts = {event["name"] for event in ingested if event["kind"] == "artifact"}
    assert artifacts == {"tasks.jsonl", "report.json"}
    [sent] = [event for event in ingested if event["kind"] == "summary"]
    assert sent["data"]["kept"] == 1 and sent["data"]["statistics"]["tasks"] == 1


def test_the_spec_is_a_registered_job_that_refuses_unknown_sources(tmp_path: Path) -> None:
    assert CodegenSpec in JOB_SPECS and CodegenSpec.entrypoint == "workers.jobs.codegen"
    with pytest.raises(ValueError, match="unknown source"):
        _spec(tmp_path, sources=["parse"])
    assert _spec(tmp_path).params().max_tasks == 60
