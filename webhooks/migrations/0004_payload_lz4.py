from django.db import migrations

from jobs.toast import compression_set

COLUMNS = [("webhooks_webhookreceipt", "payload")]


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0003_covered_foreign_keys_unindexed"),
    ]

    operations = [
        migrations.RunPython(
            compression_set(COLUMNS, "lz4"), compression_set(COLUMNS, "default"), elidable=False
        ),
    ]
