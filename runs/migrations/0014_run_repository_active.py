"""Runs carry their task's repository; active runs are indexed by workspace and repository."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0013_run_lease_not_indexed"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="repository",
            field=models.ForeignKey(
                db_index=False,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="runs",
                to="runs.repository",
            ),
        ),
        migrations.RunSQL(
            "UPDATE runs_run SET repository_id = "
            "(SELECT t.repository_id FROM runs_task t WHERE t.id = runs_run.task_id)",
            migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name="run",
            name="repository",
            field=models.ForeignKey(
                db_index=False,
                editable=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="runs",
                to="runs.repository",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("status__in", ["completed", "failed", "cancelled", "timed_out"]),
                    _negated=True,
                ),
                fields=["workspace", "repository"],
                name="run_active",
            ),
        ),
    ]
