"""PostgreSQL keeps the count of each workspace's and each repository's active runs.

Row triggers on runs add to ``runs_activeruncount`` when a run is inserted active, moves
between an active and a terminal status (or to another workspace or repository) or is
deleted active; a truncate of runs empties it. Admission then reads a few rows instead of
scanning every active run of the workspace. The triggers fire only on those changes (their
``WHEN`` is evaluated without calling the function), not on a step's other updates.

The stripe: the admission lane the transaction holds (``agentplatform.admission_lane``,
set by the statement that takes it), or else one of 16 stripes by backend, numbered
below zero.

The table is filled from the runs in the migration's transaction, with the runs locked
against writes, and the triggers created in the same transaction: no run is missed or
counted twice.
"""

from django.db import migrations, models

# runs.models.RUN_TERMINAL_STATUSES when this migration was written, in the same order as
# the run_active index's condition.
TERMINAL = ("completed", "failed", "cancelled", "timed_out")
FUNCTION = "agentplatform_active_runs_counted"
TRIGGERS = {
    "agentplatform_active_run_inserted": "AFTER INSERT",
    "agentplatform_active_run_moved": "AFTER UPDATE OF status, workspace_id, repository_id",
    "agentplatform_active_run_deleted": "AFTER DELETE",
}
TRUNCATED = "agentplatform_active_runs_truncated"


def _active(row: str) -> str:
    terminal = ", ".join(f"'{status}'" for status in TERMINAL)
    return f"NOT ({row}.status IN ({terminal}))"


def forwards(apps, schema_editor):
    quote = schema_editor.quote_name
    runs = quote(apps.get_model("runs", "Run")._meta.db_table)
    counts = quote(apps.get_model("runs", "ActiveRunCount")._meta.db_table)
    add = (
        f"INSERT INTO {counts} AS c (workspace_id, repository_id, stripe, runs)"
        " VALUES ({row}.workspace_id, 0, lane_stripe, {delta}),"
        " ({row}.workspace_id, {row}.repository_id, lane_stripe, {delta})"
        " ON CONFLICT (workspace_id, repository_id, stripe)"
        " DO UPDATE SET runs = c.runs + EXCLUDED.runs;"
    )
    schema_editor.execute(
        f"CREATE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$"
        " DECLARE lane_stripe smallint := COALESCE("
        "NULLIF(current_setting('agentplatform.admission_lane', true), '')::smallint,"
        " -1 - mod(pg_backend_pid(), 16));"
        " BEGIN"
        f" IF TG_OP <> 'INSERT' AND {_active('OLD')} THEN {add.format(row='OLD', delta=-1)}"
        " END IF;"
        f" IF TG_OP <> 'DELETE' AND {_active('NEW')} THEN {add.format(row='NEW', delta=1)}"
        " END IF;"
        " RETURN NULL; END $$"
    )
    schema_editor.execute(
        f"CREATE FUNCTION {TRUNCATED}() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN DELETE FROM {counts}; RETURN NULL; END $$"
    )
    schema_editor.execute(f"LOCK TABLE {runs} IN SHARE ROW EXCLUSIVE MODE")
    schema_editor.execute(
        f"INSERT INTO {counts} (workspace_id, repository_id, stripe, runs)"  # noqa: S608
        f" SELECT workspace_id, 0, -1, COUNT(*) FROM {runs} WHERE {_active(runs)}"
        " GROUP BY workspace_id"
        " UNION ALL"
        f" SELECT workspace_id, repository_id, -1, COUNT(*) FROM {runs} WHERE {_active(runs)}"
        " GROUP BY workspace_id, repository_id"
    )
    moved = (
        f"({_active('OLD')}) <> ({_active('NEW')}) OR ({_active('OLD')}"
        " AND (OLD.workspace_id <> NEW.workspace_id OR OLD.repository_id <> NEW.repository_id))"
    )
    when = {
        "agentplatform_active_run_inserted": _active("NEW"),
        "agentplatform_active_run_moved": moved,
        "agentplatform_active_run_deleted": _active("OLD"),
    }
    for trigger, event in TRIGGERS.items():
        schema_editor.execute(
            f"CREATE TRIGGER {trigger} {event} ON {runs} FOR EACH ROW"
            f" WHEN ({when[trigger]}) EXECUTE FUNCTION {FUNCTION}()"
        )
    schema_editor.execute(
        f"CREATE TRIGGER {TRUNCATED} AFTER TRUNCATE ON {runs}"
        f" FOR EACH STATEMENT EXECUTE FUNCTION {TRUNCATED}()"
    )


def backwards(apps, schema_editor):
    runs = schema_editor.quote_name(apps.get_model("runs", "Run")._meta.db_table)
    for trigger in [*TRIGGERS, TRUNCATED]:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {runs}")
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {TRUNCATED}()")


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0019_access_notify"),
    ]

    operations = [
        migrations.CreateModel(
            name="ActiveRunCount",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "workspace_id",
                        "repository_id",
                        "stripe",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("workspace_id", models.BigIntegerField()),
                ("repository_id", models.BigIntegerField()),
                ("stripe", models.SmallIntegerField()),
                ("runs", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
