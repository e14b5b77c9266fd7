"""Settings, read from the environment.

With nothing set, agentplatform runs embedded: the same PostgreSQL and Redis (Valkey)
as production, started for you from pip-installed wheels with their data in ``var/``
(agentplatform.embedded). With ``DATABASE_URL=postgres://...`` and
``CELERY_BROKER_URL=redis://...`` (or ``amqp://``) it uses those servers (production
mode). Every variable is listed in the README.
"""

from __future__ import annotations

import json as _json
import os
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from agentplatform import embedded

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _env_value(name: str, cast: Any, default: Any) -> Any:
    """Read one variable; a value that does not parse fails loudly with its name."""
    if cast is bool:
        # django-environ reads any unknown word as False; a typo must not turn DEBUG off
        # (or a safety switch on) silently.
        raw = env.str(name, default=None)
        if raw is None:
            return default
        if raw.strip().lower() in _TRUE:
            return True
        if raw.strip().lower() in _FALSE:
            return False
        raise ImproperlyConfigured(f"Invalid value for {name}: {raw!r} is not a boolean")
    try:
        return env.get_value(name, cast=cast, default=default)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"Invalid value for {name}: {exc}") from exc


VAR_DIR = Path(_env_value("AGENTPLATFORM_VAR_DIR", str, str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

# A well-known value that the production system check refuses.
DEFAULT_SECRET_KEY = "agentplatform-embedded-insecure-secret-key"  # noqa: S105
SECRET_KEY = _env_value("SECRET_KEY", str, DEFAULT_SECRET_KEY)
DEBUG = _env_value("DEBUG", bool, False)
ALLOWED_HOSTS = _env_value("ALLOWED_HOSTS", list, ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = _env_value("CSRF_TRUSTED_ORIGINS", list, [])

INSTALLED_APPS = [
    "agentplatform.console.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_results",
    "django_celery_beat",
    "runs",
    "jobs",
    "webhooks",
]

MIDDLEWARE = [
    # First: every later line of the request carries its request id and trace.
    "agentplatform.middleware.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files straight from the web process in every mode (uvicorn serves none).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "agentplatform.api.limits.ApiBodyLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "agentplatform.urls"
WSGI_APPLICATION = "agentplatform.wsgi.application"
ASGI_APPLICATION = "agentplatform.asgi.application"

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
            ],
        },
    },
]

# --- Database and broker ----------------------------------------------------------------

# Without DATABASE_URL (or without both CELERY_BROKER_URL and REDIS_URL) the platform
# starts its own PostgreSQL and Valkey from their wheels, data under this directory, and
# every process of this checkout shares them (agentplatform.embedded).
EMBEDDED_SERVICES_DIR = Path(_env_value("AGENTPLATFORM_SERVICES_DIR", str, str(VAR_DIR)))
_configured_database = _env_value("DATABASE_URL", str, "")
_configured_broker = _env_value("CELERY_BROKER_URL", str, "")
_configured_redis = _env_value("REDIS_URL", str, "")
# Embedded mode: the database is started for you (development, demos, tests by default).
EMBEDDED = not _configured_database
# Neither the broker nor REDIS_URL names a Redis (the live views, wake-ups, rate limits).
EMBEDDED_REDIS = not _configured_redis and not _configured_broker.startswith("redis")


