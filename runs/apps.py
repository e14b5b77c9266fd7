from django.apps import AppConfig


class RunsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "runs"

    def ready(self) -> None:
        from agentplatform import checks  # noqa: F401  (registers the system checks)
