"""The database and the broker: configured, or embedded (started from their wheels);
Celery's settings and the Redis the live views and wake-ups use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from agentplatform import embedded
from agentplatform.settings.environment import VAR_DIR, env, env_value

# --- Database and broker ----------------------------------------------------------------

# Without DATABASE_URL (or without both CELERY_BROKER_URL and REDIS_URL) the platform
# starts its own PostgreSQL and Valkey from their wheels, data under this directory, and
# every process of this checkout shares them (agentplatform.embedded).
EMBEDDED_SERVICES_DIR = Path(env_value("AGENTPLATFORM_SERVICES_DIR", str, str(VAR_DIR)))
_configured_database = env_value("DATABASE_URL", str, "")
_configured_broker = env_value("CELERY_BROKER_URL", str, "")
_configured_redis = env_value("REDIS_URL", str, "")
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
    except (embedded.EmbeddedError, OSError) as _exc:
        raise ImproperlyConfigured(
            f"The embedded PostgreSQL and Valkey did not start ({_exc}). Set DATABASE_URL "
            "and CELERY_BROKER_URL (or REDIS_URL) to use servers of your own."
        ) from _exc
DATABASE_URL = _configured_database or _services.database_url
_database = _database or _database_config(DATABASE_URL)

# Threads per web process that run every request except the live streams
# (agentplatform.asgi); each holds a database connection while it works. A process runs
# Python on one core at a time: four threads cover the waits for PostgreSQL and Redis,
# and more only take turns at the interpreter lock (task submissions went 15% faster
# with four than with eight; scale with processes instead).
WEB_THREADS = env_value("WEB_THREADS", int, 4)
# A new PostgreSQL connection costs ~3 ms and a backend process, which would dominate
# short requests and steps. Workers and WSGI processes keep one persistent connection
# per thread. The web entry point (agentplatform.asgi) also runs the live streams'
# sync code in a fresh thread per request, where a per-thread connection would be a
# new (and leaked) connection each time: there a psycopg pool shared by the process
# hands connections out instead (the entry point turns it on).
_database.setdefault("OPTIONS", {})
_database["CONN_HEALTH_CHECKS"] = True
DATABASE_POOL = env_value("DATABASE_POOL", bool, False)
if DATABASE_POOL:
    # Django's own psycopg pool (its documented OPTIONS["pool"]); with
    # CONN_HEALTH_CHECKS it checks each connection it hands out.
    _database["CONN_MAX_AGE"] = 0
    _database["OPTIONS"]["pool"] = {
        "min_size": env_value("DATABASE_POOL_MIN_SIZE", int, 2),
        # One per request thread, plus two for the live streams' sign-in checks.
        "max_size": env_value("DATABASE_POOL_MAX_SIZE", int, WEB_THREADS + 2),
        # A request waits this long for a free connection before failing; a burst
        # larger than the pool queues instead of opening more connections.
        "timeout": env_value("DATABASE_POOL_TIMEOUT", float, 30.0),
        # Connections above the minimum idle this long are closed.
        "max_idle": env_value("DATABASE_POOL_MAX_IDLE", float, 60.0),
    }
else:
    _database["CONN_MAX_AGE"] = env_value("DATABASE_CONN_MAX_AGE", int, 600)
_application_name = env_value("DATABASE_APPLICATION_NAME", str, "")
if _application_name:
    _database["OPTIONS"]["application_name"] = _application_name
_database["TEST"] = {"NAME": env_value("DATABASE_TEST_NAME", str, None)}
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
CELERY_TASK_SOFT_TIME_LIMIT = env_value("CELERY_TASK_SOFT_TIME_LIMIT", int, 900)
CELERY_TASK_TIME_LIMIT = env_value("CELERY_TASK_TIME_LIMIT", int, 960)
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
