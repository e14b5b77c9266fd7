from django.apps import AppConfig
from django.db.models.signals import post_migrate


class JobsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "jobs"

    def ready(self) -> None:
        from django.conf import settings

        from jobs import tasks  # noqa: F401  (registers the tasks jobs.relay names)
        from jobs.consumers import PermanentConsumerError, event_batch_split, event_consume
        from jobs.schedules import Schedule, schedule_register, schedules_after_migrate
        from jobs.services import requeued_task_send
        from jobs.subscriptions import subscription_deliver
        from jobs.work import WorkKind, work_kind_register

        post_migrate.connect(schedules_after_migrate, sender=self)
        schedule_register(Schedule("work sweep", "jobs.work_sweep", 10))
        schedule_register(Schedule("retention sweep", "jobs.retention_sweep", 300))
        import jobs.retention  # noqa: F401  (registers the retentions of jobs' tables)

        work_kind_register(
            WorkKind(
                name="event.consume",
                handler=event_consume,
                split=event_batch_split,
                queue="events",
                max_attempts=settings.EVENT_CONSUMER_MAX_RETRIES + 1,
                retry_base_seconds=settings.EVENT_CONSUMER_RETRY_BASE_SECONDS,
                permanent=(PermanentConsumerError,),
            )
        )
        work_kind_register(
            WorkKind(
                name="subscription.deliver",
                handler=subscription_deliver,
                queue="events",
                max_attempts=settings.SUBSCRIPTION_MAX_ATTEMPTS,
                retry_base_seconds=settings.SUBSCRIPTION_RETRY_BASE_SECONDS,
                retry_max_seconds=3600.0,
                permanent=(PermanentConsumerError,),
            )
        )
        work_kind_register(
            WorkKind(name="dead_letter.requeue", handler=requeued_task_send, queue="events")
        )
