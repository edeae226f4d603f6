"""Crucible control-plane settings. Every knob comes from the environment (docs/environment.md)."""

from __future__ import annotations

from pathlib import Path

from controlplane.env import (
    SettingError,
    database_from_url,
    env_bool,
    env_int,
    env_networks,
    env_str,
    secret_key_file,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("CRUCIBLE_VAR_DIR", str(BASE_DIR / "var")))

# Debugging (Django's debug pages, the query log) is an explicit opt-in: DJANGO_DEBUG=1. Everything else, `make run`
# included, runs with production settings (docs/deployment.md, "Production settings").
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_str("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",")
CSRF_TRUSTED_ORIGINS = [o for o in env_str("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]
# A site that answers only to loopback names (the default hosts: `make run`, the tests, the benches) is reached
# from this machine alone; one that names any other host (or "*") is a deployment.
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]", "testserver"}
LOOPBACK_ONLY = all(host.strip() in LOOPBACK_HOSTS or host.strip().endswith(".localhost") for host in ALLOWED_HOSTS)

# The secret (sessions, CSRF, run ingest tokens): DJANGO_SECRET_KEY, else the file DJANGO_SECRET_KEY_FILE names
# (`make run` keeps one in var/secret_key). A loopback-only site without either generates one once into
# VAR_DIR/secret_key (mode 0600) and reuses it; a deployment without one refuses to start: never a known secret.
if env_str("DJANGO_SECRET_KEY", ""):
    SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
elif env_str("DJANGO_SECRET_KEY_FILE", ""):
    SECRET_KEY = secret_key_file(Path(env_str("DJANGO_SECRET_KEY_FILE", "")), create=False)
elif LOOPBACK_ONLY:
    SECRET_KEY = secret_key_file(VAR_DIR / "secret_key", create=True)
else:
    raise SettingError(
        f"DJANGO_SECRET_KEY is not set, and this site answers to {','.join(ALLOWED_HOSTS)} (DJANGO_ALLOWED_HOSTS): "
        'set DJANGO_SECRET_KEY to 50+ random characters (python3 -c "import secrets; '
        'print(secrets.token_urlsafe(50))"), the same for web, worker and beat, or DJANGO_SECRET_KEY_FILE to a '
        "file holding them"
    )

# HTTPS (docs/deployment.md). DJANGO_HTTPS says browsers reach the site over https (directly or through a TLS
# proxy): cookies are sent only over https, plain http is redirected, and HSTS is on. Unless set, it is on for a
# deployment (DEBUG off, a host name besides loopback) and off for a loopback-only site or with DEBUG on, so
# `make run` stays plain http on 127.0.0.1 (the devstack also sets DJANGO_HTTPS=0 for its loopback-only bind).
HTTPS = env_bool("DJANGO_HTTPS", not DEBUG and not LOOPBACK_ONLY)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", HTTPS)
# Answered over plain http even then: the container health check and Ray jobs reporting to the control plane over
# the private network (CRUCIBLE_PUBLIC_URL=http://web:8000); both authenticate without cookies.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^api/v1/runs/\d+/ingest/$"]
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 365 * 24 * 3600 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", HTTPS)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", HTTPS)
# Behind a TLS-terminating proxy, the header it sets to the original scheme (X-Forwarded-Proto): a request carrying
# "https" in it counts as secure. Set it only when the proxy always sets (overwrites) that header.
_PROXY_SSL_HEADER = env_str("DJANGO_SECURE_PROXY_SSL_HEADER", "").strip()
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _PROXY_SSL_HEADER.upper().replace("-", "_"), "https") if _PROXY_SSL_HEADER else None
)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "apps.accounts",
    "apps.common",
    "apps.datasets",
    "apps.rewards",
    "apps.benchmarks",
    "apps.runs",
    "apps.gates",
    "apps.webhooks",
    "apps.review",
    "apps.search",
    "apps.coding",
    "apps.realtime",
    "apps.training",
    "apps.web",
]

