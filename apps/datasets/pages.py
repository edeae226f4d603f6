"""Dataset pages (namespace "datasets"): the list with a form to create one, and a dataset's versions with an
upload form (a corpus also shows a sample of its chunks)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.views.decorators.http import require_http_methods
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.common.errors import validation_messages
from apps.datasets.models import Dataset, DatasetKind
from apps.datasets.services import (
    corpus_chunk_sample,
    dataset_create,
    dataset_file_check_size,
    dataset_version_create,
)


@needs(Capability.READ)
@require_http_methods(["GET", "POST"])
def datasets_index(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    if request.method == "POST":
        if not request_user(request).can(Capability.LAUNCH):
            raise PermissionDenied("your role cannot create datasets")
        try:
            dataset = dataset_create(
                name=request.POST.get("name", "").strip(),
                kind=request.POST.get("kind", ""),
                description=request.POST.get("description", ""),
                owner=request_user(request),
            )
        except ValidationError as exc:
            errors = validation_messages(exc)
        else:
            return redirect("datasets:detail", dataset_id=dataset.pk)
    datasets = Dataset.objects.select_related("owner").order_by("name")
    return render(
        request, "datasets/index.html", {"datasets": datasets, "kinds": DatasetKind.choices, "errors": errors}
    )


CORPUS_SAMPLE_CHUNKS = 20


@needs(Capability.READ)
@require_http_methods(["GET", "POST"])
def dataset_detail(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = get_object_or_404(Dataset, pk=dataset_id)
    is_corpus = dataset.kind == DatasetKind.CORPUS
    errors: list[str] = []
    if request.method == "POST":
        if not request_user(request).can(Capability.LAUNCH):
            raise PermissionDenied("your role cannot upload dataset versions")
        upload = request.FILES.get("file")
        if upload is None:
            errors.append("file: choose a file to upload")
        else:
            try:
                dataset_file_check_size(upload.size or 0)
                version = dataset_version_create(
                    dataset=dataset,
                    data=upload.read(),
                    filename=upload.name or "data.jsonl",
                    created_by=request_user(request),
                    notes=request.POST.get("notes", ""),
                    chunker=request.POST.get("chunker", "") if is_corpus else None,
                )
                if is_corpus:
                    report = version.validation_report
                    messages.info(request, f"Chunked {report['documents']} documents into {report['chunks']} chunks.")
                else:
                    messages.info(request, "Uploaded and validated.")
                return redirect("datasets:detail", dataset_id=dataset.pk)
            except ValidationError as exc:
                errors = validation_messages(exc)
    versions = list(dataset.versions.select_related("created_by").order_by("-number"))
    shown = versions[0] if versions else None
    if is_corpus and request.GET.get("version"):
        shown = next((v for v in versions if str(v.number) == request.GET["version"]), shown)
    context = {
        "dataset": dataset,
        "versions": versions,
        "errors": errors,
        "is_corpus": is_corpus,
        "shown": shown,
        "chunks": corpus_chunk_sample(version=shown, limit=CORPUS_SAMPLE_CHUNKS) if is_corpus and shown else [],
        "chunker_text": request.POST.get("chunker", "") if request.method == "POST" else "",
    }
    return render(request, "datasets/detail.html", context)


app_name = "datasets"
urlpatterns = [
    path("datasets/", datasets_index, name="list"),
    path("datasets/<int:dataset_id>/", dataset_detail, name="detail"),
]
