"""Search web pages (under /search/, URL namespace "search"); each part keeps its own module of routes."""

from django.urls import include, path

app_name = "search"

urlpatterns = [
    path("", include("apps.search.index_pages")),
    path("", include("apps.search.datagen_pages")),
]