def _database_config(url: str) -> dict[str, Any]:
    try:
        config: dict[str, Any] = env.db_url_config(url)
    except Exception as exc:  # django-environ raises several types for a bad URL
        raise ImproperlyConfigured(f"Invalid value for DATABASE_URL: {exc}") from exc
    if config["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("Invalid value for DATABASE_URL: only postgres:// is supported")
    return config


# Configured values are checked before any embedded server would start for them.
_database = _database_config(_configured_database) if _configured_database else {}
if _configured_broker and not _configured_broker.startswith(("redis://", "rediss://", "amqp://")):
    raise ImproperlyConfigured(
        "Invalid value for CELERY_BROKER_URL: use redis://, rediss:// or amqp://"
    )
_services = embedded.Endpoints(database_url="", redis_url="")
# The directory of the services this process started or found (None: none embedded);
# ``make serve`` and ``make demo`` stop them when they exit (agentplatform.embedded.held).
EMBEDDED_SERVICES_IN_USE: Path | None = None
if EMBEDDED or EMBEDDED_REDIS:
    try:
        _services = embedded.ensure(EMBEDDED_SERVICES_DIR)
        EMBEDDED_SERVICES_IN_USE = EMBEDDED_SERVICES_DIR
    except (embedded.EmbeddedError, OSError) as exc:
        raise ImproperlyConfigured(
            f"The embedded PostgreSQL and Valkey did not start ({exc}). Set DATABASE_URL "
            "and CELERY_BROKER_URL (or REDIS_URL) to use servers of your own."
        ) from exc
DATABASE_URL = _configured_database or _services.database_url
_database = _database or _database_config(DATABASE_URL)

# Threads per web process that run every request except the live streams
# (agentplatform.asgi); each holds a database connection while it works. A process runs
# Python on one core at a time: four threads cover the waits for PostgreSQL and Redis,
# and more only take turns at the interpreter lock (task submissions went 15% faster
# with four than with eight; scale with processes instead).
WEB_THREADS = _env_value("WEB_THREADS", int, 4)
# A new PostgreSQL connection costs ~3 ms and a backend process, which would dominate
# short requests and steps. Workers and WSGI processes keep one persistent connection
# per thread. The web entry point (agentplatform.asgi) also runs the live streams'
# sync code in a fresh thread per request, where a per-thread connection would be a
# new (and leaked) connection each time: there a psycopg pool shared by the process
# hands connections out instead (the entry point turns it on).
_database.setdefault("OPTIONS", {})
_database["CONN_HEALTH_CHECKS"] = True
DATABASE_POOL = _env_value("DATABASE_POOL", bool, False)
if DATABASE_POOL:
    # Django's own psycopg pool (its documented OPTIONS["pool"]); with
    # CONN_HEALTH_CHECKS it checks each connection it hands out.
    _database["CONN_MAX_AGE"] = 0
    _database["OPTIONS"]["pool"] = {
        "min_size": _env_value("DATABASE_POOL_MIN_SIZE", int, 2),
        # One per request thread, plus two for the live streams' sign-in checks.
        "max_size": _env_value("DATABASE_POOL_MAX_SIZE", int, WEB_THREADS + 2),
        # A request waits this long for a free connection before failing; a burst
        # larger than the pool queues instead of opening more connections.
        "timeout": _env_value("DATABASE_POOL_TIMEOUT", float, 30.0),
        # Connections above the minimum idle this long are closed.
        "max_idle": _env_value("DATABASE_POOL_MAX_IDLE", float, 60.0),
    }
else:
    _database["CONN_MAX_AGE"] = _env_value("DATABASE_CONN_MAX_AGE", int, 600)
_application_name = _env_value("DATABASE_APPLICATION_NAME", str, "")
if _application_name:
    _database["OPTIONS"]["application_name"] = _application_name
_database["TEST"] = {"NAME": _env_value("DATABASE_TEST_NAME", str, None)}
DATABASES = {"default": _database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Celery ---------------------------------------------------------------------------

CELERY_BROKER_URL = _configured_broker or _configured_redis or _services.redis_url
if not CELERY_BROKER_URL.startswith(("redis://", "rediss://", "amqp://")):
    raise ImproperlyConfigured(
        "Invalid value for CELERY_BROKER_URL: use redis://, rediss:// or amqp://"
    )
# Production: servers of the operator's own (the secure-deployment checks apply).
PRODUCTION = not EMBEDDED

# A message unacknowledged this long is redelivered by Redis; the run lease and the
# reaper recover crashed steps much sooner, this is only the broker's own net.
# Ten priority lists per queue, served lowest first (runs.priorities: a step's class,
# aged, and its workspace's share decide its list). The queues themselves keep kombu's
# round robin: a worker of "events" also serves "relay", which must never wait behind
# the events backlog.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 3600,
    "priority_steps": list(range(10)),
}

CELERY_RESULT_BACKEND = "django-db"
# One result backend per process, shared by its threads: django-celery-results keeps no
# state of its own (the ORM keeps a connection per thread). Per thread, each request thread
# of the web server loaded it anew on its first wake-up, and loading it scans the entry
# points of every installed distribution.
CELERY_RESULT_BACKEND_THREAD_SAFE = True
CELERY_RESULT_EXTENDED = True
CELERY_RESULT_EXPIRES = 7 * 24 * 3600
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = _env_value("CELERY_TASK_SOFT_TIME_LIMIT", int, 900)
CELERY_TASK_TIME_LIMIT = _env_value("CELERY_TASK_TIME_LIMIT", int, 960)
CELERY_TASK_DEFAULT_QUEUE = "agent"
# One queue per kind of work, so a flood of one kind never starves another and each can
# get its own workers: agent steps, verification (test runs), events, webhook intake,
# and the outbox relay's wake-ups (served by every worker of "events", see
# agentplatform.celery, so a deployment's queue lists need not name it).
CELERY_TASK_QUEUES = [Queue(name) for name in ("agent", "verify", "events", "webhooks", "relay")]
CELERY_TASK_CREATE_MISSING_QUEUES = True
# Off: with it on, a broker restart makes the worker cancel its running tasks and then
# exit on "Unrecoverable error" while restoring their messages (celery/celery#9250,
# #7185). A task that keeps running across the reconnect is safe here: its outcome is
# written to the database under its lease, and a redelivered duplicate is a no-op.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_RETRY = True
# Reconnect for as long as the broker is down (backoff capped by kombu), never give up.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TASK_ALWAYS_EAGER = False
# Celery reads these on every publish; left to its defaults, each read first misses
# Django's settings (an AttributeError caught per key), about a fifth of a publish's CPU.
# The values are Celery's defaults.
CELERY_TASK_SEND_SENT_EVENT = False
CELERY_TASK_REPR_MAXLEVELS = 3
CELERY_BROKER_POOL_ACQUIRE_TIMEOUT = None
# Celery's Django fix-up closes the database connection around every task unless it may
# reuse it this many times; connection age and health are handled per task instead
# (agentplatform.celery), as Django does per request.
CELERY_DB_REUSE_MAX = 1_000_000_000
# django-celery-beat's scheduler, ticking only while it holds the leader lock, so any
# number of beat processes can run without firing a schedule twice.
CELERY_BEAT_SCHEDULER = "jobs.beat:LeaderDatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_ROUTES = {
    "runs.*": {"queue": "agent"},
    "jobs.outbox_relay": {"queue": "relay"},
    "jobs.*": {"queue": "events"},
    "webhooks.*": {"queue": "webhooks"},
}

