"""Drop the PostgreSQL function ``agentplatform_admission_lane_counts`` (migration 0021):
no submission calls it; a submission takes its lane and counts through
``runs.services._admission_counts``, two statements in its transaction."""

from django.db import migrations

FUNCTION = "agentplatform_admission_lane_counts"
SIGNATURE = "(int[], int, int, int, bigint, bigint, date)"


def forwards(apps, schema_editor):
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}{SIGNATURE}")


def backwards(apps, schema_editor):
    # Recreated as migration 0021 made it.
    from importlib import import_module

    import_module("runs.migrations.0021_admission_lane_counts").forwards(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [("runs", "0029_priority_classes_fairness_limits")]

    operations = [migrations.RunPython(forwards, backwards)]
