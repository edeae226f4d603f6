from django.contrib.auth import views as auth_views
from django.urls import path

from apps.training import pages as training_pages
from apps.web import browse_views, trajectory_views, views

app_name = "web"

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("accounts/login/", auth_views.LoginView.as_view(template_name="web/login.html"), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.runs_index, name="runs"),
    path("runs/<int:run_id>/", views.run_detail, name="run"),
    path("runs/<int:run_id>/cancel/", views.run_cancel_view, name="run-cancel"),
    path("runs/<int:run_id>/chart.json", views.run_chart, name="run-chart"),
    path("runs/<int:run_id>/checkpoints/", views.run_checkpoints, name="run-checkpoints"),
    path("runs/new/rescore/", training_pages.rescore_new, name="rescore-new"),
    path("runs/new/train/", training_pages.train_new, name="train-new"),
    path("runs/<int:run_id>/resume/", training_pages.run_resume_view, name="run-resume"),
    path("runs/compare/", browse_views.run_compare, name="runs-compare"),
    path("runs/<int:run_id>/trajectories/", browse_views.trajectory_browser, name="trajectories"),
    path(
        "runs/<int:run_id>/trajectories/<str:trajectory_id>/",
        trajectory_views.trajectory_detail,
        name="trajectory",
    ),
    path("datasets/", views.datasets_index, name="datasets"),
    path("datasets/<int:dataset_id>/", views.dataset_detail, name="dataset"),
    path("rewards/", views.rewards_index, name="rewards"),
    path("rewards/<int:config_id>/", views.reward_detail, name="reward"),
    path("rewards/diff/<int:old_id>/<int:new_id>/", views.reward_diff, name="reward-diff"),
]
