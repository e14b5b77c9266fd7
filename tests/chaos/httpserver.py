"""The harness's local HTTP servers: a client that goes away is part of the test.

The chaos suite kills workers in the middle of their requests; ``http.server`` would
print a traceback for every such reset. Those are expected, so they are dropped; any
other error in a handler is still printed.
"""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any

CLIENT_GONE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class HarnessHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], CLIENT_GONE):
            return
        super().handle_error(request, client_address)
