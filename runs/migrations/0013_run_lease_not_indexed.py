"""The lease's columns are not indexed, so taking and renewing a lease can be a HOT update."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0012_run_workspace"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="run", name="run_active_lease"),
    ]
