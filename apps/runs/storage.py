"""Map files in the control plane's storage (django-storages) to URIs a worker opens with fsspec."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.db.models.fields.files import FieldFile


def storage_uri(name: str) -> str:
    if settings.S3_BUCKET:
        return f"s3://{settings.S3_BUCKET}/{name}"
    return "file://" + default_storage.path(name)


def file_uri(file: FieldFile) -> str:
    """storage_uri of a saved FileField's file."""
    assert file.name is not None, "the file field holds no file"
    return storage_uri(file.name)


def worker_storage_options() -> dict[str, Any]:
    """fsspec options for workers; credentials stay in the workers' own environment (AWS_* variables)."""
    if settings.S3_BUCKET and settings.S3_ENDPOINT_URL:
        return {"client_kwargs": {"endpoint_url": settings.S3_ENDPOINT_URL}}
    return {}


def storage_name(uri: str) -> str | None:
    """The storage name behind a URI from `storage_uri` (None for a URI outside this control plane's storage)."""
    if settings.S3_BUCKET and uri.startswith(f"s3://{settings.S3_BUCKET}/"):
        return uri[len(f"s3://{settings.S3_BUCKET}/") :]
    if not settings.S3_BUCKET and uri.startswith("file://"):
        root = default_storage.path("").rstrip("/") + "/"
        path = uri[len("file://") :]
        return path[len(root) :] if path.startswith(root) else None
    return None


def read_storage_uri(uri: str) -> bytes:
    """The bytes at a URI written by a worker under `storage_uri`; FileNotFoundError when it is not ours or gone."""
    name = storage_name(uri)
    if name is None or not default_storage.exists(name):
        raise FileNotFoundError(uri)
    with default_storage.open(name, "rb") as handle:
        data: bytes = handle.read()
    return data
