"""The per-run ingest token a Ray job reports with."""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings

from apps.runs.models import Run


def ingest_token_for(run: Run) -> str:
    """HMAC of the run id and its nonce: a retried dispatch hands Ray the same token, and it opens nothing else."""
    digest = hmac.new(settings.SECRET_KEY.encode(), f"ingest:{run.pk}:{run.ingest_nonce}".encode(), hashlib.sha256)
    return f"cri_{run.pk}_{digest.hexdigest()}"


def ingest_token_valid(run: Run, token: str) -> bool:
    return bool(run.ingest_nonce) and hmac.compare_digest(ingest_token_for(run), token)
