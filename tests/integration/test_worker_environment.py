"""The tests' workers run with a worker's defaults, whatever the test process imported.

Workers, beat and servers started by the tests inherit this process's environment. The
web entry point (``agentplatform.asgi``) sets its own process's defaults there when it is
imported: a connection pool and batched wake-ups. A test module that imports it must
leave them out; otherwise every worker started later in the same session runs with the
web process's settings, not the worker's, and a worker whose database went away waits
out the pool's timeout at shutdown.
"""

from __future__ import annotations

import importlib
import os

import pytest

WEB_ENTRY_DEFAULTS = ("DATABASE_POOL",)


@pytest.mark.no_services
def test_the_test_process_carries_none_of_the_web_entry_points_defaults():
    # Imports agentplatform.asgi, unless the session's collection already has.
    importlib.import_module("tests.agentplatform.test_web_entry")
    assert [key for key in WEB_ENTRY_DEFAULTS if key in os.environ] == []
