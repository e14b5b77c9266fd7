"""Real servers for the git network tests: a listener that records every request's
headers (and can speak git's smart HTTP protocol or redirect), and a black hole that
accepts connections and never answers."""

from __future__ import annotations

import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

BACKEND = "/usr/lib/git-core/git-http-backend"


class RecordingGitServer:
    """An HTTP server on 127.0.0.1 that records the headers of every request.

    With ``root`` it serves the bare repositories under it (``git http-backend``); with
    ``redirect_to`` it answers every request with a 302 there; otherwise 401, which
    invites a client to send whatever credential it has.
    """

    def __init__(self, *, root: Path | None = None, redirect_to: str = "") -> None:
        self.requests: list[dict[str, str]] = []
        self.connections = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                server.requests.append({k.lower(): v for k, v in self.headers.items()})
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if redirect_to:
                    self.send_response(302)
                    self.send_header("Location", redirect_to + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif root is None:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._backend(root, body)

            def _backend(self, root: Path, body: bytes) -> None:
                url = urlparse(self.path)
                env = {
                    "GIT_PROJECT_ROOT": str(root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": url.path,
                    "QUERY_STRING": url.query,
                    "REQUEST_METHOD": self.command,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                }
                out = subprocess.run([BACKEND], input=body, env=env, capture_output=True).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                status, headers = 200, []
                for line in head.decode().split("\r\n"):
                    name, _, value = line.partition(": ")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _serve

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request: Any, client_address: Any) -> bool:
                server.connections += 1
                return True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def header_values(self, name: str) -> list[str]:
        return [r[name.lower()] for r in self.requests if name.lower() in r]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class BlackHole:
    """Accepts TCP connections on 127.0.0.1 and never sends or reads a byte."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(connection)

    def close(self) -> None:
        self.listener.close()
        for connection in self.accepted:
            connection.close()
