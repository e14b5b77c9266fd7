"""Rows the uses of the recorded history keep: replays, fold snapshots, imports.

Foreign keys name ``runs.Run`` by string: runs.models imports this module with the others,
so these models belong to the runs app without a second import of runs.models.
"""

from __future__ import annotations

from django.db import models

from jobs.ids import new_id


class RunReplay(models.Model):
    """One reproduction of a finished run in a fresh sandbox, and what it found."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        # Every recorded tool result, the patch and the tests came out as recorded.
        REPRODUCED = "reproduced"
        DIVERGED = "diverged"
        # The reproduction could not be carried out (no sandbox, repository gone).
        ERRORED = "errored"

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="replays")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    requested_by = models.CharField(max_length=200, blank=True)
    # Steps done of ``total`` (tool calls, then the patch, the rebase and the tests).
    progress = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    divergences = models.JSONField(default=list, blank=True)
    report = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "runs"

    def __str__(self) -> str:
        return f"replay {self.id} of {self.run_id} ({self.status})"


class RunFoldSnapshot(models.Model):
    """The fold of a run's events up to ``sequence_no``: a rebuild starts after it."""

    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="fold_snapshots", db_index=False
    )
    sequence_no = models.PositiveIntegerField()
    # The fold's version: a snapshot of an older fold is ignored, never misread.
    version = models.PositiveSmallIntegerField()
    state = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "runs"
        constraints = [
            models.UniqueConstraint(
                fields=["run", "sequence_no", "version"], name="runfoldsnapshot_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"fold of {self.run_id} at {self.sequence_no}"


class RunImport(models.Model):
    """Marks a run imported from an archive: read-only, never dispatched or acted on."""

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, related_name="imported")
    source_run_id = models.UUIDField()
    archive_sha256 = models.CharField(max_length=64)
    manifest = models.JSONField(default=dict)
    imported_by = models.CharField(max_length=200, blank=True)
    imported_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "runs"

    def __str__(self) -> str:
        return f"import of {self.source_run_id}"
