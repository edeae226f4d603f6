"""The S3 path, against a local S3-compatible server (moto in server mode): the control plane stores a dataset
version through django-storages and a worker reads it back through fsspec with the URI and options it is given."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import httpx
import pytest

from apps.runs.storage import storage_uri, worker_storage_options
from tests.factories import trajectories_version
from workers.storage import read_bytes, write_bytes

pytestmark = pytest.mark.django_db


def free_port_for_tests() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint():  # type: ignore[no-untyped-def]
    port = free_port_for_tests()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(url, timeout=0.5)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def s3_settings(settings, s3_endpoint, monkeypatch):  # type: ignore[no-untyped-def]
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    bucket = f"crucible-test-{time.time_ns()}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    settings.S3_BUCKET = bucket
    settings.S3_ENDPOINT_URL = s3_endpoint
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {"bucket_name": bucket, "endpoint_url": s3_endpoint, "file_overwrite": False},
        },
    }
    return bucket


def test_a_dataset_version_lands_in_s3_and_a_worker_reads_it_with_fsspec(
    s3_settings, s3_endpoint, users, trajectories_jsonl
):
    version = trajectories_version(owner=users["operator"], data=trajectories_jsonl)
    listed = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").list_objects_v2(Bucket=s3_settings)
    assert [o["Key"] for o in listed["Contents"]] == [version.file.name]
    uri = storage_uri(version.file.name)
    assert uri == f"s3://{s3_settings}/{version.file.name}"
    options = worker_storage_options()
    assert read_bytes(uri, options) == trajectories_jsonl
    out = f"s3://{s3_settings}/runs/1/scores.jsonl"
    write_bytes(out, b"{}\n", options)
    assert read_bytes(out, options) == b"{}\n"
