"""Test settings: the production shape (PostgreSQL + Redis) with short leases.

DATABASE_URL / REDIS_URL override the local default ports; pytest-django creates the
test database ``test_<name>`` (or DATABASE_TEST_NAME) and worker processes started by
the tests are pointed at it. ``make test`` runs the tests in parallel processes
(pytest-xdist), each with services of its own (``_own_per_test_process``).
"""

import os
import tempfile
from urllib.parse import urlparse, urlunparse

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
os.environ.setdefault("CELERY_BROKER_URL", os.environ["REDIS_URL"])
os.environ.setdefault("SECRET_KEY", "test-secret-key-that-is-long-enough-for-the-check-0123")
os.environ.setdefault("RUN_LEASE_SECONDS", "3")
os.environ.setdefault("RUN_STALL_SECONDS", "5")
os.environ.setdefault("WORK_LEASE_SECONDS", "3")
os.environ.setdefault("WORK_REWAKE_SECONDS", "1")
os.environ.setdefault("AGENTPLATFORM_VAR_DIR", tempfile.mkdtemp(prefix="agentplatform-test-"))
# The tests' sample repositories live in temporary directories.
os.environ.setdefault("LOCAL_REPOSITORY_ROOTS", tempfile.gettempdir())
# The tests' own git servers listen on 127.0.0.1 and speak plain http: allowed by name
# here, not by a gap in the rules (tests of the rules set the production defaults).
os.environ.setdefault("GIT_ALLOWED_SCHEMES", "https,http")
os.environ.setdefault("GIT_INTERNAL_HOSTS", "127.0.0.1")


def _own_per_test_process() -> None:
    """Under pytest-xdist each test process (gw0, gw1, ...) gets a Redis database and a
    directory for its files (sandboxes, repositories, metrics, the embedded broker) of its own, as
    pytest-django gives it a test database of its own: the queues one process's tests
    purge never hold the other's messages, and the files one cleans up are its own. The
    environment says so once; the workers and servers a test starts inherit it as is."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or os.environ.get("TEST_PROCESS_OWN") == worker:
        return
    for name in ("REDIS_URL", "CELERY_BROKER_URL"):
        url = urlparse(os.environ[name])
        if url.scheme.startswith("redis"):
            db = int(url.path.strip("/") or 0) + 1 + int(worker[2:])
            os.environ[name] = urlunparse(url._replace(path=f"/{db}"))
    for name in ("AGENTPLATFORM_VAR_DIR", "PROMETHEUS_MULTIPROC_DIR"):
        if name in os.environ:  # the metrics' directory: set by the settings pytest loaded
            os.environ[name] = os.path.join(os.environ[name], worker)
    os.environ["TEST_PROCESS_OWN"] = worker


_own_per_test_process()

from agentplatform.settings import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# In-process tests render pages without a collectstatic run; the browser tests start the
# real server, which serves the collected, hashed files (tests/browser/conftest.py).
STORAGES = {
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# WhiteNoise warns (an error here) about a static root that does not exist yet.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405

# The scripted model is free; spend and cost budgets are tested with a priced copy.
MODEL_PROFILES = {
    **MODEL_PROFILES,  # noqa: F405
    "scripted-priced": {
        "provider": "scripted",
        "model": "scripted-1",
        "prices_per_million": {"input": "0.50", "output": "1.50"},
    },
}
