"""Training runs are checked when they are created: a bad run is a 400 naming the field, never a late failure."""

from __future__ import annotations

import pytest

from apps.runs.models import Checkpoint, Run, RunStatus
from tests.factories import context1_version, exact_answer_version, tasks_version
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db

TINY = {"base_model": "tiny-llama-smollm2-tokenizer", "steps": 2, "prompts_per_step": 2, "group_size": 2}


@pytest.fixture
def launch(users, client_for):  # type: ignore[no-untyped-def]
    owner = users["operator"]
    tasks = tasks_version(owner=owner, rows=arithmetic_tasks(8, seed=0))
    reward = exact_answer_version(owner=owner)

    def post(config=None, role="operator", **overrides):  # type: ignore[no-untyped-def]
        body = {
            "kind": "train",
            "dataset_version": tasks.pk,
            "reward_version": reward.pk,
            "config": TINY if config is None else config,
            **overrides,
        }
        return client_for(role).post("/api/v1/runs/", body, format="json")

    post.tasks, post.reward = tasks, reward  # type: ignore[attr-defined]
    return post


def test_a_valid_training_run_is_created_with_its_typed_spec(launch, monkeypatch):
    queued: list[int] = []
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", queued.append)
    reply = launch()
    assert reply.status_code == 201, reply.json()
    run = Run.objects.get(pk=reply.json()["id"])
    assert run.kind == "train" and run.progress_total == 2
    config = run.spec["config"]
    assert config["algorithm"] == "grpo" and config["group_size"] == 2 and config["compute"]["cpus"] == 2
    from apps.runs.services import worker_spec

    spec = worker_spec(run)
    assert spec["config"] == config and spec["resume_from"] is None and spec["input_uri"].startswith("file://")


def test_a_viewer_cannot_launch_a_training_run(launch):
    assert launch(role="viewer").status_code == 403
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("config", "field", "words"),
    [
        ({**TINY, "base_model": "no-such-model"}, "config.base_model", "unknown model"),
        ({**TINY, "group_size": 1}, "config.group_size", "greater than or equal to 2"),
        ({**TINY, "algorithm": "ppo"}, "config.algorithm", "grpo"),
        ({**TINY, "environment": "chess"}, "config.environment", "exact_answer"),
        ({**TINY, "prompts_per_step": 50}, "config.prompts_per_step", "only 8 tasks"),
        ({**TINY, "learning_rate": -1}, "config.learning_rate", "greater than or equal to 0"),
        ({**TINY, "surprise": 1}, "config.surprise", "Extra inputs"),
        ({**TINY, "loss": {"epsilon": 0.2}}, "config.loss", "epsilon_high"),
        ({**TINY, "loss": {"kl_estimator": "k9"}}, "config.loss", "kl_estimator"),
        ({**TINY, "loss": {"algorithm": "cispo"}}, "config.loss", "unknown setting"),
        ({**TINY, "mode": "async", "max_staleness": 0}, "config", "max_staleness >= 1"),
        ({**TINY, "learner": {"ranks": 2}}, "config.learner", "needs learner.strategy ddp or fsdp2"),
        ({**TINY, "learner": {"strategy": "ddp", "cpu_offload": True}}, "config.learner", "FSDP2 options"),
        ({**TINY, "learner": {"strategy": "fsdp2", "ranks": 2}, "lora": {}}, "config.learner", "with lora"),
        ({**TINY, "learner": {"strategy": "zero3"}}, "config.learner.strategy", "fsdp2"),
        ({**TINY, "mismatch": {"correction": "tis", "cap": 0.5}}, "config.mismatch.cap", "finite number > 1"),
        ({**TINY, "mismatch": {"correction": "is"}}, "config.mismatch.correction", "'tis'"),
        ({**TINY, "algorithm": "gspo", "mismatch": {"correction": "mis"}}, "config", "seq_tis or seq_mis"),
        ({**TINY, "stall_after_seconds": 5}, "config.stall_after_seconds", "use at least 10"),
        ({**TINY, "stall_after_seconds": 0}, "config.stall_after_seconds", "greater than or equal to 1"),
        ({**TINY, "stall_limits": {"training": 3}}, "config.stall_limits.training", "use at least 10"),
        ({**TINY, "stall_limits": {"sleep": 60}}, "config.stall_limits.sleep", "Extra inputs"),
        ({**TINY, "weight_sync_budget_seconds": 0}, "config.weight_sync_budget_seconds", "greater than 0"),
        ({**TINY, "partial_rollout": True}, "config", "needs mode 'async'"),
    ],
)
def test_a_bad_config_is_a_400_naming_the_field(launch, config, field, words):
    reply = launch(config)
    assert reply.status_code == 400, reply.json()
    fields = reply.json()["fields"]
    assert field in fields and words in " ".join(fields[field]), fields
    assert not Run.objects.exists()


