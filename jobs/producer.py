"""Celery task messages to a Redis broker in one command, with other commands of a commit.

``task_producer`` gives ``apply_async`` a producer that writes the list entry kombu's
Redis transport writes, without kombu's producer machinery, and through ``redis_round``
so that a commit's wake-ups share a round trip. ``task_send`` sends a task's message as
``apply_async`` would, with what ``apply_async`` works out anew on every call (the
task's options, its route, the publish settings) worked out once per task and queue.
"""

from __future__ import annotations

import base64
import bisect
import os
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from celery import signals
from celery._state import get_current_app
from celery.app.routes import MapRoute
from celery.app.task import Task
from celery.backends.base import Backend
from celery.local import Proxy
from celery.utils.nodenames import anon_nodename
from kombu.serialization import dumps as body_dumps
from kombu.utils.json import dumps
from kombu.utils.uuid import uuid as task_id_new

from jobs import redis_round
from jobs.logs import log


class RedisListProducer:
    """A producer for ``apply_async(producer=...)`` that writes the message kombu's Redis
    transport would write (the same envelope, pushed onto the queue's list) in one
    ``LPUSH``, without kombu's producer machinery.

    Celery still builds the message (routing, headers, time limits, parent ids, its
    signals); only the last step changes. kombu's publish path (its retry wrapper, queue
    declaration on every call, the channel's envelope) cost about twice the command
    itself. A message this producer does not handle the same way (an exchange other than
    the default one, compression, a priority, an expiration) and a publish Redis refused
    go through a pooled kombu producer, with kombu's retries. Inside
    ``redis_round.together()`` the ``LPUSH`` waits for the block's end, and goes with
    the other commands of the block to the same server.
    """

    def __init__(self, app: Any, url: str) -> None:
        import redis as redis_client

        self.app = app
        self.url = url
        # Celery wraps the publish in this connection's error translation; it is never
        # connected.
        self.connection = app.connection_for_write(url)
        self.client = redis_client.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)

    def publish(
        self,
        body: Any,
        *,
        exchange: str = "",
        routing_key: str = "",
        serializer: str = "json",
        compression: str | None = None,
        headers: dict[str, Any] | None = None,
        delivery_mode: int = 2,
        priority: int | None = None,
        expiration: float | None = None,
        **options: Any,
    ) -> None:
        # What kombu's producer is given, for a message this producer leaves to it.
        kombu_options = {
            "exchange": exchange,
            "routing_key": routing_key,
            "serializer": serializer,
            "compression": compression,
            "headers": headers,
            "delivery_mode": delivery_mode,
            "priority": priority,
            "expiration": expiration,
            **options,
        }
        if exchange or compression or expiration is not None or not routing_key:
            self._kombu_publish(body, kombu_options)
            return
        message = redis_message(
            body,
            routing_key=routing_key,
            serializer=serializer,
            headers=headers,
            delivery_mode=delivery_mode,
            options=options,
            priority=priority or 0,
        )
        key = priority_list(self.app, routing_key, priority or 0)

        def done(outcome: list[Any] | Exception) -> None:
            error = redis_round.error_of(outcome, 1)
            if error is not None:
                log.warning("broker.publish_retried_by_kombu", queue=routing_key, error=repr(error))
                self._kombu_publish(body, kombu_options)

        # With the other wake-ups of the same commit, in one round trip (redis_round).
        redis_round.send(self.client, [redis_round.command("lpush", key, message)], done)

    def _kombu_publish(self, body: Any, options: dict[str, Any]) -> None:
        """kombu's publish, with its retries, on a connection of its own whose socket
        operations time out: kombu's Redis channel otherwise waits for good on a server
        that takes the connection and never answers, and so would the thread sending
        (``redis_round``: a web process's every wake-up after it)."""
        timeouts = {"socket_timeout": KOMBU_TIMEOUT, "socket_connect_timeout": KOMBU_TIMEOUT}
        with (
            self.app.connection_for_write(self.url, transport_options=timeouts) as connection,
            self.app.amqp.Producer(connection) as producer,
        ):
            producer.publish(body, **options)


# Seconds a publish left to kombu waits on the broker's socket before it fails (and
# kombu's retry policy takes over).
KOMBU_TIMEOUT = 5.0


# Options of Producer.publish that are not message properties.
_PUBLISH_OPTIONS = ("retry", "retry_policy", "declare", "timeout", "confirm_timeout")


def redis_message(
    body: Any,
    *,
    routing_key: str,
    serializer: str,
    headers: dict[str, Any] | None,
    delivery_mode: int,
    options: dict[str, Any],
    priority: int = 0,
) -> str:
    """The list entry kombu's Redis transport writes for a message on the default exchange
    (``Producer.publish``, then the virtual channel's ``prepare_message`` and
    ``basic_publish``)."""
    content_type, content_encoding, serialized = body_dumps(body, serializer=serializer)
    data = serialized.encode(content_encoding) if isinstance(serialized, str) else serialized
    properties = {k: v for k, v in options.items() if k not in _PUBLISH_OPTIONS}
    properties["delivery_mode"] = delivery_mode
    properties["delivery_info"] = {"exchange": "", "routing_key": routing_key}
    properties["priority"] = priority
    properties["body_encoding"] = "base64"
    properties["delivery_tag"] = str(uuid.uuid4())
    return _envelope_dumps(
        {
            "body": base64.b64encode(data).decode("ascii"),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers or {},
            "properties": properties,
        }
    )


