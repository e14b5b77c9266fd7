from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "webhooks"

    def ready(self) -> None:
        from django.conf import settings

        from jobs.work import WorkKind, work_kind_register
        from webhooks.intake import WORK_KIND
        from webhooks.processing import webhook_receipt_process

        work_kind_register(
            WorkKind(
                name=WORK_KIND,
                handler=webhook_receipt_process,
                queue="webhooks",
                max_attempts=settings.WEBHOOK_PROCESS_MAX_RETRIES + 1,
                retry_base_seconds=settings.WEBHOOK_PROCESS_RETRY_BASE_SECONDS,
                retry_max_seconds=300.0,
            )
        )