REDIS_URL = (
    _configured_redis
    or (_configured_broker if _configured_broker.startswith("redis") else "")
    or _services.redis_url
)


def _redis_database(url: str) -> int:
    from redis.connection import parse_url

    try:
        return int(parse_url(url).get("db") or 0)
    except ValueError:
        return 0


# Pub/sub channels are one namespace per Redis server, whatever the database: the live
# views' channels carry REDIS_URL's database number, so deployments sharing a server on
# database numbers of their own never wake each other's views.
RUN_CHANNEL_PREFIX = f"agent.db{_redis_database(REDIS_URL)}.run."

# The hot paths' fixed statements as server-side prepared statements (jobs.db_rows
# cursor_prepared); 0 behind a pooler that does not keep them across transactions.
DATABASE_PREPARED_STATEMENTS = _env_value("DATABASE_PREPARED_STATEMENTS", bool, True)

# --- The platform ---------------------------------------------------------------------

# How long a step's lease lasts without a heartbeat; heartbeats renew it every third.
RUN_LEASE_SECONDS = _env_value("RUN_LEASE_SECONDS", int, 30)
# How many crash recoveries a run gets before it fails.
RUN_MAX_RECOVERIES = _env_value("RUN_MAX_RECOVERIES", int, 3)
# Retries of a step that could not reach the database (backoff capped at 30 s): a
# database restart or a moment without free connections must not fail runs.
RUN_STEP_DATABASE_RETRIES = _env_value("RUN_STEP_DATABASE_RETRIES", int, 60)
# Submissions to one workspace admitted side by side while far from its limits (see
# runs.services); 0 admits one at a time.
ADMISSION_LANES = _env_value("ADMISSION_LANES", int, 8)
# How long a worker goes on with a run's next steps itself (each still its own fenced
# commit) before it leaves them to a wake-up message and takes other work; 0: one step
# per message.
RUN_STEP_SLICE_SECONDS = _env_value("RUN_STEP_SLICE_SECONDS", float, 1.0)
# An active run with no lease and no progress for this long lost its wake-up message.
RUN_STALL_SECONDS = _env_value("RUN_STALL_SECONDS", int, 60)
SANDBOX_ROOT = Path(_env_value("SANDBOX_ROOT", str, str(VAR_DIR / "sandboxes")))
# bubblewrap (contains; the default), process (development only: refused in production
# mode by a system check) or the dotted path of a runs.agent.backends.SandboxBackend.
SANDBOX_BACKEND = _env_value("SANDBOX_BACKEND", str, "bubblewrap")
# Directories under which staff may register local (on-disk) repositories; the embedded
# mode's demo repositories live under var/.
LOCAL_REPOSITORY_ROOTS = _env_value(
    "LOCAL_REPOSITORY_ROOTS", list, [str(VAR_DIR)] if EMBEDDED else []
)
# When set, clone URLs must name one of these hosts.
REPOSITORY_HOST_ALLOWLIST = _env_value("REPOSITORY_HOST_ALLOWLIST", list, [])
# Where the platform's git may connect (runs/git_network.py). Clone URL schemes: https;
# ssh when listed (it offers the worker's ssh keys); http when listed, staff only.
GIT_ALLOWED_SCHEMES = _env_value("GIT_ALLOWED_SCHEMES", list, ["https"])
# Hosts (by name) and networks (CIDR) git may reach although they are loopback, private
# or otherwise not public: e.g. an internal GitLab. Metadata services never.
GIT_INTERNAL_HOSTS = _env_value("GIT_INTERNAL_HOSTS", list, [])
GIT_INTERNAL_NETWORKS = _env_value("GIT_INTERNAL_NETWORKS", list, [])
# Every clone, fetch and push is killed after this long (and when its run is cancelled).
GIT_NETWORK_TIMEOUT_SECONDS = _env_value("GIT_NETWORK_TIMEOUT_SECONDS", float, 300.0)
# Calls to each git host's REST API allowed per hour across all workers (runs.ratelimits);
# 0: none of ours (the host's 429s still back off).
GIT_PROVIDER_REQUESTS_PER_HOUR = _env_value("GIT_PROVIDER_REQUESTS_PER_HOUR", int, 0)
# The origins (https://host[:port]; a bare host means https) git sends a provider's token
# to; empty: github.com (or the GitHub Enterprise host of GITHUB_API_URL), GitLab's API host.
GITHUB_GIT_HOSTS = _env_value("GITHUB_GIT_HOSTS", list, [])
GITLAB_GIT_HOSTS = _env_value("GITLAB_GIT_HOSTS", list, [])
# Cached results of repositories' setup commands (mounted read-only into sandboxes).
SETUP_CACHE_ROOT = Path(_env_value("SETUP_CACHE_ROOT", str, str(VAR_DIR / "setup-cache")))
SETUP_TIMEOUT_SECONDS = _env_value("SETUP_TIMEOUT_SECONDS", int, 900)
# The platform's own git repositories (never mounted into a sandbox).
PLATFORM_GIT_ROOT = Path(_env_value("PLATFORM_GIT_ROOT", str, str(VAR_DIR / "platform-git")))
COMMAND_TIMEOUT_SECONDS = _env_value("COMMAND_TIMEOUT_SECONDS", int, 300)
COMMAND_OUTPUT_LIMIT_BYTES = _env_value("COMMAND_OUTPUT_LIMIT_BYTES", int, 256 * 1024)
APPROVAL_TTL_SECONDS = _env_value("APPROVAL_TTL_SECONDS", int, 7 * 24 * 3600)
# A question the agent asked (or a plan under review) unanswered this long ends the run
# timed_out (runs.waiting.inputs_expire).
INPUT_TTL_SECONDS = _env_value("INPUT_TTL_SECONDS", int, 7 * 24 * 3600)
# A patch that edits or deletes tests, or removes assertions, waits for a human even in
# autonomous mode (judge finding tests_modified).
TESTS_MODIFIED_REQUIRES_APPROVAL = _env_value("TESTS_MODIFIED_REQUIRES_APPROVAL", bool, True)
EVENT_SOURCE = _env_value("EVENT_SOURCE", str, "/agentplatform")
EVENT_STREAM_NAME = _env_value("EVENT_STREAM_NAME", str, "agent.events.v1")
EVENT_STREAM_MAXLEN = _env_value("EVENT_STREAM_MAXLEN", int, 100_000)
# The Redis holding the external event stream (defaults to REDIS_URL).
EVENT_STREAM_REDIS_URL = _env_value("EVENT_STREAM_REDIS_URL", str, REDIS_URL)
# Outbox publish retries: exponential from the base, capped, with jitter.
OUTBOX_RETRY_BASE_SECONDS = _env_value("OUTBOX_RETRY_BASE_SECONDS", float, 1.0)
OUTBOX_RETRY_MAX_SECONDS = _env_value("OUTBOX_RETRY_MAX_SECONDS", float, 300.0)
# Under load, a relay that finds new commits after draining looks again this much later,
# so one task publishes the commits of the window together.
OUTBOX_RELAY_COALESCE_SECONDS = _env_value("OUTBOX_RELAY_COALESCE_SECONDS", float, 0.2)
# In-app event consumers (dotted paths to jobs.consumers.Consumer objects).
EVENT_CONSUMERS = _env_value(
    "EVENT_CONSUMERS",
    list,
    [
        "runs.cost_aggregation.COST_AGGREGATION",
        "runs.notify.SOURCE_NOTIFICATION",
    ],
)
# Work items (webhook processing, consumer and subscription deliveries, requeues): how
# long a claim lasts before another worker may take the item, how many claims a worker
# may die holding before the item is dead-lettered as poison, how long after a wake-up
# was due the sweep sends another (doubling per unanswered wake-up, capped), and how
# many wake-ups one sweep sends at most.
WORK_LEASE_SECONDS = _env_value("WORK_LEASE_SECONDS", float, 300.0)
WORK_POISON_CRASHES = _env_value("WORK_POISON_CRASHES", int, 3)
WORK_REWAKE_SECONDS = _env_value("WORK_REWAKE_SECONDS", float, 30.0)
WORK_REWAKE_MAX_SECONDS = _env_value("WORK_REWAKE_MAX_SECONDS", float, 600.0)
WORK_SWEEP_LIMIT = _env_value("WORK_SWEEP_LIMIT", int, 500)
# New items (webhook deliveries) are run by one drain task per queue; a drain runs items
# for at most this long before a fresh task goes on, and up to this many drains of one
# queue run at once while a backlog lasts.
WORK_DRAIN_SECONDS = _env_value("WORK_DRAIN_SECONDS", float, 1.0)
WORK_DRAIN_PARALLEL = _env_value("WORK_DRAIN_PARALLEL", int, 4)
# Retention (jobs.retention): published outbox rows, consumers' receipts and finished
# work items are deleted after this many days, processed webhook receipts after theirs;
# 0 keeps them for good. A sweep deletes in batches of RETENTION_BATCH rows for at most
# RETENTION_SWEEP_SECONDS.
OUTBOX_RETENTION_DAYS = _env_value("OUTBOX_RETENTION_DAYS", float, 14.0)
WEBHOOK_RECEIPT_RETENTION_DAYS = _env_value("WEBHOOK_RECEIPT_RETENTION_DAYS", float, 30.0)
RETENTION_BATCH = _env_value("RETENTION_BATCH", int, 2000)
RETENTION_SWEEP_SECONDS = _env_value("RETENTION_SWEEP_SECONDS", float, 20.0)
EVENT_CONSUMER_MAX_RETRIES = _env_value("EVENT_CONSUMER_MAX_RETRIES", int, 5)
EVENT_CONSUMER_RETRY_BASE_SECONDS = _env_value("EVENT_CONSUMER_RETRY_BASE_SECONDS", float, 2.0)
# Outgoing HTTP subscriptions: attempts before a delivery is dead-lettered.
SUBSCRIPTION_MAX_ATTEMPTS = _env_value("SUBSCRIPTION_MAX_ATTEMPTS", int, 8)
SUBSCRIPTION_RETRY_BASE_SECONDS = _env_value("SUBSCRIPTION_RETRY_BASE_SECONDS", float, 5.0)
SUBSCRIPTION_TIMEOUT_SECONDS = _env_value("SUBSCRIPTION_TIMEOUT_SECONDS", float, 10.0)
AGENT_MODEL = _env_value("AGENT_MODEL", str, "scripted")
TASK_DEFAULT_BUDGET = {
    "agent_attempts": _env_value("BUDGET_AGENT_ATTEMPTS", int, 3),
    "model_turns": _env_value("BUDGET_MODEL_TURNS", int, 40),
    "tool_retries": _env_value("BUDGET_TOOL_RETRIES", int, 10),
    "wall_clock_seconds": _env_value("BUDGET_WALL_CLOCK_SECONDS", int, 3600),
    "cost_usd": _env_value("BUDGET_COST_USD", float, 5.0),
    # Replies the model got wrong (bad tool call, text only, cut off) before the run ends.
    "model_errors": _env_value("BUDGET_MODEL_ERRORS", int, 8),
}