def priority_list(app: Any, queue: str, priority: int) -> str:
    """The list kombu's Redis transport keeps a message of ``priority`` in (its
    ``Channel._q_for_pri``, with the app's ``priority_steps`` and ``sep``)."""
    if not priority:
        return queue
    options = app.conf.broker_transport_options or {}
    steps = options.get("priority_steps") or [0, 3, 6, 9]
    step = steps[bisect.bisect(steps, max(0, min(priority, 9))) - 1]
    return f"{queue}{options.get('sep', chr(6) + chr(22))}{step}" if step else queue


def _envelope_dumps(envelope: dict[str, Any]) -> str:
    """The envelope as kombu's JSON writes it (orjson where that is the same text's
    meaning: only JSON's own types; anything else, a datetime included, as kombu)."""
    try:
        return orjson.dumps(envelope, option=orjson.OPT_PASSTHROUGH_DATETIME).decode()
    except TypeError:  # orjson.JSONEncodeError: a value of another type
        return dumps(envelope)


_producers: dict[tuple[int, str], RedisListProducer] = {}
_producers_lock = threading.Lock()
# Per app: what its broker settings were read from (see _settings_read) and the producer
# they gave (None: Celery's own).
_chosen: dict[int, tuple[tuple[Any, ...], RedisListProducer | None]] = {}


def task_producer(app: Any) -> Any:
    """The producer to pass ``apply_async`` for the broker this app publishes to (a
    ``RedisListProducer``, which Celery uses as it would kombu's); None (Celery's own
    producer pool) unless that broker is Redis.

    Every wake-up asks: reading the broker's URL through Celery's settings cost a sixth
    of the wake-up, so the answer is kept until what it was read from changes."""
    source = _settings_read(app)
    chosen = _chosen.get(id(app))
    if chosen is not None and chosen[0] == source:
        return chosen[1]
    producer = _producer_for(app)
    _chosen[id(app)] = (source, producer)
    return producer


def _settings_read(app: Any) -> tuple[Any, ...]:
    """What the app's broker settings come from and can change at run time: its
    configuration object, the values set on it since it was loaded (``conf.changes``) and
    the environment variables Celery prefers to both."""
    conf = app.conf
    changes = conf.changes
    return (
        id(conf),
        changes.get("broker_write_url"),
        changes.get("broker_url"),
        id(changes.get("broker_transport_options")),
        os.environ.get("CELERY_BROKER_WRITE_URL"),
        os.environ.get("CELERY_BROKER_URL"),
    )


def _producer_for(app: Any) -> RedisListProducer | None:
    url = app.conf.broker_write_url or app.conf.broker_url
    if not url.startswith(("redis://", "rediss://")):
        return None
    if (app.conf.broker_transport_options or {}).get("global_keyprefix"):
        return None  # kombu prefixes every key; its own producer writes those
    key = (id(app), url)
    producer = _producers.get(key)
    if producer is None:
        with _producers_lock:
            producer = _producers.get(key) or _producers.setdefault(
                key, RedisListProducer(app, url)
            )
    return producer


@dataclass(frozen=True)
class _SendPlan:
    """What ``apply_async`` works out for every message of one task to one queue, when
    it is sent from outside a task: Celery's choices, read once."""

    producer: RedisListProducer
    time_limit: float | None
    soft_time_limit: float | None
    ignore_result: bool
    typing: bool
    # Producer.publish's arguments other than the message's own (headers, properties).
    publish: dict[str, Any]


_plans: dict[tuple[int, str, str], tuple[tuple[Any, ...], _SendPlan | None]] = {}
_origin: tuple[int, str] = (0, "")


