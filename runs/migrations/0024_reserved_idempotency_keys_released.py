"""Keys in the namespace of provider events (``github:...``, ``gitlab:...``) that API or
console clients wrote before the namespace was reserved are moved out of it (prefixed
``client:``), so the real issue or comment they shadow is acted on when it next arrives.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations
from django.db.models import Value
from django.db.models.functions import Concat, Left


def release(apps: Any, schema_editor: Any) -> None:
    Task = apps.get_model("runs", "Task")
    Task.objects.filter(idempotency_key__iregex=r"^\s*(github|gitlab):").exclude(
        source="webhook"
    ).update(idempotency_key=Left(Concat(Value("client:"), "idempotency_key"), 200))


class Migration(migrations.Migration):
    dependencies = [("runs", "0023_provider_identity")]

    operations = [migrations.RunPython(release, migrations.RunPython.noop)]
