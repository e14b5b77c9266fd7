"""Export and import: a finished run's complete record as one tar.gz, for investigation
on another installation.

The archive holds ``manifest.json`` (format, source, counts, and the sha256 and size of
every other member), ``task.json`` and ``run.json``, one JSON Lines file per kind of
row (events, model turns, tool calls, patches, verifications, judgements, approvals,
pull requests, artifacts' metadata) and each artifact's content under ``artifacts/``.
Secrets never enter it: every text goes through the log redaction (secret-named keys,
credentials in URLs, known token shapes, the installation's own secrets) and the
repository's webhook secret, the workspace's subscription secrets and the clone URL's
credentials are removed by value; the webhook secret itself is not exported.

An import checks every checksum first, then writes the record under new ids into a
workspace the operator names, on a repository of its own that has nothing to clone, no
provider identity (no webhook reaches it) and admits no run, and marks the run with a
RunImport row. Imported runs are finished, get no outbox events (nothing is published
or consumed again), and are refused by retry, follow-up, replay and fork.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.forms.models import model_to_dict
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agentplatform.logging import REDACTED, redact_value, secrets_from_settings
from jobs.models import EventSubscription
from runs.agent.artifacts import redact
from runs.models import (
    Approval,
    Artifact,
    JudgeAttempt,
    ModelTurn,
    Patch,
    PullRequest,
    Repository,
    Run,
    RunEvent,
    RunImport,
    Task,
    ToolCall,
    VerificationAttempt,
    Workspace,
)
from runs.services import CommandRefused
from runs.state import TERMINAL

FORMAT = "agentplatform.run-archive/1"
RUN_FIELDS = (
    "run_no", "status", "step_no", "attempt", "recoveries", "retries", "cancel_requested_at",
    "cancel_requested_by", "cancel_reason", "base_commit", "branch", "model_profile",
    "tokens_in", "tokens_out", "cost_usd", "failure_reason", "failure_detail", "feedback",
    "checkpoint", "last_sequence_no", "created_at", "started_at", "finished_at",
    "status_changed_at",
)  # fmt: skip
TASK_FIELDS = (
    "instruction", "task_type", "risk_level", "execution_mode", "target_branch",
    "requested_by", "source", "source_ref", "priority", "budget", "model_options", "status",
    "status_reason", "usage", "created_at",
)  # fmt: skip


def _clone_url_safe(url: str) -> str:
    parts = urlsplit(url)
    if parts.username or parts.password:
        return urlunsplit(parts._replace(netloc=parts.hostname or ""))
    return url


class _Scrubber:
    """Secrets out of every value: by shape and name (the log redaction) and by value."""

    def __init__(self, run: Run) -> None:
        repository = run.task.repository
        values = [repository.webhook_secret, *secrets_from_settings(settings)]
        values += EventSubscription.objects.filter(workspace_id=run.workspace_id).values_list(
            "secret", flat=True
        )
        parts = urlsplit(repository.clone_url)
        values += [parts.password or "", parts.username or ""] if parts.password else []
        self.values = sorted({v for v in values if v and len(v) >= 6}, key=len, reverse=True)

    def text(self, value: str) -> str:
        value = redact(redact_value(value))
        for secret in self.values:
            value = value.replace(secret, REDACTED)
        return value

    def value(self, value: Any) -> Any:
        value = redact_value(value)
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value


def _row(instance: Any, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    data = model_to_dict(instance, exclude=["run", *exclude])
    data["id"] = instance.pk
    for name in ("created_at", "finished_at", "requested_at", "decided_at", "updated_at"):
        if hasattr(instance, name):
            data[name] = getattr(instance, name)
    return data


def _jsonl(rows: list[dict[str, Any]], scrub: _Scrubber) -> bytes:
    return "".join(
        json.dumps(scrub.value(json.loads(json.dumps(r, cls=DjangoJSONEncoder))), sort_keys=True)
        + "\n"
        for r in rows
    ).encode()


def _members(run: Run, scrub: _Scrubber) -> dict[str, bytes]:
    task, repository = run.task, run.task.repository
    members: dict[str, bytes] = {}
    task_data = {f: getattr(task, f) for f in TASK_FIELDS} | {"id": task.id}
    task_data["repository"] = {
        "name": repository.name,
        "provider": repository.provider,
        "external_id": repository.external_id,
        "clone_url": _clone_url_safe(repository.clone_url),
        "default_branch": repository.default_branch,
        "test_command": repository.test_command,
    }
    task_data["workspace"] = task.workspace.slug
    members["task.json"] = _jsonl([task_data], scrub)
    members["run.json"] = _jsonl([{f: getattr(run, f) for f in RUN_FIELDS} | {"id": run.id}], scrub)
    tables: dict[str, Any] = {
        "events.jsonl": RunEvent.objects.filter(run=run).order_by("sequence_no"),
        "model_turns.jsonl": ModelTurn.objects.filter(run=run).order_by("step_no", "turn_no"),
        "tool_calls.jsonl": ToolCall.objects.filter(run=run).order_by("id"),
        "patches.jsonl": Patch.objects.filter(run=run).order_by("attempt_no"),
        "verifications.jsonl": VerificationAttempt.objects.filter(run=run).order_by("id"),
        "judgements.jsonl": JudgeAttempt.objects.filter(run=run).order_by("id"),
        "approvals.jsonl": Approval.objects.filter(run=run).order_by("id"),
        "pull_requests.jsonl": PullRequest.objects.filter(task=task).order_by("id"),
    }
    for name, rows in tables.items():
        members[name] = _jsonl([_row(r) for r in rows], scrub)
    artifacts = list(Artifact.objects.filter(run=run).order_by("created_at", "id"))
    meta = []
    for artifact in artifacts:
        content = scrub.text(artifact.content).encode("utf-8")
        members[f"artifacts/{artifact.id}"] = content
        meta.append(
            _row(artifact, exclude=("content",))
            | {"redacted": content != artifact.content.encode()}
        )
    members["artifacts.jsonl"] = _jsonl(meta, scrub)
    return members


def run_export(*, run: Run, out: io.BufferedIOBase | Any) -> dict[str, Any]:
    """Write the run's archive to ``out`` (a binary file); returns the manifest."""
    if run.status not in TERMINAL:
        raise CommandRefused("run_active", f"run {run.id} is {run.status}; export a finished run")
    scrub = _Scrubber(run)
    members = _members(run, scrub)
    manifest = {
        "format": FORMAT,
        "run_id": str(run.id),
        "task_id": str(run.task_id),
        "exported_at": timezone.now().isoformat(),
        "files": {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for name, data in sorted(members.items())
        },
    }
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in [
            ("manifest.json", json.dumps(manifest, indent=1).encode()),
            *sorted(members.items()),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            archive.addfile(info, io.BytesIO(data))
    return manifest


class ArchiveInvalid(Exception):
    """The archive is not a run archive, or a member does not match its checksum."""


def _archive_read(data: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members = {
                m.name: archive.extractfile(m).read()  # type: ignore[union-attr]
                for m in archive.getmembers()
                if m.isfile()
            }
    except (tarfile.TarError, OSError) as exc:
        raise ArchiveInvalid(f"not a tar.gz archive: {exc}") from exc
    manifest = json.loads(members.pop("manifest.json", b"{}"))
    if manifest.get("format") != FORMAT:
        raise ArchiveInvalid(f"not a {FORMAT} archive")
    if set(members) != set(manifest["files"]):
        raise ArchiveInvalid("the archive's members differ from its manifest")
    for name, expected in manifest["files"].items():
        if hashlib.sha256(members[name]).hexdigest() != expected["sha256"]:
            raise ArchiveInvalid(f"{name}: checksum mismatch")
    return manifest, members


def _lines(members: dict[str, bytes], name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in members[name].decode().splitlines() if line]


def _when(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else None


@dataclass
class _Ids:
    artifacts: dict[str, Artifact]
    patches: dict[int, Patch]

    def artifact(self, old: Any) -> Artifact | None:
        return self.artifacts.get(str(old)) if old else None


def run_import(*, path: Path, workspace: Workspace, by: str) -> Run:
    """The archive's run, read-only, in ``workspace`` (once per archive and workspace);
    ArchiveInvalid if it does not check."""
    data = path.read_bytes()
    manifest, members = _archive_read(data)
    archive_sha256 = hashlib.sha256(data).hexdigest()
    again = RunImport.objects.filter(
        archive_sha256=archive_sha256, run__workspace=workspace
    ).select_related("run")
    if (earlier := again.first()) is not None:
        return earlier.run  # the same archive into the same workspace: imported once
    task_data = _lines(members, "task.json")[0]
    run_data = _lines(members, "run.json")[0]
    if run_data["status"] not in TERMINAL:
        raise ArchiveInvalid("only a finished run is imported")
    with transaction.atomic():
        repository = _repository_for(workspace, task_data["repository"])
        task = Task.objects.create(
            workspace=workspace,
            repository=repository,
            **{f: task_data[f] for f in TASK_FIELDS if f not in ("created_at", "source_ref")},
        )
        fields = {f: run_data[f] for f in RUN_FIELDS if not f.endswith("_at")}
        run = Run.objects.create(task=task, **fields)
        times = {f: _when(run_data[f]) for f in RUN_FIELDS if f.endswith("_at")}
        Run.objects.filter(pk=run.pk).update(**times)
        Task.objects.filter(pk=task.pk).update(created_at=_when(task_data["created_at"]))
        ids = _artifacts_import(run, members)
        _rows_import(run, members, ids)
        RunImport.objects.create(
            run=run,
            source_run_id=uuid.UUID(manifest["run_id"]),
            archive_sha256=archive_sha256,
            manifest={
                **manifest,
                "source_ref": task_data.get("source_ref") or {},
                "pull_requests": _lines(members, "pull_requests.jsonl"),
            },
            imported_by=by,
        )
    run.refresh_from_db()
    return run


def _repository_for(workspace: Workspace, data: dict[str, Any]) -> Repository:
    repository, _ = Repository.objects.get_or_create(
        workspace=workspace,
        name=f"imported/{data['name']}"[:200],
        defaults={
            "provider": Repository.Provider.LOCAL,
            "clone_url": "",
            "default_branch": data.get("default_branch", "main"),
            "test_command": data.get("test_command", ""),
            "max_active_runs": 0,
        },
    )
    return repository


def _artifacts_import(run: Run, members: dict[str, bytes]) -> _Ids:
    artifacts: dict[str, Artifact] = {}
    for meta in _lines(members, "artifacts.jsonl"):
        content = members[f"artifacts/{meta['id']}"].decode("utf-8")
        artifacts[str(meta["id"])] = Artifact.objects.create(
            run=run,
            kind=meta["kind"],
            name=meta["name"],
            content_type=meta["content_type"],
            content=content,
            size_bytes=meta["size_bytes"],
            sha256=meta["sha256"],
        )
    return _Ids(artifacts=artifacts, patches={})


def _created(model: Any, pk: Any, value: Any) -> None:
    if value:
        model.objects.filter(pk=pk).update(created_at=_when(value))


def _rows_import(run: Run, members: dict[str, bytes], ids: _Ids) -> None:
    for e in _lines(members, "events.jsonl"):
        event = RunEvent.objects.create(
            run=run, sequence_no=e["sequence_no"], type=e["type"], data=e["data"], actor=e["actor"]
        )
        _created(RunEvent, event.pk, e["created_at"])
    plain = ("id", "created_at", "finished_at", "request_artifact", "response_artifact")
    for t in _lines(members, "model_turns.jsonl"):
        ModelTurn.objects.create(
            run=run,
            request_artifact=ids.artifact(t["request_artifact"]),
            response_artifact=ids.artifact(t["response_artifact"]),
            **{k: v for k, v in t.items() if k not in plain},
        )
    for c in _lines(members, "tool_calls.jsonl"):
        ToolCall.objects.create(
            run=run,
            finished_at=_when(c["finished_at"]),
            **{k: v for k, v in c.items() if k not in plain},
        )
    for p in _lines(members, "patches.jsonl"):
        rest = {k: v for k, v in p.items() if k not in (*plain, "diff_artifact")}
        ids.patches[p["id"]] = Patch.objects.create(
            run=run, diff_artifact=ids.artifacts[str(p["diff_artifact"])], **rest
        )
    _patch_rows_import(run, members, ids)


def _patch_rows_import(run: Run, members: dict[str, bytes], ids: _Ids) -> None:
    skip = ("id", "created_at", "patch", "log_artifact", "requested_at", "decided_at", "expires_at")
    for v in _lines(members, "verifications.jsonl"):
        VerificationAttempt.objects.create(
            run=run,
            patch=ids.patches[v["patch"]],
            log_artifact=ids.artifact(v["log_artifact"]),
            **{k: x for k, x in v.items() if k not in skip},
        )
    for j in _lines(members, "judgements.jsonl"):
        JudgeAttempt.objects.create(
            run=run, patch=ids.patches[j["patch"]], **{k: x for k, x in j.items() if k not in skip}
        )
    for a in _lines(members, "approvals.jsonl"):
        status = a["status"] if a["status"] != Approval.Status.PENDING else Approval.Status.VOID
        rest = {k: x for k, x in a.items() if k not in (*skip, "status")}
        Approval.objects.create(
            run=run,
            patch=ids.patches[a["patch"]],
            status=status,
            expires_at=_when(a.get("expires_at")) or timezone.now(),
            decided_at=_when(a.get("decided_at")),
            **rest,
        )
