"""``make serve``: web (uvicorn, ASGI), the host's Celery workers and beat, in the foreground.

The workers are production's layout of one host (``agentplatform.layout``): a threads
worker for ``agent`` where runs wait on their model, a prefork worker per core for
``verify``, and one for ``events,webhooks``.

Ctrl-C (or SIGTERM) stops them all cleanly, and then the embedded PostgreSQL and Valkey
when no other ``serve`` or ``demo`` of the checkout holds them. Killed (even by SIGKILL),
its children stop on their parent-death signal and its watchdog stops what remains,
the embedded servers included; what a killed serve left is swept at the next start
(agentplatform.supervision). For local use; in
production run each process under your supervisor of choice (see the README).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from agentplatform import embedded, layout, supervision
from agentplatform.metrics import multiprocess_dir_reset
from runs.management.process_groups import process_groups_stop


class Command(BaseCommand):
    help = "Run the web server, the workers and beat in the foreground (Ctrl-C stops them)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        # Runs kept in flight (threads of the agent worker) and processes for tests.
        parser.add_argument("--agent-threads", type=int, default=layout.AGENT_THREADS)
        parser.add_argument("--verify-processes", type=int, default=0)

    def handle(self, *args: Any, **options: Any) -> None:
        supervision.die_with_make()
        run_dir = Path(settings.VAR_DIR) / "run"
        if swept := supervision.sweep(run_dir):
            self.stderr.write(f"stopped {swept} processes left by an earlier serve")
        pid_file = supervision.PidFile(run_dir, "serve")
        watchdog = None
        try:
            with embedded.held(settings.EMBEDDED_SERVICES_IN_USE) as stops:
                watchdog = supervision.Watchdog(
                    pid_file, embedded_root=settings.EMBEDDED_SERVICES_IN_USE if stops else None
                )
                self.run_children(options, pid_file)
                if stops:
                    self.stdout.write("stopping the embedded PostgreSQL and Valkey")
        finally:
            if watchdog is not None:
                watchdog.stop()
            pid_file.remove()

    def run_children(self, options: dict[str, Any], pid_file: supervision.PidFile) -> None:
        celery = [sys.executable, "-m", "celery", "-A", "agentplatform"]
        commands = {
            "web": [
                sys.executable,
                "-m",
                "uvicorn",
                "agentplatform.asgi:application",
                "--host",
                options["host"],
                "--port",
                str(options["port"]),
            ],
            "beat": [*celery, "beat", "--loglevel", "INFO"],
        }
        environments: dict[str, dict[str, str]] = {}
        for worker in layout.host_workers(
            agent_threads=options["agent_threads"],
            verify_processes=options["verify_processes"],
        ):
            name = f"worker-{worker.name}"
            commands[name] = worker.argv(sys.executable)
            environments[name] = {**os.environ, **worker.env}
        # Files of processes that are gone would be summed forever (live ones stay: a
        # second stack may share the directory).

        multiprocess_dir_reset()
        children: dict[str, subprocess.Popen[bytes]] = {}
        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        for name, argv in commands.items():
            # Own process groups: Ctrl-C reaches us once, and we stop each child in order;
            # SIGTERM from the kernel if we die without stopping them.
            children[name] = supervision.spawn(
                argv, cwd=Path(settings.BASE_DIR), env=environments.get(name)
            )
            pid_file.add(name, children[name].pid)
        self.stdout.write(
            f"agentplatform on http://{options['host']}:{options['port']}/ "
            f"(admin /admin/, API /api/, docs /api/docs/) — Ctrl-C to stop"
        )
        try:
            while not stopping:
                exited = [name for name, child in children.items() if child.poll() is not None]
                if exited:
                    self.stderr.write(f"{', '.join(exited)} exited; stopping the others")
                    break
                time.sleep(0.5)
        finally:
            process_groups_stop(children.values(), timeout=20)
        self.stdout.write("stopped")
