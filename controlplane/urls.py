from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from apps.accounts import api as accounts_api
from apps.benchmarks import api as benchmarks_api
from apps.coding import api as coding_api
from apps.common.errors import api_not_found
from apps.common.routers import ApiRouter
from apps.datasets import api as datasets_api
from apps.gates import api as gates_api
from apps.realtime import api as realtime_api
from apps.realtime import api_loops as realtime_loops_api
from apps.review import api as review_api
from apps.rewards import api as rewards_api
from apps.runs import api as runs_api
from apps.search import api as search_api
from apps.training import api as training_api
from apps.webhooks import api as webhooks_api

# Every app's api.py ends with its `router` (and `urlpatterns` for routes that are not viewsets); they are gathered
# here into one router, so /api/v1/ lists them all.
API_MODULES = [
    accounts_api,
    datasets_api,
    rewards_api,
    runs_api,
    training_api,
    search_api,
    coding_api,
    benchmarks_api,
    gates_api,
    review_api,
    webhooks_api,
    realtime_api,
    realtime_loops_api,
]
router = ApiRouter()
for module in API_MODULES:
    router.registry.extend(module.router.registry)

api_v1 = [
    *(route for module in API_MODULES for route in getattr(module, "urlpatterns", [])),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("", include(router.urls)),
    # Last: a path under /api/v1/ that matched nothing above (a non-integer id) is a JSON 404. Only paths ending in
    # "/", so one without it still gets APPEND_SLASH's redirect.
    re_path(r"^[\s\S]*/$", api_not_found),
]

# Every app's pages: each pages.py names its namespace (app_name) and full paths; the shell (apps.web) comes last.
PAGE_MODULES = [
    "apps.runs.pages",
    "apps.training.pages",
    "apps.datasets.pages",
    "apps.rewards.pages",
    "apps.search.pages",
    "apps.coding.pages",
    "apps.benchmarks.pages",
    "apps.gates.pages",
    "apps.review.pages",
    "apps.realtime.pages",
    "apps.realtime.pages_loops",
    "apps.web.urls",
]

urlpatterns = [
    path("admin/", admin.site.urls),
    # Browsers and tools that ask for /favicon.ico without reading the page's <link rel="icon">.
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("api/v1/", include(api_v1)),
    *(path("", include(module)) for module in PAGE_MODULES),
]
