"""A brief loss of the database in the middle of a run does not fail the run.

The worker reaches PostgreSQL through a TCP proxy this test controls. While a run is
underway the proxy cuts every connection and refuses new ones for a few seconds (what a
database restart or a full connection limit looks like to the worker), then lets them
through again. The run must complete: steps that hit the outage are retried with their
lease, not dead-lettered.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import pytest
from django.conf import settings

from runs import demo
from runs.models import Run
from runs.services import task_submit
from runs.state import TERMINAL
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.services]


class Proxy:
    """Forwards TCP to PostgreSQL; ``cut()`` drops every connection and refuses new ones."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.open = False
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.sockets.clear()

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def proxy() -> Any:
    db = settings.DATABASES["default"]
    p = Proxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))
    yield p
    p.close()


def test_a_run_rides_out_a_database_outage(workspace, repository, start_worker, proxy):
    db = settings.DATABASES["default"]
    start_worker(
        env={"DATABASE_URL": f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}"}
    )
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = submission.run
    # Cut the database again and again while the run is under way, so that cuts land
    # inside steps (holding a lease) as well as between them.
    wait_for(lambda: Run.objects.get(pk=run.pk).step_no >= 1, timeout=60, message="run started")
    for _ in range(3):
        proxy.cut()
        time.sleep(2.5)
        proxy.restore()
        time.sleep(0.7)

    def ended() -> Run | None:
        current = Run.objects.get(pk=run.pk)
        return current if current.status in TERMINAL else None

    final = wait_for(ended, timeout=120, message="run to end")
    assert final.status == Run.Status.COMPLETED, (final.failure_reason, final.failure_detail)