# Django's middleware; under ASGI the hooks that do no I/O run without a thread hop (apps/common/middleware.py).
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"
WSGI_APPLICATION = None
AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.web.health.problems",
            ]
        },
    }
]

DATABASE_URL = env_str("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/crucible")
DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

# machine-notes.md: socket_timeout=None keeps idle websockets alive; the PubSub layer does not drop bursts.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None}]},
    }
}

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_REDIRECT_STDOUTS = False
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
RECONCILE_SECONDS = env_int("CRUCIBLE_RECONCILE_SECONDS", 5)
# The stall watchdog (apps/runs/stall.py): a running job silent this long is marked stalled, with stack dumps, unless
# its spec sets its own limit (config.stall_after_seconds).
STALL_SECONDS = env_int("CRUCIBLE_STALL_SECONDS", 1800)
EXTRA_ENVIRONMENTS = env_str("CRUCIBLE_ENVIRONMENTS", "")
"""module:Class,... environments from your own code (workers/envs/registry.py); handed to every job."""
CELERY_BEAT_SCHEDULE = {
    "reconcile-runs": {
        "task": "apps.runs.tasks.reconcile_runs",
        "schedule": float(RECONCILE_SECONDS),
    },
    # Re-queues webhook deliveries whose retry the broker lost (apps/webhooks/tasks.py).
    "webhook-retry-due": {"task": "apps.webhooks.tasks.webhook_retry_due", "schedule": 60.0},
    # Decides gate checks whose evals ended, failed ones included (apps/gates/tasks.py).
    "gate-checks-advance": {
        "task": "apps.gates.tasks.gate_checks_advance",
        "schedule": float(env_int("CRUCIBLE_RECONCILE_SECONDS", 5)),
    },
    # Puts newly ingested flags into the review queues that match them (apps/review/tasks.py).
    "review-queues-sync": {"task": "apps.review.tasks.review_queues_sync", "schedule": 60.0},
    # Advances every real-time RL loop's cycle: collect, train, evaluate and gate, deploy (apps/realtime/tasks.py).
    "realtime-loops-tick": {
        "task": "apps.realtime.tasks.realtime_loops_tick",
        "schedule": float(env_int("CRUCIBLE_RECONCILE_SECONDS", 5)),
    },
}

# Ray: the same code targets the local head or a remote cluster's dashboard (Jobs API) address.
RAY_ADDRESS = env_str("RAY_ADDRESS", "http://127.0.0.1:8265")
RAY_JOB_PYTHON = env_str("CRUCIBLE_RAY_PYTHON", "python")
RAY_SUBMIT_TIMEOUT = env_int("CRUCIBLE_RAY_TIMEOUT", 10)
# The run queue (apps.runs.services.queue): what the cluster may give Crucible's runs, as a JSON list of nodes'
# resources ('[{"CPU": 64, "GPU": 8}, {"CPU": 64, "GPU": 8}]'); empty: what Ray reports for its alive nodes.
CLUSTER_NODES = env_str("CRUCIBLE_CLUSTER_NODES", "")
# The most GPUs one user's runs may hold at once (a user's own gpu_quota overrides it); 0: no limit.
GPU_QUOTA = env_int("CRUCIBLE_GPU_QUOTA", 0)
# Where a Ray job reports back to; a remote cluster needs the control plane's public URL here.
CRUCIBLE_PUBLIC_URL = env_str("CRUCIBLE_PUBLIC_URL", "http://127.0.0.1:8000")

# Webhooks: seconds each phase of a delivery request may take, and attempts before a delivery is failed.
WEBHOOK_TIMEOUT = env_int("CRUCIBLE_WEBHOOK_TIMEOUT", 10)
WEBHOOK_MAX_ATTEMPTS = env_int("CRUCIBLE_WEBHOOK_MAX_ATTEMPTS", 6)
# Webhooks go only to public addresses (apps/webhooks/egress.py), and to addresses in these networks: none unless
# named, DEBUG or not (a receiver on this machine needs 127.0.0.0/8,::1/128; one on the LAN its network).
WEBHOOK_ALLOWED_NETWORKS = env_networks("CRUCIBLE_WEBHOOK_ALLOWED_NETWORKS", [])