# The agent's model endpoint (any OpenAI-compatible Chat Completions server) and the
# git hosting API. Keys and tokens stay in the platform process: never in a sandbox.
OPENAI_BASE_URL = _env_value("OPENAI_BASE_URL", str, "https://api.openai.com/v1")
OPENAI_API_KEY = _env_value("OPENAI_API_KEY", str, "")
OPENAI_DEFAULT_MODEL = _env_value("OPENAI_DEFAULT_MODEL", str, "gpt-4o-mini")
OPENAI_TIMEOUT_SECONDS = _env_value("OPENAI_TIMEOUT_SECONDS", float, 120.0)
OPENAI_MAX_RETRIES = _env_value("OPENAI_MAX_RETRIES", int, 4)
OPENAI_RETRY_BACKOFF_SECONDS = _env_value("OPENAI_RETRY_BACKOFF_SECONDS", float, 1.0)
# Named model profiles (JSON object of name -> profile), merged over the ones built in.
# A profile: provider (openai: Chat Completions; openai-responses; anthropic; gemini;
# local: an OpenAI-compatible server such as vLLM, Ollama or llama.cpp; scripted),
# model, base_url, api_key_env (the NAME of the variable holding the key),
# context_window, max_output_tokens, prices_per_million {input, output, cached},
# text_tool_calls, and capabilities: reasoning, reasoning_effort, tool_use, sampling,
# streaming, prompt_caching. Unset windows, prices and capabilities come from the model
# catalogue and the provider (runs/agent/profiles.py).
_model_profiles = _env_value("MODEL_PROFILES", str, "{}")
try:
    MODEL_PROFILES = {
        # The scripted model costs nothing: it is no paid endpoint.
        "scripted": {
            "provider": "scripted",
            "model": "scripted-1",
            "context_window": 32_768,
            "max_output_tokens": 4_096,
        },
        # Blank model and base URL follow OPENAI_DEFAULT_MODEL and OPENAI_BASE_URL.
        "openai": {"provider": "openai", "api_key_env": "OPENAI_API_KEY"},
        "openai-responses": {
            "provider": "openai-responses",
            "model": "o4-mini",
            "api_key_env": "OPENAI_API_KEY",
        },
        "anthropic": {
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "api_key_env": "ANTHROPIC_API_KEY",
        },
        "gemini": {
            "provider": "gemini",
            "model": "gemini-2.5-flash",
            "api_key_env": "GEMINI_API_KEY",
        },
        "local": {
            "provider": "local",
            "model": "qwen2.5-coder",
            "base_url": "http://127.0.0.1:8000/v1",
        },
        **_json.loads(_model_profiles),
    }
