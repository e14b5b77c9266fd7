"""The workspace of a subscription and of a daily cost row becomes a plain key.

jobs owns only its own tables (docs/design.md §2). The column, its index and its data
stay: the database loses only the foreign key constraints; Django's state swaps the
foreign key field for an integer field of the same column.
"""

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Q


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0009_workitem_deferrals"),
        ("runs", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.AlterField(
                    model_name="eventsubscription",
                    name="workspace",
                    field=models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="event_subscriptions",
                        to="runs.workspace",
                    ),
                ),
                migrations.AlterField(
                    model_name="workspacedailycost",
                    name="workspace",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="daily_costs",
                        to="runs.workspace",
                    ),
                ),
            ],
            state_operations=[
                migrations.RemoveIndex(model_name="eventsubscription", name="subscription_active"),
                migrations.RemoveField(model_name="eventsubscription", name="workspace"),
                migrations.AddField(
                    model_name="eventsubscription",
                    name="workspace_id",
                    field=models.BigIntegerField(db_index=True),
                    preserve_default=False,
                ),
                migrations.AddIndex(
                    model_name="eventsubscription",
                    index=models.Index(
                        condition=Q(("active", True)),
                        fields=["workspace_id"],
                        name="subscription_active",
                    ),
                ),
                migrations.RemoveConstraint(
                    model_name="workspacedailycost", name="daily_cost_unique"
                ),
                migrations.RemoveField(model_name="workspacedailycost", name="workspace"),
                migrations.AddField(
                    model_name="workspacedailycost",
                    name="workspace_id",
                    field=models.BigIntegerField(),
                    preserve_default=False,
                ),
                migrations.AddConstraint(
                    model_name="workspacedailycost",
                    constraint=models.UniqueConstraint(
                        fields=("workspace_id", "day"), name="daily_cost_unique"
                    ),
                ),
            ],
        ),
    ]
