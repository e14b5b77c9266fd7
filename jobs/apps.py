from django.apps import AppConfig
from django.db.models.signals import post_migrate


class JobsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "jobs"

    def ready(self) -> None:
        from jobs.schedules import schedules_after_migrate

        post_migrate.connect(schedules_after_migrate, sender=self)