except (ValueError, TypeError) as exc:
    raise ImproperlyConfigured(f"Invalid value for MODEL_PROFILES: {exc}") from exc
# A streamed reply reports its progress on the timeline at most this often.
MODEL_STREAM_PROGRESS_SECONDS = _env_value("MODEL_STREAM_PROGRESS_SECONDS", float, 5.0)
# max_tokens asked of any model, whatever its catalogue entry allows.
MODEL_MAX_OUTPUT_TOKENS_CAP = _env_value("MODEL_MAX_OUTPUT_TOKENS_CAP", int, 8_192)
# Condense older tool outputs once the conversation reaches this share of the window.
CONTEXT_CONDENSE_AT = _env_value("CONTEXT_CONDENSE_AT", float, 0.7)
# Ask the model for a second opinion (score and verdict) after the rule checks.
AGENT_MODEL_JUDGE = _env_value("AGENT_MODEL_JUDGE", bool, False)
GITHUB_API_URL = _env_value("GITHUB_API_URL", str, "https://api.github.com")
GITHUB_TOKEN = _env_value("GITHUB_TOKEN", str, "")
GITHUB_TIMEOUT_SECONDS = _env_value("GITHUB_TIMEOUT_SECONDS", float, 30.0)
# GitLab's REST API (v4) for merge requests, and a token with the api scope.
GITLAB_API_URL = _env_value("GITLAB_API_URL", str, "https://gitlab.com/api/v4")
GITLAB_TOKEN = _env_value("GITLAB_TOKEN", str, "")
GITLAB_TIMEOUT_SECONDS = _env_value("GITLAB_TIMEOUT_SECONDS", float, 30.0)
# Resource limits of every command run in a sandbox.
SANDBOX_CPU_SECONDS = _env_value("SANDBOX_CPU_SECONDS", int, 600)
SANDBOX_MEMORY_BYTES = _env_value("SANDBOX_MEMORY_BYTES", int, 4 * 1024**3)
SANDBOX_FILE_SIZE_BYTES = _env_value("SANDBOX_FILE_SIZE_BYTES", int, 512 * 1024**2)
SANDBOX_PROCESSES = _env_value("SANDBOX_PROCESSES", int, 256)
# The working copy's total size, watched while a command runs and checked after it.
SANDBOX_WORKSPACE_BYTES = _env_value("SANDBOX_WORKSPACE_BYTES", int, 2 * 1024**3)
SANDBOX_TMP_BYTES = _env_value("SANDBOX_TMP_BYTES", int, 256 * 1024**2)
# Containment of the bubblewrap backend (docs/sandbox-backends.md). CPUs the command
# tree may use at once (0: no quota). The host uid/gid a root worker's commands run as
# (-1: the account agentsandbox if it exists, else 2100000000, a uid no account has).
# The cgroup v2 directory under which each command gets its cgroup (memory, pids, cpu);
# empty: the worker's own cgroup or the nearest ancestor that delegates them.
SANDBOX_CPUS = _env_value("SANDBOX_CPUS", float, 1.0)
SANDBOX_HOST_UID = _env_value("SANDBOX_HOST_UID", int, -1)
SANDBOX_HOST_GID = _env_value("SANDBOX_HOST_GID", int, -1)
SANDBOX_CGROUP_ROOT = _env_value("SANDBOX_CGROUP_ROOT", str, "")
# Sandboxed commands running at once on this host, across every worker process and
# thread (runs.agent.slots; 0: one per core), and the directory of their lock files,
# which every worker of the host must share. Runs waiting on their model hold no slot.
SANDBOX_CPU_SLOTS = _env_value("SANDBOX_CPU_SLOTS", int, 0)
SANDBOX_CPU_SLOTS_DIR = Path(_env_value("SANDBOX_CPU_SLOTS_DIR", str, str(VAR_DIR / "cpu-slots")))

