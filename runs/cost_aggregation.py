"""Cost aggregation: model spend per workspace and UTC day, summed from the
``agent.model.turn.completed`` events (an in-app consumer of jobs, named in
``EVENT_CONSUMERS``).

Addition commutes, so events arriving out of order or late still sum to the right total;
``last_event_at`` keeps the maximum, so a late event cannot move it back.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone

from jobs.consumers import Completion, Consumer, Event, PermanentConsumerError
from jobs.models import WorkspaceDailyCost


def cost_aggregate(event: Event) -> Completion:
    if event.workspace_id is None:
        return None
    try:
        cost = Decimal(str(event.data.get("cost_usd", "0")))
        tokens_in = int(event.data.get("tokens_in") or 0)
        tokens_out = int(event.data.get("tokens_out") or 0)
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise PermanentConsumerError(f"unreadable usage in event {event.id}: {exc}") from exc
    if not cost.is_finite():
        raise PermanentConsumerError(f"cost_usd of event {event.id} is not a number")
    at = event.time or timezone.now()
    workspace_id = event.workspace_id

    def write() -> None:
        row, _ = WorkspaceDailyCost.objects.get_or_create(
            workspace_id=workspace_id, day=at.date(), defaults={"last_event_at": at}
        )
        WorkspaceDailyCost.objects.filter(pk=row.pk).update(
            cost_usd=F("cost_usd") + cost,
            tokens_in=F("tokens_in") + tokens_in,
            tokens_out=F("tokens_out") + tokens_out,
            model_turns=F("model_turns") + 1,
            last_event_at=Greatest(F("last_event_at"), at),
            updated_at=timezone.now(),
        )

    return write


COST_AGGREGATION = Consumer(
    name="cost_aggregation", types=("agent.model.turn.completed",), handle=cost_aggregate
)
