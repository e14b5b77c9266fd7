"""The web side: the operations console, the API (DRF, schema, limits, throttles), live
streams, and observability (metrics, logging)."""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from agentplatform.settings.environment import VAR_DIR, env_value
from agentplatform.settings.platform import RUN_LEASE_SECONDS
from agentplatform.settings.services import PRODUCTION, REDIS_URL

# --- Operations console ---------------------------------------------------------------

# Staff in this group may run console actions (cancel, approve, requeue...) without
# being superusers; only superusers edit raw rows.
ADMIN_OPERATOR_GROUP = env_value("ADMIN_OPERATOR_GROUP", str, "operators")
# Dashboard thresholds: numbers at or past these are highlighted.
OPS_QUEUE_DEPTH_WARN = env_value("OPS_QUEUE_DEPTH_WARN", int, 100)
OPS_OUTBOX_LAG_WARN_SECONDS = env_value("OPS_OUTBOX_LAG_WARN_SECONDS", float, 30.0)
OPS_LEASE_AGE_WARN_SECONDS = env_value(
    "OPS_LEASE_AGE_WARN_SECONDS", float, float(RUN_LEASE_SECONDS)
)
OPS_SUCCESS_RATE_WARN = env_value("OPS_SUCCESS_RATE_WARN", float, 0.8)

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "agentplatform.api.schema.ProblemAutoSchema",
    # The token first: its 401 challenge is what an unauthenticated caller gets.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "agentplatform.api.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["agentplatform.api.parsers.JSONParser"],
    "DEFAULT_THROTTLE_CLASSES": [
        "agentplatform.api.throttling.AnonRateThrottle",
        "agentplatform.api.throttling.UserRateThrottle",
        "agentplatform.api.throttling.TokenRateThrottle",
    ],
    "EXCEPTION_HANDLER": "agentplatform.api.errors.problem_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "agentplatform API",
    "DESCRIPTION": "Submit coding tasks, follow runs, approve and operate the platform.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": "/api/",
    # Swagger UI and Redoc from the pinned copies in drf-spectacular-sidecar: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "agentplatform.api.schema.stream_path_document",
        "agentplatform.api.schema.strict_input_document",
    ],
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "runs.models.Run.Status",
        "TaskStatusEnum": "runs.models.Task.Status",
        "SubmissionStatusEnum": ["queued", "deferred"],
        "DeadLetterStatusEnum": "jobs.models.DeadLetter.Status",
        "WebhookReceiptStatusEnum": "webhooks.models.WebhookReceipt.Status",
    },
}
# API request bodies above this answer 413 (problem details); Django's own cap for
# other requests (admin forms) is set to match.
API_MAX_BODY_BYTES = env_value("API_MAX_BODY_BYTES", int, 1024 * 1024)
# JSON from outside (API bodies, webhook deliveries) nesting deeper than this answers 400
# (jobs.json_input). The parser recurses per level, so the ceiling stays far below
# Python's recursion limit.
JSON_MAX_DEPTH = env_value("JSON_MAX_DEPTH", int, 64)
if not 1 <= JSON_MAX_DEPTH <= 256:
    raise ImproperlyConfigured(f"Invalid value for JSON_MAX_DEPTH: {JSON_MAX_DEPTH} (1 to 256)")
DATA_UPLOAD_MAX_MEMORY_SIZE = max(API_MAX_BODY_BYTES, 2_621_440)
# Rates are "<n>/<second|minute|hour|day>"; empty disables that throttle.
API_THROTTLE_USER_RATE = env_value("API_THROTTLE_USER_RATE", str, "1200/minute")
API_THROTTLE_TOKEN_RATE = env_value("API_THROTTLE_TOKEN_RATE", str, "600/minute")
API_THROTTLE_ANON_RATE = env_value("API_THROTTLE_ANON_RATE", str, "120/minute")
# Where the throttles count: one Redis for every web process and host. A limits
# storage URL.
API_THROTTLE_STORAGE_URL = env_value("API_THROTTLE_STORAGE_URL", str, REDIS_URL)
# How long a web process may answer from memory who an API token is and which
# repositories its user may submit to (agentplatform/api/access_cache.py): PostgreSQL
# notifies every change of tokens, users, memberships, repositories and workspaces, and
# the memory is dropped when it does; this bounds an entry's age besides. 0 turns it off.
API_ACCESS_CACHE_SECONDS = env_value("API_ACCESS_CACHE_SECONDS", float, 60.0)
# Server-Sent Events: keep-alive comment interval, client retry hint, and the size of
# the per-process async connection pool that all open streams share.
SSE_KEEPALIVE_SECONDS = env_value("SSE_KEEPALIVE_SECONDS", float, 15.0)
# The console's pages that show many runs re-read themselves at most this often.
CONSOLE_ACTIVITY_MIN_INTERVAL_SECONDS = env_value(
    "CONSOLE_ACTIVITY_MIN_INTERVAL_SECONDS", float, 2.0
)
SSE_RETRY_MILLISECONDS = env_value("SSE_RETRY_MILLISECONDS", int, 2000)
SSE_DB_POOL_SIZE = env_value("SSE_DB_POOL_SIZE", int, 4)

if PRODUCTION:
    SESSION_COOKIE_SECURE = env_value("SESSION_COOKIE_SECURE", bool, True)
    CSRF_COOKIE_SECURE = env_value("CSRF_COOKIE_SECURE", bool, True)

# --- Observability ----------------------------------------------------------------------

# Counters and histograms of every process of this deployment on this host (memory-mapped
# files, prometheus-client multiprocess mode); emptied when `serve` starts.
METRICS_DIR = Path(env_value("PROMETHEUS_MULTIPROC_DIR", str, str(VAR_DIR / "metrics"))).resolve()
METRICS_DIR.mkdir(parents=True, exist_ok=True)
# Child processes (workers, beat, uvicorn) inherit the same directory.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(METRICS_DIR))
# /metrics: open to these networks (peer address, never through a proxy), else a bearer token.
METRICS_TOKEN = env_value("METRICS_TOKEN", str, "")
METRICS_ALLOWED_NETWORKS = env_value("METRICS_ALLOWED_NETWORKS", list, ["127.0.0.0/8", "::1/128"])
for _network in METRICS_ALLOWED_NETWORKS:
    try:
        import ipaddress as _ipaddress

        _ipaddress.ip_network(_network, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(f"Invalid value for METRICS_ALLOWED_NETWORKS: {_exc}") from _exc

LOG_LEVEL = env_value("LOG_LEVEL", str, "INFO")
LOG_JSON = env_value("LOG_JSON", bool, PRODUCTION)
_CONSOLE = {"handlers": ["console"], "propagate": False}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "structured": {
            "()": "agentplatform.logging.StructuredFormatter",
            "json": LOG_JSON,
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # The request middleware logs every response (4xx at info, 5xx at error with the
        # request id); Django's own logger would repeat each 4xx as a warning.
        "django.request": {"level": "ERROR"},
        "celery": {"level": LOG_LEVEL},
        # uvicorn configures its own plain-text handlers before Django starts; these
        # replace them. Its access lines repeat the middleware's, so only errors pass.
        "uvicorn": {**_CONSOLE, "level": LOG_LEVEL},
        "uvicorn.error": {**_CONSOLE, "level": LOG_LEVEL},
        "uvicorn.access": {**_CONSOLE, "level": "WARNING"},
    },
}