# --- Git provider webhooks ------------------------------------------------------------

# Fallback secrets when a repository has no webhook_secret of its own.
GITHUB_WEBHOOK_SECRET = _env_value("GITHUB_WEBHOOK_SECRET", str, "")
GITLAB_WEBHOOK_TOKEN = _env_value("GITLAB_WEBHOOK_TOKEN", str, "")
# GitHub and GitLab cap payloads at 25 MB; anything larger is refused with 413.
WEBHOOK_MAX_BYTES = _env_value("WEBHOOK_MAX_BYTES", int, 25 * 1024 * 1024)
# An issue given this label becomes a task.
WEBHOOK_AGENT_LABEL = _env_value("WEBHOOK_AGENT_LABEL", str, "agent")
# Model options (JSON object) for tasks submitted from webhooks; {} uses AGENT_MODEL.
_webhook_model_options = _env_value("WEBHOOK_TASK_MODEL_OPTIONS", str, "{}")
try:
    WEBHOOK_TASK_MODEL_OPTIONS = _json.loads(_webhook_model_options)
    if not isinstance(WEBHOOK_TASK_MODEL_OPTIONS, dict):
        raise ValueError("must be a JSON object")
except ValueError as exc:
    raise ImproperlyConfigured(f"Invalid value for WEBHOOK_TASK_MODEL_OPTIONS: {exc}") from exc
