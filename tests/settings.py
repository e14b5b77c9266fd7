"""Test settings: the production shape (PostgreSQL + Redis) with short leases.

DATABASE_URL / REDIS_URL override the local default ports; pytest-django creates the
test database ``test_<name>`` (or DATABASE_TEST_NAME) and worker processes started by
the tests are pointed at it.
"""

import os
import tempfile

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

from agentplatform.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# In-process tests render pages without a collectstatic run; the browser tests start the
# real server, which serves the collected, hashed files (tests/browser/conftest.py).
STORAGES = {
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# WhiteNoise warns (an error here) about a static root that does not exist yet.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405
