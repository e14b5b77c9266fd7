from django.db import migrations

from jobs.toast import compression_set

COLUMNS = [("runs_artifact", "content"), ("runs_modelturn", "response")]


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0016_covered_foreign_keys_unindexed"),
    ]

    operations = [
        migrations.RunPython(
            compression_set(COLUMNS, "lz4"), compression_set(COLUMNS, "default"), elidable=False
        ),
    ]
