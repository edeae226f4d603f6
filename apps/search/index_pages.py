"""Search index pages (under /search/, namespace "search"): the list of indexes with a form to build one."""

from __future__ import annotations

import json

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_http_methods
from rest_framework.exceptions import ValidationError

from apps.accounts.models import Capability
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.search.index_services import index_launch_or_reuse
from apps.search.models import CorpusIndex
from apps.web.views import needs
from workers.search.index import IndexConfig


def _messages(exc: ValidationError) -> list[str]:
    detail = exc.detail
    if isinstance(detail, dict):
        return [
            f"{field}: {msg}" for field, msgs in detail.items() for msg in (msgs if isinstance(msgs, list) else [msgs])
        ]
    return [str(d) for d in (detail if isinstance(detail, list) else [detail])]


@needs(Capability.READ)
@require_http_methods(["GET", "POST"])
def indexes(request: HttpRequest) -> HttpResponse:
    corpora = DatasetVersion.objects.filter(dataset__kind=DatasetKind.CORPUS).select_related("dataset")
    errors: list[str] = []
    config_text = request.POST.get("config") or json.dumps(IndexConfig().model_dump(mode="json"), indent=2)
    if request.method == "POST":
        if not request.user.can(Capability.LAUNCH):  # type: ignore[union-attr]
            raise PermissionDenied("your role cannot build indexes (needs 'launch')")
        try:
            corpus_version = corpora.get(pk=int(request.POST.get("corpus_version", "0")))
        except (ValueError, DatasetVersion.DoesNotExist):
            errors.append("corpus_version: pick a version of a corpus dataset")
        else:
            try:
                config = json.loads(config_text)
            except ValueError as exc:
                errors.append(f"config: not valid JSON ({exc})")
            else:
                try:
                    index, _ = index_launch_or_reuse(
                        corpus_version=corpus_version,
                        config=config,
                        user=request.user,  # type: ignore[arg-type]
                    )
                except ValidationError as exc:
                    errors = _messages(exc)
                else:
                    return redirect("web:run", run_id=index.run_id)
    rows = CorpusIndex.objects.select_related("corpus_version__dataset", "run", "created_by")[:200]
    return render(
        request,
        "search/index_list.html",
        {
            "indexes": rows,
            "corpora": corpora,
            "errors": errors,
            "config_text": config_text,
            "config_fields": [(name, f.description) for name, f in IndexConfig.model_fields.items()],
        },
    )


urlpatterns = [path("indexes/", indexes, name="indexes")]
