from django.apps import AppConfig
from django.db.models.signals import pre_delete


class RunsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "runs"

    def ready(self) -> None:
        from agentplatform import (
            checks,  # noqa: F401  (registers the system checks)
            pgtime,
        )
        from jobs.contracts import catalog_register
        from jobs.dead_letters import dead_letter_listener_register
        from jobs.retention import outbox_types_keep
        from jobs.schedules import Schedule, schedule_register
        from jobs.work import WorkKind, work_kind_register
        from runs import tasks  # noqa: F401  (registers the tasks runs.dispatch names)
        from runs.dead_letters import dead_letter_announce
        from runs.ending import AFTER_TERMINAL
        from runs.event_catalog import CATALOG, NAMESPACE
        from runs.models import Workspace
        from runs.replay.reproduce import REPLAY_WORK, replay_work
        from runs.services import run_after_terminal
        from runs.waiting import INPUT_NOTIFY, input_notify_send
        from runs.workspace_rows import workspace_delivery_rows_delete

        pgtime.register()
        pre_delete.connect(
            workspace_delivery_rows_delete, sender=Workspace, dispatch_uid="workspace_rows"
        )
        catalog_register(CATALOG, namespace=NAMESPACE)
        # A deferred submission's replay reads its deferral back (api.selectors).
        outbox_types_keep("agent.task.deferred")
        dead_letter_listener_register(dead_letter_announce)
        work_kind_register(WorkKind(name=AFTER_TERMINAL, handler=run_after_terminal))
        work_kind_register(
            WorkKind(name=REPLAY_WORK, handler=replay_work, queue="verify", max_attempts=3)
        )
        work_kind_register(WorkKind(name=INPUT_NOTIFY, handler=input_notify_send))
        for schedule in (
            Schedule("zombie reaper", "runs.zombies_reap", 10),
            Schedule("approval expiry", "runs.approvals_expire", 30),
            Schedule("input expiry", "runs.inputs_expire", 30),
            Schedule("deferred task re-admission", "runs.tasks_readmit", 15),
            Schedule("sandbox orphan sweep", "runs.sandboxes_sweep", 300),
        ):
            schedule_register(schedule)
