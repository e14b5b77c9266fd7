"""An answered turn is kept when the database refuses its commit for a moment: the step
writes it once the database lets it in, and the model is never asked that turn again.

A real threads worker runs the scripted agent against a local model endpoint (Chat
Completions over HTTP). While the model answers the run's first acting turn, the test
database stops accepting connections for a moment shorter than a lease; the step gave
its connection back for the wait, so the answer's commit meets the refusal.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from runs.models import ModelTurn, Run
from runs.services import task_submit
from runs.state import TERMINAL
from tests.chaos.modelserver import ScriptedModelServer
from tests.chaos.stack import short_fix_script
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.services]

PROFILE = "refusing-model"
REFUSED_SECONDS = 1.5  # shorter than a lease (tests run with RUN_LEASE_SECONDS=3)


def _admin() -> psycopg.Connection:
    db = settings.DATABASES["default"]
    return psycopg.connect(
        dbname="postgres", user=db["USER"], host=db["HOST"], port=db["PORT"], autocommit=True
    )


class RefusingModelServer(ScriptedModelServer):
    """The scripted agent; its first act-0 answer is sent while the database refuses new
    connections, for ``REFUSED_SECONDS`` from then."""

    def __init__(self, script: dict[str, Any], database: str) -> None:
        super().__init__(script)
        self.database = database
        self.refused = threading.Event()
        self.allowed = threading.Event()

    def reply(self, body: dict[str, Any], position: str) -> dict[str, Any]:
        if position == "act-0" and not self.refused.is_set():
            self.refused.set()
            with _admin() as admin:
                admin.execute(f'ALTER DATABASE "{self.database}" ALLOW_CONNECTIONS false')
            threading.Timer(REFUSED_SECONDS, self._allow).start()
        return super().reply(body, position)

    def _allow(self) -> None:
        with _admin() as admin:
            admin.execute(f'ALTER DATABASE "{self.database}" ALLOW_CONNECTIONS true')
        self.allowed.set()


def test_an_answer_whose_commit_is_refused_is_kept_and_not_asked_again(
    workspace, repository, start_worker, settings
):
    name = connection.settings_dict["NAME"]
    model = RefusingModelServer(short_fix_script(), name)
    try:
        settings.MODEL_PROFILES = {**settings.MODEL_PROFILES, PROFILE: model.profile()}
        worker = start_worker(
            pool="threads",
            concurrency=2,
            env={"MODEL_PROFILES": json.dumps({PROFILE: model.profile()})},
        )
        run = task_submit(
            workspace=workspace,
            repository=repository,
            instruction="Fix add()",
            model_options={"profile": PROFILE},
        ).run

        def ended() -> Run | None:
            current = Run.objects.get(pk=run.pk)
            return current if current.status in TERMINAL else None

        final = wait_for(ended, timeout=120, message="the run to end")
    finally:
        model.allowed.wait(timeout=REFUSED_SECONDS + 10)
        model.close()
    assert model.refused.is_set() and model.allowed.is_set()
    assert (final.status, final.failure_reason) == (Run.Status.COMPLETED, "")
    asked = Counter(r.key for r in model.requests())
    turns = ModelTurn.objects.filter(run=run).values_list("step_no", "turn_no")
    assert asked == Counter(f"{run.pk}:{step}:{turn}" for step, turn in turns), asked
    # The refusal was met by the answer's commit, which was made once it passed.
    assert "model.turn_checkpoint_retried" in worker.output()
    assert final.recoveries == 0
