"""The production web server: uvicorn workers, each with a listening socket of its own.

    python -m agentplatform.web --host 0.0.0.0 --port 8000 --workers 2

``uvicorn --workers N`` binds one socket in its parent and every worker accepts from
it. The kernel wakes the worker that waited last, and that worker accepts every
connection pending at once, so a few long-lived connections (a proxy's keep-alive pool,
a load test's clients) can all land on one worker while the others idle: 32 of a
benchmark's connections split 32/0, 7/25 and 9/23 between two workers. Here each
worker binds its own socket to the address with ``SO_REUSEPORT``, and the kernel spreads
new connections over the workers by a hash of their addresses.

The parent starts the workers, starts a new one in place of a worker that died, and on
SIGTERM or SIGINT stops them all; each stops accepting and finishes the requests in
flight (uvicorn's graceful shutdown, at most ``--timeout-graceful-shutdown`` seconds).
A worker that cannot start (the address taken, the application failing to import)
stops the server with uvicorn's start-up failure status instead of being restarted.
A worker whose event loop stalls keeps its share of new connections (with one shared
socket the other workers would take them): a worker's liveness here is its process's.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from uvicorn.config import STARTUP_FAILURE

APPLICATION = "agentplatform.asgi:application"
# A worker that dies is replaced after this pause, so a crash loop does not spin.
RESTART_PAUSE_SECONDS = 1.0

log = logging.getLogger("agentplatform.web")


def listening_socket(host: str, port: int, *, shared: bool = True) -> socket.socket:
    """A TCP socket bound to ``host:port``, in the address's ``SO_REUSEPORT`` group when
    ``shared``; without it the bind fails while anyone listens there.

    Made with an explicit protocol: asyncio turns on ``TCP_NODELAY`` for accepted
    connections only when the listening socket says it is TCP."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def worker_serve(host: str, port: int, options: dict[str, Any]) -> None:
    """One worker process: its own socket in the address's group, then uvicorn on it."""
    import uvicorn

    config = uvicorn.Config(host=host, port=port, **options)
    try:
        sock = listening_socket(host, port)
    except OSError as error:
        config.configure_logging()
        log.error("web.bind_failed host=%s port=%s error=%s", host, port, error)
        sys.exit(STARTUP_FAILURE)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(STARTUP_FAILURE)


class Supervisor:
    """Keeps ``workers`` worker processes serving until told to stop."""

    def __init__(self, host: str, port: int, workers: int, options: dict[str, Any]) -> None:
        self.host = host
        self.port = port
        self.workers = workers
        self.options = options
        self.context = multiprocessing.get_context("spawn")
        self.processes: list[BaseProcess] = []
        self.stopping = False
        self.status = 0

    def _start(self) -> BaseProcess:
        process = self.context.Process(
            target=worker_serve,
            args=(self.host, self.port, self.options),
            name="agentplatform-web",
        )
        process.start()
        return process

    def stop(self, signum: int = signal.SIGTERM, frame: Any = None) -> None:
        self.stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        self.processes = [self._start() for _ in range(self.workers)]
        log.info(
            "web.started host=%s port=%s workers=%s pids=%s",
            self.host,
            self.port,
            self.workers,
            [p.pid for p in self.processes],
        )
        while not self.stopping:
            wait([p.sentinel for p in self.processes], timeout=0.5)
            for index, process in enumerate(self.processes):
                if self.stopping or process.is_alive():
                    continue
                process.join()
                if process.exitcode == STARTUP_FAILURE:
                    log.error("web.worker_failed_to_start pid=%s", process.pid)
                    self.status = STARTUP_FAILURE
                    self.stopping = True
                    break
                log.warning("web.worker_died pid=%s exitcode=%s", process.pid, process.exitcode)
                time.sleep(RESTART_PAUSE_SECONDS)
                if not self.stopping:
                    self.processes[index] = self._start()
        self._stop_all()
        return self.status

    def _stop_all(self) -> None:
        # A worker still running a while after its own limit is killed.
        grace = self.options["timeout_graceful_shutdown"] + 5
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("web.worker_killed pid=%s", process.pid)
                process.kill()
                process.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--application", default=APPLICATION, help=f"the ASGI application (default {APPLICATION})"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WEB_CONCURRENCY", "2")))
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--no-access-log", action="store_true")
    parser.add_argument(
        "--timeout-graceful-shutdown",
        type=int,
        default=30,
        help="seconds a stopping worker waits for requests in flight (default: 30)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.port == 0:
        parser.error("--port 0 would give each worker a port of its own; name a port")
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")
    try:
        # Fails at once, in the parent, for an address that is not ours or where anyone
        # listens already: another server of ours too, which would otherwise join the
        # workers' group and take a share of the connections.
        listening_socket(args.host, args.port, shared=False).close()
    except OSError as error:
        log.error("web.bind_failed host=%s port=%s error=%s", args.host, args.port, error)
        return STARTUP_FAILURE
    options: dict[str, Any] = {
        "app": args.application,
        "log_level": args.log_level,
        "access_log": not args.no_access_log,
        "timeout_graceful_shutdown": args.timeout_graceful_shutdown,
    }
    return Supervisor(args.host, args.port, args.workers, options).run()


if __name__ == "__main__":
    sys.exit(main())
