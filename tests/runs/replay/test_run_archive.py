"""Export and import: a run's record round-trips, read-only, and holds no secret."""

from __future__ import annotations

import io
import tarfile

import pytest
from django.db import transaction

from jobs.models import OutboxEvent
from runs import demo
from runs.engine import run_drive_inline
from runs.models import Artifact, Repository, RunImport, Task
from runs.replay.archive import ArchiveInvalid, run_export, run_import
from runs.replay.fold import run_check
from runs.services import CommandRefused, task_retry, task_submit
from runs.timeline import event_record
from tests.factories import WorkspaceFactory

pytestmark = pytest.mark.django_db(transaction=True)

WEBHOOK_SECRET = "whsec-planted-7f3a9c1e5b"
URL_PASSWORD = "pl4nted-clone-pass"
MODEL_KEY = "planted-model-key-91c2"


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


def test_export_import_round_trips_artifacts_and_holds_no_secret(workspace, repository, tmp_path):
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script(), "api_key": MODEL_KEY},
    )
    run = run_drive_inline(run_id=submission.run.id)
    Repository.objects.filter(pk=repository.pk).update(
        webhook_secret=WEBHOOK_SECRET,
        clone_url=f"https://bob:{URL_PASSWORD}@git.example.com/calc.git",
    )
    with transaction.atomic():
        event_record(
            task=run.task,
            run=run,
            type="agent.run.operator_action",
            data={"action": "note", "by": "t", "note": f"secret is {WEBHOOK_SECRET}"},
        )
    run.refresh_from_db()
    archive = tmp_path / "run.tar.gz"
    with archive.open("wb") as out:
        run_export(run=run, out=out)

    with tarfile.open(archive) as tar:
        text = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    for secret in (WEBHOOK_SECRET, URL_PASSWORD, MODEL_KEY):
        assert secret.encode() not in text

    elsewhere = WorkspaceFactory()
    imported = run_import(path=archive, workspace=elsewhere, by="t")

    assert RunImport.objects.get(run=imported).source_run_id == run.id
    assert imported.status == run.status and imported.tokens_in == run.tokens_in
    originals = {a.name: a.content.encode() for a in Artifact.objects.filter(run=run)}
    copies = {a.name: a.content.encode() for a in Artifact.objects.filter(run=imported)}
    assert copies == originals and len(copies) > 3
    assert imported.patches.get().diff_sha256 == run.patches.get().diff_sha256
    assert list(imported.events.values_list("type", flat=True)) == list(
        run.events.values_list("type", flat=True)
    )
    assert not run_check(imported).drifted
    with pytest.raises(CommandRefused):
        task_retry(task=Task.objects.get(pk=imported.task_id), by="t")
    assert run_import(path=archive, workspace=elsewhere, by="t") == imported
    assert RunImport.objects.filter(source_run_id=run.id).count() == 1
    assert not OutboxEvent.objects.filter(partition_key=str(imported.id)).exists()


def test_a_tampered_archive_is_refused(workspace, repository, tmp_path):
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = run_drive_inline(run_id=submission.run.id)
    buffer = io.BytesIO()
    run_export(run=run, out=buffer)
    tampered = tmp_path / "t.tar.gz"
    with (
        tarfile.open(fileobj=io.BytesIO(buffer.getvalue())) as src,
        tarfile.open(tampered, "w:gz") as dst,
    ):
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name == "run.json":
                data = data.replace(b'"completed"', b'"failed"')
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))

    with pytest.raises(ArchiveInvalid, match="checksum"):
        run_import(path=tampered, workspace=WorkspaceFactory(), by="t")
