from __future__ import annotations

import hashlib
import json
import re

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction
from django.db.models import Max
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from workers.trajectories import parse_trajectories_jsonl

SLUG = re.compile(r"[-a-zA-Z0-9_]{1,100}")


def validate_dataset_file(*, kind: str, data: bytes) -> tuple[int, dict[str, object]]:
    """Check a file against its kind's schema. Returns (row_count, report) or raises a 400 listing bad lines."""
    if kind == DatasetKind.TRAJECTORIES:
        result = parse_trajectories_jsonl(data)
        if result.errors:
            lines = [f"line {e.line}: {e.message}" for e in result.errors]
            raise ValidationError({"file": lines})
        if result.row_count == 0:
            raise ValidationError({"file": ["the file holds no trajectories; upload JSONL, one object per line"]})
        return result.row_count, {"rows": result.row_count, "errors": 0, "schema": "trajectory/v1"}
    # Other kinds get their schemas in later issues; for now any non-empty JSONL of objects is accepted.
    rows = 0
    bad: list[str] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            if not isinstance(json.loads(line), dict):
                bad.append(f"line {number}: expected a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            bad.append(f"line {number}: invalid JSON ({exc})")
        rows += 1
        if len(bad) >= 50:
            break
    if bad:
        raise ValidationError({"file": bad})
    if rows == 0:
        raise ValidationError({"file": ["the file is empty; upload JSONL, one object per line"]})
    return rows, {"rows": rows, "errors": 0, "schema": f"{kind}/jsonl"}


@transaction.atomic
def dataset_create(*, name: str, kind: str, owner: User, description: str = "") -> Dataset:
    if not SLUG.fullmatch(name or ""):
        raise ValidationError({"name": ["use 1-100 letters, digits, '-' or '_' (e.g. search-trajectories)"]})
    if kind not in DatasetKind.values:
        raise ValidationError({"kind": [f"unknown kind {kind!r}; choose one of {DatasetKind.values}"]})
    if Dataset.objects.filter(name=name).exists():
        raise ValidationError({"name": [f"a dataset named {name!r} exists; pick another name or add a version"]})
    return Dataset.objects.create(name=name, kind=kind, description=description, owner=owner)


def dataset_file_check_size(size: int) -> None:
    """Call before reading an upload into memory; dataset_version_create checks again as a backstop."""
    if size > settings.DATASET_MAX_BYTES:
        raise ValidationError(
            {
                "file": [
                    f"{size} bytes is over the {settings.DATASET_MAX_BYTES}-byte limit "
                    "(CRUCIBLE_DATASET_MAX_BYTES); split the file into versions"
                ]
            }
        )


def dataset_version_create(
    *, dataset: Dataset, data: bytes, filename: str, created_by: User, notes: str = ""
) -> DatasetVersion:
    """Validate the whole file first, so a bad line leaves nothing behind; then store it as the next version."""
    dataset_file_check_size(len(data))
    row_count, report = validate_dataset_file(kind=dataset.kind, data=data)
    content_hash = hashlib.sha256(data).hexdigest()
    with transaction.atomic():
        Dataset.objects.select_for_update().get(pk=dataset.pk)
        existing = DatasetVersion.objects.filter(dataset=dataset, content_hash=content_hash).first()
        if existing is not None:
            raise ValidationError(
                {"file": [f"identical content is already {existing}; reuse that version instead of uploading again"]}
            )
        number = (DatasetVersion.objects.filter(dataset=dataset).aggregate(n=Max("number"))["n"] or 0) + 1
        version = DatasetVersion(
            dataset=dataset,
            number=number,
            row_count=row_count,
            size_bytes=len(data),
            content_hash=content_hash,
            validation_report=report,
            notes=notes,
            created_by=created_by,
        )
        safe_name = filename.rsplit("/", 1)[-1] or "data.jsonl"
        version.file.save(f"{dataset.name}-v{number}-{safe_name}", ContentFile(data), save=False)
        try:
            version.save()
        except IntegrityError:
            version.file.delete(save=False)
            raise
    return version