# CI failures on one head commit of an agent PR that may start a follow-up run.
WEBHOOK_CI_FOLLOWUPS_PER_COMMIT = _env_value("WEBHOOK_CI_FOLLOWUPS_PER_COMMIT", int, 1)
# GitLab notes carry no access level: only these usernames may give /agent commands.
GITLAB_COMMAND_USERS = _env_value("GITLAB_COMMAND_USERS", list, [])
WEBHOOK_PROCESS_MAX_RETRIES = _env_value("WEBHOOK_PROCESS_MAX_RETRIES", int, 5)
# The first processing retry waits about this long; each next one twice as long.
WEBHOOK_PROCESS_RETRY_BASE_SECONDS = _env_value("WEBHOOK_PROCESS_RETRY_BASE_SECONDS", float, 2.0)

# Workers record a heartbeat this often; one silent for three intervals is not alive.
WORKER_HEARTBEAT_SECONDS = _env_value("WORKER_HEARTBEAT_SECONDS", float, 10.0)
# /readyz answers 503 unless every task queue has a live worker (off: web-only probes).
READYZ_REQUIRE_WORKERS = _env_value("READYZ_REQUIRE_WORKERS", bool, False)

# --- Operations console ---------------------------------------------------------------

# Staff in this group may run console actions (cancel, approve, requeue...) without
# being superusers; only superusers edit raw rows.
ADMIN_OPERATOR_GROUP = _env_value("ADMIN_OPERATOR_GROUP", str, "operators")
# Dashboard thresholds: numbers at or past these are highlighted.
OPS_QUEUE_DEPTH_WARN = _env_value("OPS_QUEUE_DEPTH_WARN", int, 100)
OPS_OUTBOX_LAG_WARN_SECONDS = _env_value("OPS_OUTBOX_LAG_WARN_SECONDS", float, 30.0)
OPS_LEASE_AGE_WARN_SECONDS = _env_value(
    "OPS_LEASE_AGE_WARN_SECONDS", float, float(RUN_LEASE_SECONDS)
)
OPS_SUCCESS_RATE_WARN = _env_value("OPS_SUCCESS_RATE_WARN", float, 0.8)