def test_a_learner_of_several_ranks_counts_every_rank_in_the_memory_check(launch):
    smollm2 = {**TINY, "base_model": "smollm2-135m-instruct", "max_tokens_per_pack": 4096}
    single = launch({**smollm2, "compute": {"memory_gb": 20}})
    assert single.status_code == 201, single.json()
    ranks = launch({**smollm2, "compute": {"memory_gb": 20}, "learner": {"strategy": "ddp", "ranks": 4}})
    assert ranks.status_code == 400
    assert "config.compute.memory_gb" in ranks.json()["fields"]


def test_a_run_that_cannot_fit_in_memory_is_refused_with_the_fix(launch):
    reply = launch({**TINY, "base_model": "smollm2-135m-instruct", "max_tokens_per_pack": 65536})
    assert reply.status_code == 400
    message = " ".join(reply.json()["fields"]["config.compute.memory_gb"])
    assert "needs about" in message and "gradient_checkpointing" in message


def test_tasks_without_the_fields_the_environment_needs_are_refused_by_row(users, launch):
    bad = tasks_version(owner=users["operator"], rows=[{"id": "q1", "question": "2+2?", "answer": "4"}], name="bad")
    reply = launch(dataset_version=bad.pk, config={**TINY, "prompts_per_step": 1})
    assert reply.status_code == 400
    assert "task row 1" in " ".join(reply.json()["fields"]["dataset_version"])
    assert "prompt" in " ".join(reply.json()["fields"]["dataset_version"])


def test_a_reward_whose_terms_need_inputs_the_environment_does_not_produce_is_refused(users, launch):
    retrieval = context1_version(owner=users["operator"])
    reply = launch(reward_version=retrieval.pk)
    assert reply.status_code == 400
    assert "f_beta" in " ".join(reply.json()["fields"]["reward_version"])


def test_a_trajectories_dataset_cannot_train(users, launch, trajectories_jsonl):
    from tests.factories import trajectories_version

    trajectories = trajectories_version(owner=users["operator"], data=trajectories_jsonl)
    reply = launch(dataset_version=trajectories.pk)
    assert reply.status_code == 400 and "kind 'tasks'" in " ".join(reply.json()["fields"]["dataset_version"])


def test_resume_continues_from_the_latest_checkpoint_as_a_linked_run(launch, client_for, monkeypatch):
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    parent = Run.objects.get(pk=launch().json()["id"])
    api = client_for("operator")
    early = api.post(f"/api/v1/runs/{parent.pk}/resume/")
    assert early.status_code == 400 and "stop it first" in early.json()["detail"]
    Run.objects.filter(pk=parent.pk).update(status=RunStatus.STOPPED)
    none_yet = api.post(f"/api/v1/runs/{parent.pk}/resume/")
    assert none_yet.status_code == 400 and "wrote a checkpoint" in none_yet.json()["detail"]
    Checkpoint.objects.create(run=parent, step=1, uri="file:///tmp/c1.pt")
    Checkpoint.objects.create(run=parent, step=2, uri="file:///tmp/c2.pt")
    assert client_for("viewer").post(f"/api/v1/runs/{parent.pk}/resume/").status_code == 403
    finished = api.post(f"/api/v1/runs/{parent.pk}/resume/")  # step 2 of 2: nothing left to train
    assert finished.status_code == 400 and "finished all 2 steps" in finished.json()["detail"]
    Checkpoint.objects.filter(run=parent, step=2).delete()  # as if it crashed after step 1's checkpoint
    reply = api.post(f"/api/v1/runs/{parent.pk}/resume/")
    assert reply.status_code == 201, reply.json()
    child = Run.objects.get(pk=reply.json()["id"])
    assert child.parent_id == parent.pk and child.spec["resume_from"]["step"] == 1
    assert child.spec["config"] == parent.spec["config"] and child.progress_done == 1


