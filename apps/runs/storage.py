"""Map files in the control plane's storage (django-storages) to URIs a worker opens with fsspec."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage


def storage_uri(name: str) -> str:
    if settings.S3_BUCKET:
        return f"s3://{settings.S3_BUCKET}/{name}"
    return "file://" + default_storage.path(name)


def worker_storage_options() -> dict[str, Any]:
    """fsspec options for workers; credentials stay in the workers' own environment (AWS_* variables)."""
    if settings.S3_BUCKET and settings.S3_ENDPOINT_URL:
        return {"client_kwargs": {"endpoint_url": settings.S3_ENDPOINT_URL}}
    return {}