INGEST_MAX_EVENTS = env_int("CRUCIBLE_INGEST_MAX_EVENTS", 10_000)
INGEST_MAX_BYTES = env_int("CRUCIBLE_INGEST_MAX_BYTES", 8 * 1024 * 1024)
# A run's ingest token takes new events this long after the run ended (its job's last reports, in flight); later
# only events made before then (a replayed spool) land, and the rest is refused with a 409 (apps.runs.services.ingest).
INGEST_GRACE_SECONDS = env_int("CRUCIBLE_INGEST_GRACE_SECONDS", 60)
# Feedback on a served session is accepted until this many hours after its last turn (apps.realtime).
FEEDBACK_WINDOW_HOURS = env_int("CRUCIBLE_FEEDBACK_WINDOW_HOURS", 72)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(INGEST_MAX_BYTES, 64 * 1024 * 1024)
FILE_UPLOAD_MAX_MEMORY_SIZE = 16 * 1024 * 1024
DATASET_MAX_BYTES = env_int("CRUCIBLE_DATASET_MAX_BYTES", 256 * 1024 * 1024)
# One document of a corpus (a file of a zip or folder, a JSONL document): larger ones are refused by name.
DOCUMENT_MAX_BYTES = env_int("CRUCIBLE_DOCUMENT_MAX_BYTES", 16 * 1024 * 1024)

# Storage: local filesystem by default, S3-compatible when CRUCIBLE_S3_BUCKET is set.
MEDIA_ROOT = Path(env_str("CRUCIBLE_MEDIA_ROOT", str(VAR_DIR / "media")))
MEDIA_URL = "/media/"
S3_BUCKET = env_str("CRUCIBLE_S3_BUCKET", "")
S3_ENDPOINT_URL = env_str("CRUCIBLE_S3_ENDPOINT_URL", "")
if S3_BUCKET:
    _default_storage = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": S3_BUCKET,
            "endpoint_url": S3_ENDPOINT_URL or None,
            "file_overwrite": False,
        },
    }
else:
    _default_storage = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(MEDIA_ROOT)},
    }
STORAGES = {
    "default": _default_storage,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["apps.accounts.permissions.HasCapability"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "apps.common.errors.json_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Crucible API",
    "DESCRIPTION": "Control plane for RL training of agentic language models.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["apps.accounts.permissions.HasCapability"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Every operation also documents the errors it can give (400/401/403/404, apps/common/schema.py).
    "DEFAULT_GENERATOR_CLASS": "apps.common.schema.SchemaGenerator",
    # Request bodies get their own components (FooRequest): a required text field there says it may not be blank.
    "COMPONENT_SPLIT_REQUEST": True,
    # One name per choice set: several models have a `status`, and a queue's min_severity is a flag's severity.
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "apps.runs.models.RunStatus",
        "HealthStatusEnum": "apps.runs.health.HEALTH_STATUSES",
        "CheckStatusEnum": "apps.gates.models.CheckStatus",
        "ItemStatusEnum": "apps.review.models.ItemStatus",
        "DraftStatusEnum": "apps.review.models.DraftStatus",
        "DeliveryStatusEnum": "apps.webhooks.models.DeliveryStatus",
        "SeverityEnum": "apps.review.models.Severity",
        "RoleEnum": "apps.accounts.models.Role",
        "CapabilityEnum": "apps.accounts.models.Capability",
    },
}

TIME_ZONE = "UTC"
USE_TZ = True
LANGUAGE_CODE = "en-us"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("CRUCIBLE_LOG_LEVEL", "INFO")},
}