def task_send(task: Any, args: tuple[Any, ...], *, queue: str, priority: int = 0) -> str:
    """Send ``task`` with the positional ``args`` to ``queue``; the message's id.

    The message is the one ``task.apply_async(args=args, queue=queue)`` sends (the
    arguments' repr as given by ``repr``): Celery's ``as_task_v2`` builds it, the
    ``before_task_publish`` and ``after_task_publish`` signals are sent, and
    ``RedisListProducer`` publishes it. What ``apply_async`` and ``send_task`` work out
    anew for every message (the task's options, its route, the queue's exchange, the
    retry policy) is worked out once per task and queue; reading it through Celery's
    configuration was most of a wake-up's cost.

    ``apply_async`` sends it whenever that would write another message: inside a task
    (the parent's ids, its trail), eager mode, a broker that is not Redis, a task or a
    setting whose options this does not carry (an exchange, a priority, an expiry,
    compression, sent events, a router that is not a map).
    """
    if isinstance(task, Proxy):
        task = _task_of(task)
    app = task.app
    plan = _send_plan(app, task, queue)
    if (
        plan is None
        or app.conf.task_always_eager
        or signals.task_sent.receivers
        or app.current_worker_task is not None
    ):
        result = task.apply_async(
            args=args,
            queue=queue,
            argsrepr=repr(args),
            kwargsrepr="{}",
            producer=task_producer(app),
            # Only a priority of the call's own: none leaves the task's.
            **({"priority": priority} if priority else {}),
        )
        return str(result.id)
    if plan.typing:
        task.__header__(*args)  # a wrong number of arguments raises, as apply_async does
    message_id = task_id_new()
    headers, properties, body, _ = app.amqp.as_task_v2(
        message_id,
        task.name,
        args,
        None,
        reply_to=app.thread_oid,
        time_limit=plan.time_limit,
        soft_time_limit=plan.soft_time_limit,
        origin=_origin_here(),
        ignore_result=plan.ignore_result,
        argsrepr=repr(args),
        kwargsrepr="{}",
    )
    publish = plan.publish
    signals.before_task_publish.send(
        sender=task.name,
        body=body,
        exchange=publish["exchange"],
        routing_key=publish["routing_key"],
        declare=publish["declare"],
        headers=headers,
        properties=properties,
        retry_policy=dict(publish["retry_policy"]),
    )
    with plan.producer.connection._reraise_as_library_errors():
        plan.producer.publish(
            body, headers=headers, **publish, **properties, priority=priority or None
        )
    signals.after_task_publish.send(
        sender=task.name,
        body=body,
        headers=headers,
        exchange=publish["exchange"],
        routing_key=publish["routing_key"],
    )
    return str(message_id)


# A shared task's proxy and the task it stands for in the current app: resolving it
# looks the task up in the app's registry under a lock, every time.
_proxied: dict[int, tuple[Any, Any, Any]] = {}


def _task_of(proxy: Any) -> Any:
    app = get_current_app()
    known = _proxied.get(id(proxy))
    if known is not None and known[0] is proxy and known[1] is app:
        return known[2]
    task = proxy._get_current_object()
    _proxied[id(proxy)] = (proxy, app, task)
    return task


def _origin_here() -> str:
    """The message's ``origin``, as Celery names a process that is not a worker."""
    global _origin
    pid = os.getpid()
    if _origin[0] != pid:
        _origin = (pid, anon_nodename())
    return _origin[1]


def _send_plan(app: Any, task: Any, queue: str) -> _SendPlan | None:
    """The plan of ``task``'s messages to ``queue``, kept until the broker settings it was
    read from change (as ``task_producer``'s answer); None: ``apply_async`` sends them."""
    source = _settings_read(app)
    key = (id(app), task.name, queue)
    known = _plans.get(key)
    if known is not None and known[0] == source:
        return known[1]
    plan = _send_plan_read(app, task, queue)
    _plans[key] = (source, plan)
    return plan


def _send_plan_read(app: Any, task: Any, queue: str) -> _SendPlan | None:
    producer = task_producer(app)
    if not isinstance(producer, RedisListProducer):
        return None
    conf = app.conf
    if conf.task_protocol != 2 or conf.task_send_sent_event or conf.task_compression:
        return None
    # What apply_async would add or change per message.
    if type(task).shadow_name is not Task.shadow_name:
        return None
    if getattr(task, "_dump_pydantic_arguments", None) is not None:
        return None
    if not task.ignore_result and type(app.backend).on_task_call is not Backend.on_task_call:
        return None
    options = {k: v for k, v in task._get_exec_options().items() if v is not None}
    options.pop("queue", None)  # the queue given wins, as in apply_async
    time_limit = options.pop("time_limit", None)
    soft_time_limit = options.pop("soft_time_limit", None)
    serializer = options.pop("serializer", None) or conf.task_serializer
    if options:  # an exchange, a routing key, a priority, an expiry, a delivery mode...
        return None
    if soft_time_limit and time_limit and soft_time_limit > time_limit:
        return None  # apply_async refuses it
    router = app.amqp.router
    if not all(isinstance(route, MapRoute) for route in router.routes):
        return None  # a router function may route by the arguments
    routed = router.route({"queue": queue}, task.name, (), {}, task)
    if set(routed) != {"queue"}:
        return None
    declared = routed["queue"]
    exchange = declared.exchange
    if getattr(exchange, "type", "direct") != "direct":
        return None
    policy = dict(conf.task_publish_retry_policy)
    return _SendPlan(
        producer=producer,
        time_limit=time_limit,
        soft_time_limit=soft_time_limit,
        ignore_result=bool(task.ignore_result),
        typing=bool(task.typing),
        publish={
            "exchange": "",
            "routing_key": declared.name,
            "serializer": serializer,
            "compression": None,
            "retry": conf.task_publish_retry,
            "retry_policy": policy,
            "delivery_mode": getattr(exchange, "delivery_mode", None)
            or conf.task_default_delivery_mode,
            "declare": [declared],
            "timeout": None,
            "confirm_timeout": None,
        },
    )