def test_a_run_starts_from_another_training_runs_checkpoint_by_its_id(launch, client_for, monkeypatch):
    """SFT → RL → RL from the API: `init_checkpoint` sets the start policy and the base model, links the runs; a
    checkpoint URI in the config, a checkpoint of another kind of run, an unknown id or another base model is a 400
    naming the field, and nothing is created."""
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    first = Run.objects.get(pk=launch().json()["id"])
    checkpoint = Checkpoint.objects.create(run=first, step=2, uri="file:///tmp/first/step-2.pt")
    count = Run.objects.count()

    def refused(field: str, words: str, **body: object) -> None:
        reply = launch(**body)
        assert reply.status_code == 400, reply.json()
        assert words in " ".join(reply.json()["fields"][field]), reply.json()
        assert Run.objects.count() == count

    refused("init_checkpoint", "does not exist", init_checkpoint=999_999)
    refused("config.checkpoint_uri", "init_checkpoint", config={**TINY, "checkpoint_uri": checkpoint.uri})
    refused(
        "config.base_model",
        "trained from 'tiny-llama-smollm2-tokenizer'",
        config={**TINY, "base_model": "smollm2-135m-instruct"},
        init_checkpoint=checkpoint.pk,
    )
    sft = Run.objects.get(pk=launch().json()["id"])
    Run.objects.filter(pk=sft.pk).update(kind="sft")  # as if an SFT run had written a trainer checkpoint
    other = Checkpoint.objects.create(run=sft, step=1, uri="file:///tmp/sft.pt")
    count = Run.objects.count()
    refused("init_checkpoint", "not a training run", init_checkpoint=other.pk)

    no_model = {k: v for k, v in TINY.items() if k != "base_model"}
    reply = launch(config=no_model, init_checkpoint=checkpoint.pk)
    assert reply.status_code == 201, reply.json()
    child = Run.objects.get(pk=reply.json()["id"])
    assert child.parent_id == first.pk and child.progress_done == 0
    assert child.spec["config"]["checkpoint_uri"] == checkpoint.uri
    assert child.spec["config"]["base_model"] == TINY["base_model"]
    assert child.spec["init_checkpoint"] == {
        "checkpoint": checkpoint.pk,
        "run": first.pk,
        "step": 2,
        "uri": checkpoint.uri,
    }
    assert "resume_from" not in child.spec
    from apps.runs.services import worker_spec

    assert worker_spec(child)["config"]["checkpoint_uri"] == checkpoint.uri