# --- Django bits ----------------------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# The console's own script (static/console/live.js), plain files: no build step.
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(_env_value("STATIC_ROOT", str, str(VAR_DIR / "static")))
# Hashed, compressed copies made by ``collectstatic`` (``make setup``/``migrate`` run it),
# served far-future cached by WhiteNoise.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "agentplatform.api.schema.ProblemAutoSchema",
    # The token first: its 401 challenge is what an unauthenticated caller gets.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "agentplatform.api.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["agentplatform.api.renderers.JSONRenderer"],
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
API_MAX_BODY_BYTES = _env_value("API_MAX_BODY_BYTES", int, 1024 * 1024)
# JSON from outside (API bodies, webhook deliveries) nesting deeper than this answers 400
# (jobs.json_input). The parser recurses per level, so the ceiling stays far below
# Python's recursion limit.
JSON_MAX_DEPTH = _env_value("JSON_MAX_DEPTH", int, 64)
if not 1 <= JSON_MAX_DEPTH <= 256:
    raise ImproperlyConfigured(f"Invalid value for JSON_MAX_DEPTH: {JSON_MAX_DEPTH} (1 to 256)")
DATA_UPLOAD_MAX_MEMORY_SIZE = max(API_MAX_BODY_BYTES, 2_621_440)
# Rates are "<n>/<second|minute|hour|day>"; empty disables that throttle.
API_THROTTLE_USER_RATE = _env_value("API_THROTTLE_USER_RATE", str, "1200/minute")
API_THROTTLE_TOKEN_RATE = _env_value("API_THROTTLE_TOKEN_RATE", str, "600/minute")
API_THROTTLE_ANON_RATE = _env_value("API_THROTTLE_ANON_RATE", str, "120/minute")
# Where the throttles count: one Redis for every web process and host. A limits
# storage URL.
API_THROTTLE_STORAGE_URL = _env_value("API_THROTTLE_STORAGE_URL", str, REDIS_URL)
# How long a web process may answer from memory who an API token is and which
# repositories its user may submit to (agentplatform/api/access_cache.py): PostgreSQL
# notifies every change of tokens, users, memberships, repositories and workspaces, and
# the memory is dropped when it does; this bounds an entry's age besides. 0 turns it off.
API_ACCESS_CACHE_SECONDS = _env_value("API_ACCESS_CACHE_SECONDS", float, 60.0)
# Server-Sent Events: keep-alive comment interval, client retry hint, and the size of
# the per-process async connection pool that all open streams share.
SSE_KEEPALIVE_SECONDS = _env_value("SSE_KEEPALIVE_SECONDS", float, 15.0)
# The console's pages that show many runs re-read themselves at most this often.
CONSOLE_ACTIVITY_MIN_INTERVAL_SECONDS = _env_value(
    "CONSOLE_ACTIVITY_MIN_INTERVAL_SECONDS", float, 2.0
)
SSE_RETRY_MILLISECONDS = _env_value("SSE_RETRY_MILLISECONDS", int, 2000)
SSE_DB_POOL_SIZE = _env_value("SSE_DB_POOL_SIZE", int, 4)

if PRODUCTION:
    SESSION_COOKIE_SECURE = _env_value("SESSION_COOKIE_SECURE", bool, True)
    CSRF_COOKIE_SECURE = _env_value("CSRF_COOKIE_SECURE", bool, True)

# --- Observability ----------------------------------------------------------------------

# Counters and histograms of every process of this deployment on this host (memory-mapped
# files, prometheus-client multiprocess mode); emptied when `serve` starts.
METRICS_DIR = Path(_env_value("PROMETHEUS_MULTIPROC_DIR", str, str(VAR_DIR / "metrics"))).resolve()
METRICS_DIR.mkdir(parents=True, exist_ok=True)
# Child processes (workers, beat, uvicorn) inherit the same directory.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(METRICS_DIR))
# /metrics: open to these networks (peer address, never through a proxy), else a bearer token.
METRICS_TOKEN = _env_value("METRICS_TOKEN", str, "")
METRICS_ALLOWED_NETWORKS = _env_value("METRICS_ALLOWED_NETWORKS", list, ["127.0.0.0/8", "::1/128"])
for _network in METRICS_ALLOWED_NETWORKS:
    try:
        import ipaddress as _ipaddress

        _ipaddress.ip_network(_network, strict=False)
    except ValueError as exc:
        raise ImproperlyConfigured(f"Invalid value for METRICS_ALLOWED_NETWORKS: {exc}") from exc

LOG_LEVEL = _env_value("LOG_LEVEL", str, "INFO")
LOG_JSON = _env_value("LOG_JSON", bool, PRODUCTION)
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
