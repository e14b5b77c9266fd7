"""Safety-net schedules, stored with django-celery-beat so operators can edit them.

Each is a net under an event-driven path, so they run every 5-30 s rather than every
second (beat itself costs CPU per tick).
"""

from django.db import migrations

SCHEDULES = [
    ("outbox sweep", "jobs.outbox_relay", 10),
    ("zombie reaper", "jobs.zombies_reap", 10),
    ("approval expiry", "jobs.approvals_expire", 30),
    ("deferred task re-admission", "jobs.tasks_readmit", 15),
    ("sandbox orphan sweep", "jobs.sandboxes_sweep", 300),
]


def create(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, seconds in SCHEDULES:
        interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
        PeriodicTask.objects.update_or_create(
            name=name,
            defaults={"task": task, "interval": interval, "queue": "events",
                      "enabled": True},
        )


def remove(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name__in=[s[0] for s in SCHEDULES]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [migrations.RunPython(create, remove)]
