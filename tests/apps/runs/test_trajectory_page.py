"""The trajectory page: a stored search trajectory turn by turn, re-scored, with pruned chunks struck through."""

from __future__ import annotations

import json

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.runs.models import TrajectorySummary
from apps.runs.storage import storage_uri
from workers.envs.registry import make_env
from workers.envs.toolcalls import format_tool_call
from workers.search.index import IndexConfig, SearchIndex
from workers.search.types import Chunk

pytestmark = pytest.mark.django_db


def _search_record() -> dict:
    chunks = [
        Chunk("doc#0", "doc", 0, "The Bell Rock lighthouse was built between 1807 and 1810."),
        Chunk("doc#1", "doc", 1, "Its engineer was Robert Stevenson."),
        Chunk("other#0", "other", 0, "Edinburgh Castle sits on Castle Rock."),
    ]
    env = make_env("search", index_uri="memory://page-test")
    env.bind_index(SearchIndex.build(chunks, IndexConfig(dense=False)))
    env.reset(
        env.validate_task_row(
            {
                "id": "t1",
                "prompt": "Who engineered the Bell Rock lighthouse?",
                "gold_chunk_ids": ["doc#0", "doc#1"],
                "answer_chunk_ids": ["doc#1"],
            }
        )
    )
    env.step(format_tool_call("search_corpus", {"query": "Bell Rock lighthouse engineer Stevenson"}))
    env.step(format_tool_call("prune_chunks", {"chunk_ids": ["doc#0"]}))
    env.step("<Document id=doc#1><Justification>names the engineer</Justification></Document>")
    return env.trajectory("traj-1")


def _stored(run, record: dict | None) -> TrajectorySummary:  # type: ignore[no-untyped-def]
    uri = ""
    if record is not None:
        name = default_storage.save(
            f"runs/{run.pk}/trajectories/step-000001.jsonl", ContentFile(json.dumps(record) + "\n")
        )
        uri = storage_uri(name)
    return TrajectorySummary.objects.create(
        run=run, trajectory_id="traj-1", task_id="t1", step=1, reward=0.5, num_turns=3, storage_uri=uri
    )


def test_the_page_shows_turns_results_pruned_chunks_usage_and_the_reward_by_term(client, users, run) -> None:
    _stored(run, _search_record())
    client.force_login(users["viewer"])
    page = client.get(f"/runs/{run.pk}/trajectories/traj-1/")
    assert page.status_code == 200
    html = page.content.decode()
    assert '<s title="pruned later">doc#0</s>' in html
    assert "search_corpus" in html and "bm25 #1" in html
    assert 'id="usage-data"' in html and 'id="reward-breakdown"' in html
    assert "f_beta" in html and "contains the answer" in html
    assert "Targets not in the output" in html and "doc#0" in html


def test_a_trajectory_without_a_stored_record_shows_its_summary(client, users, run) -> None:
    _stored(run, None)
    client.force_login(users["viewer"])
    html = client.get(f"/runs/{run.pk}/trajectories/traj-1/").content.decode()
    assert "Only the summary of this trajectory is stored" in html


def test_unknown_trajectories_are_404_and_anonymous_users_go_to_login(client, users, run) -> None:
    _stored(run, _search_record())
    assert client.get(f"/runs/{run.pk}/trajectories/traj-1/").status_code == 302
    client.force_login(users["viewer"])
    assert client.get(f"/runs/{run.pk}/trajectories/nope/").status_code == 404