def test_the_launch_form_offers_checkpoints_and_starts_from_the_one_picked(launch, client, users, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    first = Run.objects.get(pk=launch().json()["id"])
    checkpoint = Checkpoint.objects.create(run=first, step=2, uri="file:///tmp/first/step-2.pt")
    web = client
    web.force_login(users["operator"])
    detail = web.get(f"/runs/{first.pk}/").content.decode()
    assert f"?init_checkpoint={checkpoint.pk}" in detail  # "train from here"
    page = web.get(f"/runs/new/train/?init_checkpoint={checkpoint.pk}").content.decode()
    assert f'<option value="{checkpoint.pk}" selected>' in page
    form = {
        "dataset_version": launch.tasks.pk,
        "reward_version": launch.reward.pk,
        "base_model": "smollm2-135m-instruct",  # the form's default: the checkpoint's own model wins
        "steps": "2",
        "prompts_per_step": "2",
        "group_size": "2",
        "env_params": "{}",
    }
    gone = web.post("/runs/new/train/", {**form, "init_checkpoint": "999999"})
    assert gone.status_code == 200 and "no training run has a checkpoint 999999" in gone.content.decode()
    reply = web.post("/runs/new/train/", {**form, "init_checkpoint": str(checkpoint.pk)})
    assert reply.status_code == 302, reply.content.decode()[-2000:]
    child = Run.objects.order_by("-pk").first()
    assert child.parent_id == first.pk and child.spec["config"]["checkpoint_uri"] == checkpoint.uri
    assert child.spec["config"]["base_model"] == TINY["base_model"]
    assert "starts from the step 2 checkpoint of" in web.get(f"/runs/{child.pk}/").content.decode()
    assert "followed by" in web.get(f"/runs/{first.pk}/").content.decode()


def test_the_launch_form_pairs_its_defaults_and_marks_which_environments_each_reward_fits(client, users):  # type: ignore[no-untyped-def]
    """The default environment's first fitting reward is preselected; every option says which environments it can
    score (launch.js hides the others), so the form never offers a pairing the launch would refuse."""
    operator = users["operator"]
    retrieval = context1_version(owner=operator, name="ctx1")  # listed first by name: not offered for exact_answer
    exact = exact_answer_version(owner=operator, name="exact")
    client.force_login(operator)
    page = client.get("/runs/new/train/").content.decode()
    import re

    options = dict(re.findall(r'<option value="(\d+)" data-envs="([^"]*)"', page))
    assert "exact_answer" in options[str(exact.pk)].split()
    assert "search" in options[str(retrieval.pk)].split() and "exact_answer" not in options[str(retrieval.pk)].split()
    assert f'<option value="{exact.pk}" data-envs="{options[str(exact.pk)]}" selected>' in page
    assert "js/launch.js" in page


# --- the search environment ------------------------------------------------------------------------------------
SEARCH = {**TINY, "environment": "search", "algorithm": "cispo", "env_params": {"max_turns": 2}}


@pytest.fixture
def search_world(users, monkeypatch, settings, tmp_path):  # type: ignore[no-untyped-def]
    """A corpus version, a ready index of it (its build run marked succeeded), search tasks and the Context-1
    reward."""
    from django.utils import timezone

    from apps.datasets.models import DatasetKind
    from apps.datasets.services import dataset_create, dataset_version_create
    from apps.search.services.indexes import index_launch
    from workers.search.types import Chunk, dump_chunks_jsonl

    settings.MEDIA_ROOT = tmp_path
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    owner = users["operator"]
    chunks = [Chunk(f"doc#{i}", "doc", i, f"passage number {i} about lighthouses") for i in range(3)]
    dataset = dataset_create(name="tiny-corpus", kind=DatasetKind.CORPUS, owner=owner)
    corpus = dataset_version_create(
        dataset=dataset, data=dump_chunks_jsonl(chunks), filename="c.jsonl", created_by=owner
    )
    index = index_launch(corpus_version=corpus, config={"dense": False}, user=owner)
    rows = [
        {"id": f"t{i}", "prompt": "Which passage is about lighthouses?", "gold_chunk_ids": ["doc#1"]} for i in range(4)
    ]
    return {
        "corpus": corpus,
        "index": index,
        "tasks": tasks_version(owner=owner, rows=rows, name="search-tasks"),
        "reward": context1_version(owner=owner),
        "ready": lambda: type(index).objects.filter(pk=index.pk).update(ready_at=timezone.now()),
        "owner": owner,
    }


def _search_launch(client_for, world, **extra):  # type: ignore[no-untyped-def]
    body = {
        "kind": "train",
        "dataset_version": world["tasks"].pk,
        "reward_version": world["reward"].pk,
        "config": SEARCH,
        **extra,
    }
    return client_for("operator").post("/api/v1/runs/", body, format="json")


def test_a_search_run_needs_a_corpus_version_with_a_ready_index(client_for, search_world):
    missing = _search_launch(client_for, search_world)
    assert missing.status_code == 400 and "corpus_version" in missing.json()["fields"]
    building = _search_launch(client_for, search_world, corpus_version=search_world["corpus"].pk)
    assert building.status_code == 400 and "build an index first" in building.json()["detail"]
    wrong_kind = _search_launch(client_for, search_world, corpus_version=search_world["tasks"].pk)
    assert wrong_kind.status_code == 400 and "not a corpus" in wrong_kind.json()["detail"]
    assert not Run.objects.filter(kind="train").exists()


def test_a_search_run_takes_the_index_uri_from_the_corpus_version(client_for, search_world):
    search_world["ready"]()
    launched = _search_launch(client_for, search_world, corpus_version=search_world["corpus"].pk)
    assert launched.status_code == 201, launched.json()
    run = Run.objects.get(pk=launched.json()["id"])
    assert run.spec["config"]["env_params"]["index_uri"] == search_world["index"].uri
    assert run.spec["corpus_version"] == search_world["corpus"].pk


def test_tasks_naming_chunks_missing_from_the_corpus_are_refused_by_row(client_for, search_world):
    search_world["ready"]()
    rows = [{"id": "t1", "prompt": "q", "gold_chunk_ids": ["doc#1", "doc#9"]}] * 2
    search_world["tasks"] = tasks_version(owner=search_world["owner"], rows=rows, name="bad-search-tasks")
    refused = _search_launch(
        client_for, search_world, corpus_version=search_world["corpus"].pk, config={**SEARCH, "prompts_per_step": 1}
    )
    assert refused.status_code == 400
    assert "task row 1 names chunk(s) not in tiny-corpus@v1: doc#9" in refused.json()["detail"]


def test_the_training_page_offers_corpus_versions_and_shows_the_search_errors(client, search_world):
    client.force_login(search_world["owner"])
    page = client.get("/runs/new/train/").content.decode()
    assert "tiny-corpus@v1" in page
    posted = client.post(
        "/runs/new/train/",
        {
            "dataset_version": search_world["tasks"].pk,
            "reward_version": search_world["reward"].pk,
            "environment": "search",
            "base_model": "tiny-llama-smollm2-tokenizer",
        },
    )
    assert posted.status_code == 200 and "corpus_version" in posted.content.decode()


def test_an_sft_run_is_checked_like_a_training_run(client_for, search_world):
    search_world["ready"]()
    body = {
        "kind": "sft",
        "dataset_version": search_world["tasks"].pk,
        "reward_version": search_world["reward"].pk,
        "corpus_version": search_world["corpus"].pk,
    }
    bad = client_for("operator").post(
        "/api/v1/runs/", {**body, "config": {"teacher_model": "gpt-9", "epochs": 0}}, format="json"
    )
    assert bad.status_code == 400 and "config.epochs" in bad.json()["fields"]
    unknown = client_for("operator").post(
        "/api/v1/runs/", {**body, "config": {"teacher_model": "gpt-9"}}, format="json"
    )
    assert unknown.status_code == 400 and "config.teacher_model" in unknown.json()["fields"]
    viewer = client_for("viewer").post("/api/v1/runs/", {**body, "config": {}}, format="json")
    assert viewer.status_code == 403
    assert not Run.objects.filter(kind="sft").exists()
    config = {"teacher_model": "scripted-search", "base_model": "tiny-llama-smollm2-tokenizer"}
    launched = client_for("operator").post("/api/v1/runs/", {**body, "config": config}, format="json")
    assert launched.status_code == 201, launched.json()
    run = Run.objects.get(pk=launched.json()["id"], kind="sft")
    assert run.spec["config"]["env_params"]["index_uri"] == search_world["index"].uri


def test_a_search_benchmark_pins_its_corpus_index_and_checks_the_tasks_chunks(client_for, search_world):
    """Context-1's search benchmark plugs into benchmarks like the coding one: its version pins the index."""
    from apps.benchmarks.models import BenchmarkVersion

    client = client_for("operator")
    bench = client.post("/api/v1/benchmarks/", {"name": "search-bench", "environment": "search"}, format="json")
    assert bench.status_code == 201 and bench.json()["score_field"] == "output_recall"
    url = f"/api/v1/benchmarks/{bench.json()['id']}/versions/"
    rows = [{"id": "q1", "prompt": "Which passage is about lighthouses?", "gold_chunk_ids": ["doc#1"]}]
    missing = client.post(url, {"tasks": rows}, format="json")
    assert missing.status_code == 400 and "corpus_version" in missing.json()["fields"]
    body = {"tasks": rows, "corpus_version": search_world["corpus"].pk}
    assert "build an index first" in client.post(url, body, format="json").json()["detail"]
    search_world["ready"]()
    bad = client.post(url, {**body, "tasks": [{**rows[0], "gold_chunk_ids": ["doc#9"]}]}, format="json")
    assert bad.status_code == 400 and "doc#9" in bad.json()["detail"]
    made = client.post(url, body, format="json")
    assert made.status_code == 201, made.json()
    version = BenchmarkVersion.objects.get(pk=made.json()["id"])
    assert version.env_params["index_uri"] == search_world["index"].uri


def test_a_swarm_run_launches_on_a_corpus_with_the_parl_reward_and_kimis_loss(client_for, search_world):
    """Kimi's agent swarm (issue 19) launches like search: the corpus version's index fills index_uri, and the
    PARL reward (its terms read the `swarm` and `gold_table` fields the swarm environment produces) fits it."""
    from apps.rewards.services import reward_config_create
    from workers.rewards.schema import parl_spec

    search_world["ready"]()
    owner = search_world["owner"]
    parl = reward_config_create(
        name="parl", description="", spec=parl_spec(anneal_steps=10).model_dump(mode="json"), owner=owner
    ).versions.get()
    config = {**TINY, "environment": "swarm", "algorithm": "kimi", "env_params": {"max_turns": 3}}
    launched = _search_launch(
        client_for, search_world, corpus_version=search_world["corpus"].pk, config=config, reward_version=parl.pk
    )
    assert launched.status_code == 201, launched.json()
    run = Run.objects.get(pk=launched.json()["id"])
    assert run.spec["config"]["env_params"]["index_uri"] == search_world["index"].uri
    assert run.spec["config"]["algorithm"] == "kimi"
    bad = _search_launch(
        client_for,
        search_world,
        corpus_version=search_world["corpus"].pk,
        config={**config, "env_params": {"step_preset": "fast"}},
        reward_version=parl.pk,
    )
    assert (
        bad.status_code == 400 and "step_preset must be one of browsecomp, widesearch, in_house" in bad.json()["detail"]
    )
    no_corpus = _search_launch(client_for, search_world, config=config, reward_version=parl.pk)
    assert no_corpus.status_code == 400 and "environment 'swarm' needs corpus_version" in no_corpus.json()["detail"]


def test_wide_and_deep_swarm_benchmarks_pin_the_index_and_score_by_the_tasks_own_metric(client_for, search_world):
    """Benchmark versions of both task shapes on the swarm environment (issue 19): wide rows carry their gold table
    (refused when malformed), deep rows their answer; both are scored by `task_score` (item-F1 or answer found)."""
    from apps.benchmarks.models import BenchmarkVersion

    search_world["ready"]()
    client = client_for("operator")
    bench = client.post("/api/v1/benchmarks/", {"name": "swarm-bench", "environment": "swarm"}, format="json")
    assert bench.status_code == 201 and bench.json()["score_field"] == "task_score"
    url = f"/api/v1/benchmarks/{bench.json()['id']}/versions/"
    table = {"columns": ["name", "document"], "key_columns": ["name"], "rows": [{"name": "x", "document": "doc"}]}
    wide = {"id": "w1", "prompt": "Tabulate x.", "gold_chunk_ids": ["doc#1"], "table": table}
    deep = {"id": "d1", "prompt": "Which passage is about lighthouses?", "answer": "1", "gold_chunk_ids": ["doc#1"]}
    corpus = search_world["corpus"].pk
    broken = {**wide, "table": {**table, "key_columns": ["missing"]}}
    refused = client.post(url, {"tasks": [broken], "corpus_version": corpus}, format="json")
    assert refused.status_code == 400 and "key_columns" in refused.json()["detail"]
    made = client.post(url, {"tasks": [wide, deep], "corpus_version": corpus}, format="json")
    assert made.status_code == 201, made.json()
    assert BenchmarkVersion.objects.get(pk=made.json()["id"]).env_params["index_uri"] == search_world["index"].uri


def test_the_run_time_estimate_learns_from_finished_runs_of_the_same_model(launch, monkeypatch):  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from django.utils import timezone

    from apps.training.launch_form import CALIBRATION_SECONDS_PER_SLOT, run_time_rates

    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    assert (
        run_time_rates()["smollm2-135m-instruct"]["seconds_per_slot"]
        == CALIBRATION_SECONDS_PER_SLOT["smollm2-135m-instruct"]
    )
    run = Run.objects.get(pk=launch().json()["id"])  # tiny model: 2 steps x 2 prompts x 2 samples x 64 tokens
    slots = 2 * 2 * 2 * run.spec["config"]["sampling"]["max_new_tokens"]
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(status="succeeded", started_at=now - timedelta(seconds=slots), finished_at=now)
    learned = run_time_rates()["tiny-llama-smollm2-tokenizer"]
    assert learned["seconds_per_slot"] == pytest.approx(1.0) and "1 finished run" in learned["source"]
