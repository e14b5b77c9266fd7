"""Runs carry their task's workspace, indexed in the API list's order."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0011_task_list_order"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="workspace",
            field=models.ForeignKey(
                db_index=False,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="runs",
                to="runs.workspace",
            ),
        ),
        migrations.RunSQL(
            "UPDATE runs_run SET workspace_id = "
            "(SELECT t.workspace_id FROM runs_task t WHERE t.id = runs_run.task_id)",
            migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name="run",
            name="workspace",
            field=models.ForeignKey(
                db_index=False,
                editable=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="runs",
                to="runs.workspace",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                fields=["workspace", "-created_at", "id"], name="run_ws_created"
            ),
        ),
    ]
