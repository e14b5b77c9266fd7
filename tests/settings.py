"""Test settings: the production shape (PostgreSQL + Redis) with short leases.

With DATABASE_URL and REDIS_URL set the tests use those servers; for either not set, the
embedded PostgreSQL and Valkey of agentplatform.embedded, started for this test session
in its temporary directory and stopped when the session ends (``_embedded_services``).
pytest-django creates the test database ``test_<name>`` (or DATABASE_TEST_NAME) and
worker processes started by the tests are pointed at it. ``make test`` runs the tests in
parallel processes (pytest-xdist), each with services of its own
(``_own_per_test_process``).
"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlparse, urlunparse

from agentplatform import embedded, supervision

# Where nothing listens: what a service that did not come up is reached at, so the
# service tests are skipped (or, with REQUIRE_SERVICES=1, the run fails) as for a
# configured server that is down (tests/conftest.py).
UNREACHABLE_DATABASE_URL = "postgres://postgres@127.0.0.1:9/unavailable"
UNREACHABLE_REDIS_URL = "redis://127.0.0.1:9/0"
os.environ.setdefault("SECRET_KEY", "test-secret-key-that-is-long-enough-for-the-check-0123")
os.environ.setdefault("RUN_LEASE_SECONDS", "3")
os.environ.setdefault("RUN_STALL_SECONDS", "5")
os.environ.setdefault("WORK_LEASE_SECONDS", "3")
os.environ.setdefault("WORK_REWAKE_SECONDS", "1")
os.environ.setdefault("AGENTPLATFORM_VAR_DIR", tempfile.mkdtemp(prefix="agentplatform-test-"))


def _embedded_services() -> None:
    """DATABASE_URL or REDIS_URL not set: this session's own PostgreSQL and Valkey,
    named in the environment as configured servers would be (the worker and web processes
    the tests start inherit it). The first process of the session starts them (the xdist
    controller, before its test processes, which find them in the environment) and stops
    them at its exit; embedded services of earlier sessions that lost their owner (a
    killed run) are stopped first."""
    if "DATABASE_URL" in os.environ and "REDIS_URL" in os.environ:
        return
    session = Path(os.environ["AGENTPLATFORM_VAR_DIR"])
    # Searchable (not readable) by others: as root the servers run as an unprivileged
    # account, which must reach its data directories inside (mkdtemp makes it 0700).
    session.chmod(0o711)
    root = session / "services"
    supervision.die_with_make()
    for orphan in embedded.orphans_stop(
        Path(tempfile.gettempdir()).glob("agentplatform-test-*/services")
    ):
        shutil.rmtree(orphan, ignore_errors=True)
    try:
        endpoints = embedded.ensure(root, own=True)
    except (embedded.EmbeddedError, OSError) as exc:
        os.environ["EMBEDDED_SERVICES_ERROR"] = str(exc)[:2000]
        return
    atexit.register(_embedded_services_remove, root)
    # A killed run (a CI time limit, Ctrl-C twice) stops them too: its watchdog does.
    supervision.Watchdog(supervision.PidFile(session, "pytest"), embedded_root=root)
    # Whichever of the two is not configured.
    os.environ.setdefault("DATABASE_URL", endpoints.database_url)
    os.environ.setdefault("REDIS_URL", endpoints.redis_url)


def _embedded_services_remove(root: Path) -> None:
    embedded.release(root)
    shutil.rmtree(root, ignore_errors=True)


_embedded_services()
os.environ.setdefault("DATABASE_URL", UNREACHABLE_DATABASE_URL)
os.environ.setdefault("REDIS_URL", UNREACHABLE_REDIS_URL)
os.environ.setdefault("CELERY_BROKER_URL", os.environ["REDIS_URL"])
# The tests' sample repositories live in temporary directories.
os.environ.setdefault("LOCAL_REPOSITORY_ROOTS", tempfile.gettempdir())
# The tests' own git servers listen on 127.0.0.1 and speak plain http: allowed by name
# here, not by a gap in the rules (tests of the rules set the production defaults).
os.environ.setdefault("GIT_ALLOWED_SCHEMES", "https,http")
os.environ.setdefault("GIT_INTERNAL_HOSTS", "127.0.0.1")


def _own_per_test_process() -> None:
    """Under pytest-xdist each test process (gw0, gw1, ...) gets a Redis database and a
    directory for its files (sandboxes, repositories, metrics) of its own, as
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
