"""Search API routes (under /api/v1/); index builds and synthetic-task generation each keep their own module."""

from django.urls import include, path

urlpatterns = [
    path("", include("apps.search.index_urls")),
    path("", include("apps.search.datagen_urls")),
]
