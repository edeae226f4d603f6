"""A training trajectory opened from its run (issue 39 part 1): its policy version, advantage and reward by term,
the token-level view on demand, and its group side by side. Records come from a real rollout (the tiny model's
tokenizer through `RolloutWorker`) written as a training step writes them."""

from __future__ import annotations

import json

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.runs.models import TrajectorySummary
from apps.runs.storage import storage_uri
from tests.workers.rl.test_token_versions import VersionedBackend, _worker
from workers.envs.registry import arithmetic_tasks
from workers.rl.steps import shown_advantages
from workers.rl.token_view import full_record

pytestmark = pytest.mark.django_db


def _store_step(run, rewards: list[float], group_size: int = 2, learner_shift: float | None = None):  # type: ignore[no-untyped-def]
    samples = (
        _worker(VersionedBackend(version=2))
        .rollout(arithmetic_tasks(1, seed=0), group_size=len(rewards), seed=0, id_prefix="s1-")
        .samples
    )
    for sample, reward in zip(samples, rewards, strict=True):
        sample.reward = reward
    advantages = shown_advantages(samples, group_size, "none")
    lines = [
        json.dumps(
            full_record(
                s.trajectory,
                step=1,
                group=i // group_size,
                reward=s.reward,
                terms={"exact_match": s.reward, "length": -0.01 * i},
                advantage=advantages[i],
                policy_version=s.policy_version,
                sampled_tokens=s.sampled_tokens,
                flags=[],
                # The learner's side, for the first sample: its first sampled token scored `learner_shift` higher.
                learner_logprobs=_shifted(s, learner_shift) if learner_shift is not None and i == 0 else None,
            )
        )
        for i, s in enumerate(samples)
    ]
    name = default_storage.save(f"runs/{run.pk}/trajectories/step-000001.jsonl", ContentFile("\n".join(lines) + "\n"))
    for s in samples:
        TrajectorySummary.objects.create(
            run=run,
            trajectory_id=s.trajectory["id"],
            task_id=s.task_id,
            step=1,
            reward=s.reward,
            terms={"exact_match": s.reward},
            num_turns=s.num_turns,
            storage_uri=storage_uri(name),
        )
    return samples


def _shifted(sample, shift: float) -> list[float]:  # type: ignore[no-untyped-def]
    first = sample.loss_mask.index(1)
    return [lp + (shift if i == first else 0.0) for i, lp in enumerate(sample.old_logprobs)]


def test_the_token_view_shows_the_learners_log_prob_and_outlines_a_token_past_the_cap(client, users, run) -> None:
    samples = _store_step(run, [1.0, 0.0], learner_shift=1.0)
    client.force_login(users["viewer"])
    url = f"/runs/{run.pk}/trajectories/{samples[0].trajectory['id']}/tokens/"
    fragment = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert 'title="log-prob -0.500 · p 0.607 · policy v2 · learner log-prob 0.500 · δ +1.000"' in fragment
    assert fragment.count('class="tok p-mid mismatch"') == 1  # |δ| = 1 > log 2: outlined; the others δ = 0
    assert "learner log-prob -0.500 · δ +0.000" in fragment
    gap = fragment[
        fragment.index('id="token-mismatch"') : fragment.index("</p>", fragment.index('id="token-mismatch"'))
    ]
    assert f"over the {samples[0].sampled_tokens} tokens the learner scored" in gap and "max 1.0000 nats" in gap
    other = client.get(
        f"/runs/{run.pk}/trajectories/{samples[1].trajectory['id']}/tokens/", headers={"HX-Request": "true"}
    ).content.decode()
    assert "The learner did not score this sample" in other and "learner log-prob" not in other


def test_a_training_trajectory_shows_its_version_advantage_terms_and_a_token_summary(client, users, run) -> None:
    samples = _store_step(run, [1.0, 0.0, 0.0, 0.0])
    client.force_login(users["viewer"])
    html = client.get(f"/runs/{run.pk}/trajectories/{samples[0].trajectory['id']}/").content.decode()
    assert "Policy version 2" in html and "advantage in its group <strong>0.5000</strong>" in html
    assert f'href="/runs/{run.pk}/steps/1/groups/0/"' in html
    assert 'id="token-view"' in html and f"{samples[0].sampled_tokens} sampled" in html
    assert "calculate" in html  # the tool call, turn by turn
    assert "{'" not in html  # no Python repr anywhere


def test_the_token_view_opens_as_a_fragment_or_a_page_with_log_probs_and_greyed_environment_tokens(
    client, users, run
) -> None:
    samples = _store_step(run, [1.0, 0.0])
    client.force_login(users["viewer"])
    url = f"/runs/{run.pk}/trajectories/{samples[0].trajectory['id']}/tokens/"
    fragment = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in fragment and 'class="tokens"' in fragment
    assert 'title="log-prob -0.500 · p 0.607 · policy v2"' in fragment and 'class="tok p-mid"' in fragment
    assert 'class="tok env"' in fragment  # the tool's output between the turns
    page = client.get(url).content.decode()
    assert "<html" in page and "Tokens of" in page


def test_the_group_view_puts_a_steps_samples_of_one_prompt_side_by_side(client, users, run) -> None:
    samples = _store_step(run, [1.0, 0.0, 0.0, 0.0])
    client.force_login(users["viewer"])
    html = client.get(f"/runs/{run.pk}/steps/1/groups/0/").content.decode()
    for sample in samples[:2]:
        assert sample.trajectory["id"] in html
    assert samples[2].trajectory["id"] not in html  # the other group
    assert "the group carries a signal" in html and "0.5000" in html and "-0.5000" in html
    assert "term: exact_match" in html and "term: length" in html
    same = client.get(f"/runs/{run.pk}/steps/1/groups/1/").content.decode()
    assert "the group has no signal" in same


def test_missing_groups_and_token_views_are_404_and_anonymous_users_go_to_login(client, users, run) -> None:
    samples = _store_step(run, [1.0, 0.0])
    tid = samples[0].trajectory["id"]
    assert client.get(f"/runs/{run.pk}/steps/1/groups/0/").status_code == 302
    assert client.get(f"/runs/{run.pk}/trajectories/{tid}/tokens/").status_code == 302
    client.force_login(users["viewer"])
    assert client.get(f"/runs/{run.pk}/steps/1/groups/7/").status_code == 404
    assert client.get(f"/runs/{run.pk}/steps/9/groups/0/").status_code == 404
    assert client.get(f"/runs/{run.pk}/trajectories/nope/tokens/").status_code == 404
    # A record stored before token views has none to open.
    TrajectorySummary.objects.filter(trajectory_id=tid).update(storage_uri="")
    assert client.get(f"/runs/{run.pk}/trajectories/{tid}/tokens/").status_code == 404


def test_an_action_a_role_may_not_take_is_refused_in_crucibles_own_layout_with_a_way_back(client, users, run) -> None:
    client.force_login(users["viewer"])
    refused = client.post(f"/runs/{run.pk}/cancel/")
    html = refused.content.decode()
    assert refused.status_code == 403 and 'id="forbidden"' in html and "css/app.css" in html
    assert "needs &#x27;launch&#x27;" in html or "needs 'launch'" in html
    assert 'href="/"' in html  # back to the runs
    run.refresh_from_db()
    assert run.status != "cancelled"
