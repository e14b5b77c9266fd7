from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "webhooks"

    def ready(self) -> None:
        from django.conf import settings

        from jobs.work import WorkKind, work_kind_register
        from webhooks.decisions import REPLY_KIND, webhook_reply_send
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
        work_kind_register(WorkKind(name=REPLY_KIND, handler=webhook_reply_send, queue="webhooks"))
        _retention_register()


def _retention_register() -> None:
    """Processed and ignored receipts go after ``WEBHOOK_RECEIPT_RETENTION_DAYS``; those
    still to process or failed stay for the operator."""
    from django.conf import settings
    from django.db.models import Q

    from jobs.retention import Retention, days_before, retention_register
    from webhooks.models import WebhookReceipt

    done = [WebhookReceipt.Status.PROCESSED, WebhookReceipt.Status.IGNORED]
    retention_register(
        Retention(
            name="webhook_receipts",
            model=WebhookReceipt,
            cutoff=lambda now: days_before(now, settings.WEBHOOK_RECEIPT_RETENTION_DAYS),
            expired=lambda cutoff: Q(status__in=done, received_at__lt=cutoff),
            born="received_at",
        )
    )
