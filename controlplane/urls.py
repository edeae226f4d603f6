from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from apps.accounts.api import ApiTokenViewSet, UserViewSet, me
from apps.benchmarks.api import BenchmarkVersionViewSet, BenchmarkViewSet, EvalViewSet
from apps.datasets.api import DatasetVersionViewSet, DatasetViewSet
from apps.gates.api import DeploymentViewSet, GateCheckViewSet, GateDecisionViewSet, GateViewSet
from apps.review.api import (
    FlagViewSet,
    QueueItemViewSet,
    ReviewActionViewSet,
    ReviewQueueViewSet,
    RewardDraftViewSet,
    TaskExclusionViewSet,
)
from apps.rewards.api import RewardConfigViewSet, RewardVersionViewSet
from apps.runs.api import RunViewSet
from apps.runs.ingest import ingest_view
from apps.search import api as search_api
from apps.training import api as training_api
from apps.webhooks.api import WebhookDeliveryViewSet, WebhookEndpointViewSet

router = DefaultRouter()
router.register("users", UserViewSet, basename="user")
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("datasets", DatasetViewSet, basename="dataset")
router.register("dataset-versions", DatasetVersionViewSet, basename="dataset-version")
router.register("reward-configs", RewardConfigViewSet, basename="reward-config")
router.register("reward-versions", RewardVersionViewSet, basename="reward-version")
router.register("runs", RunViewSet, basename="run")
router.register("benchmarks", BenchmarkViewSet, basename="benchmark")
router.register("benchmark-versions", BenchmarkVersionViewSet, basename="benchmark-version")
router.register("gates", GateViewSet, basename="gate")
router.register("evals", EvalViewSet, basename="eval")
router.register("gate-checks", GateCheckViewSet, basename="gate-check")
router.register("gate-decisions", GateDecisionViewSet, basename="gate-decision")
router.register("deployments", DeploymentViewSet, basename="deployment")
router.register("flags", FlagViewSet, basename="flag")
router.register("review-queues", ReviewQueueViewSet, basename="review-queue")
router.register("review-items", QueueItemViewSet, basename="review-item")
router.register("reward-drafts", RewardDraftViewSet, basename="reward-draft")
router.register("review-actions", ReviewActionViewSet, basename="review-action")
router.register("task-exclusions", TaskExclusionViewSet, basename="task-exclusion")
router.register("webhooks", WebhookEndpointViewSet, basename="webhook")
router.register("webhook-deliveries", WebhookDeliveryViewSet, basename="webhook-delivery")

api_v1 = [
    path("me/", me, name="me"),
    path("runs/<int:run_id>/ingest/", ingest_view, name="run-ingest"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("", include(search_api.router.urls)),
    path("", include(training_api.router.urls)),
    path("", include(router.urls)),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("search/", include("apps.search.pages")),
    path("benchmarks/", include("apps.benchmarks.pages")),
    path("gates/", include("apps.gates.pages")),
    path("review/", include("apps.review.pages")),
    path("", include("apps.web.urls")),
]
