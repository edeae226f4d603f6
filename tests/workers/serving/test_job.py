"""The serving job as Ray runs it: `python -m workers.jobs.serve` with its spec and token in the environment, on the
test session's Ray; it serves until SIGTERM (Ray's job stop), then deletes its applications and ends its run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import ray
from ray import serve

from tests.workers.serving.helpers import GOOD_KEY, MODEL_NAME, StubControlPlane, free_port
from workers.models.registry import TINY_LLAMA

ROOT = Path(__file__).resolve().parents[3]


def test_the_job_serves_until_sigterm_then_deletes_its_apps_and_ends_its_run(ray_local: None, tmp_path: Path) -> None:
    from workers.specs import ServeSpec

    with StubControlPlane() as plane:  # its own control plane: no arms, so no model is loaded
        port = free_port()
        spec = ServeSpec(
            run_id=9002,
            kind="serve",
            ingest_url=plane.ingest_url,
            model_name=MODEL_NAME,
            base_model=TINY_LLAMA,
            control_url=plane.control_url,
            route_prefix="/serve/9002",
            http_port=port,
            poll_seconds=0.2,
        )
        env = {
            **os.environ,
            "CRUCIBLE_JOB_SPEC": spec.model_dump_json(),
            "CRUCIBLE_INGEST_TOKEN": plane.token,
            "CRUCIBLE_SPOOL_DIR": str(tmp_path / "spool"),
            "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
            "PYTHONPATH": str(ROOT),
        }
        job = subprocess.Popen([sys.executable, "-m", "workers.jobs.serve"], cwd=ROOT, env=env)
        try:
            # One Serve per Ray cluster: when the session's serving fixture started it first, its port wins, and
            # the job says where its endpoint really is.
            plane.wait_for(lambda: any(e["kind"] == "summary" for e in plane.events), timeout=120)
            [base] = [e["data"]["endpoint"] for e in plane.events if e["kind"] == "summary"]
            assert base.endswith("/serve/9002/v1")
            deadline = time.monotonic() + 120
            while True:
                assert job.poll() is None, "the job exited early"
                try:
                    answer = httpx.post(
                        f"{base}/chat/completions",
                        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]},
                        headers={"Authorization": f"Bearer {GOOD_KEY}"},
                        timeout=10,
                    )
                    if answer.status_code != 404:  # 404: Serve's proxy before the route exists
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the endpoint never came up"
                time.sleep(0.2)
            # Nothing deployed yet: an OpenAI-style 503.
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "no_deployment"
            job.send_signal(signal.SIGTERM)
            assert job.wait(timeout=60) == 0
        finally:
            if job.poll() is None:
                job.kill()
        ends = [e for e in plane.events if e["kind"] == "end"]
        assert [e["outcome"] for e in ends] == ["succeeded"]
        assert any("endpoint up" in line for e in plane.events if e["kind"] == "log" for line in e["lines"])
        deadline = time.monotonic() + 30
        while "crucible-serve-9002" in serve.status().applications:
            assert time.monotonic() < deadline, "the job's application was not deleted"
            time.sleep(0.2)


@pytest.mark.parametrize("missing", ["CRUCIBLE_INGEST_TOKEN"])
def test_the_job_refuses_to_start_without_its_token(missing: str) -> None:
    from workers.jobs import serve as serve_job
    from workers.specs import ServeSpec

    spec = ServeSpec(
        run_id=1,
        kind="serve",
        ingest_url="http://127.0.0.1:1/ingest/",
        model_name="m",
        base_model=TINY_LLAMA,
        control_url="http://127.0.0.1:1/control/",
        route_prefix="/serve/1",
    )
    saved = os.environ.pop(missing, None)
    try:
        with pytest.raises(SystemExit, match=missing):
            serve_job.run(spec)
    finally:
        if saved is not None:
            os.environ[missing] = saved
