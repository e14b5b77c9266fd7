"""``GET /api/runs/{id}/stream``: a run's timeline as Server-Sent Events.

The stream replays the events after ``Last-Event-ID`` (a sequence number), then sends
each new event once it commits, and ends after the run's terminal event. It is an
async view for the ASGI server: an open stream costs a coroutine, not a thread or a
database connection.

Wake-ups come from Redis pub/sub (``agent.run.<run_id>``, published on commit by the
timeline). One pattern subscription per process fans them out to every open stream
(``RunEventHub``); the events themselves are always read from the database, through a
small async psycopg pool shared by all streams. A wake-up lost while Redis was away is
made up for at the next keep-alive, which also re-reads the timeline.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
import weakref
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from agentplatform.api.auth import api_token_resolve, bearer_secret
from agentplatform.api.errors import problem_json
from agentplatform.api.scoping import workspace_ids_for
from runs.models import Run, RunEvent
from runs.state import TERMINAL

logger = logging.getLogger("agentplatform.api")
BATCH = 500


# Registered under this key, a waiter is woken by every run's announcement.
ANY_RUN = "*"


class RunEventHub:
    """One Redis pub/sub connection per event loop, waking the streams of each run."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout: float = 2.0) -> bool:
        """Start listening; True once the subscription is active."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())
        try:
            await asyncio.wait_for(self._ready.wait(), timeout=timeout)
        except TimeoutError:
            return False
        return True

    @property
    def ready(self) -> bool:
        """Whether the subscription is active now."""
        return self._ready.is_set()

    def register(self, run_id: str, event: asyncio.Event) -> None:
        self._waiters[run_id].add(event)

    def unregister(self, run_id: str, event: asyncio.Event) -> None:
        waiters = self._waiters.get(run_id)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._waiters[run_id]

    def _wake(self, run_id: str) -> None:
        for event in self._waiters.get(run_id, ()):
            event.set()
        for event in self._waiters.get(ANY_RUN, ()):
            event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    async def _listen(self) -> None:
        import redis.asyncio as aioredis

        backoff = 0.2
        while True:
            client = aioredis.Redis.from_url(settings.REDIS_URL)
            pubsub = client.pubsub()
            try:
                prefix = settings.RUN_CHANNEL_PREFIX
                await pubsub.psubscribe(f"{prefix}*")
                # Wait for the server's confirmation: from then on no announcement can
                # slip between a stream's replay and its wait.
                while True:
                    message = await pubsub.get_message(timeout=5)
                    if message is not None and message["type"] == "psubscribe":
                        break
                self._ready.set()
                backoff = 0.2
                # Announcements sent while we were not subscribed are gone: re-read.
                self._wake_all()
                async for message in pubsub.listen():
                    if message["type"] != "pmessage":
                        continue
                    channel = message["channel"]
                    if isinstance(channel, bytes):
                        channel = channel.decode()
                    self._wake(channel[len(prefix) :])
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("stream.hub_disconnected", exc_info=True)
                self._ready.clear()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                try:
                    await pubsub.aclose()
                    await client.aclose()
                except Exception:  # already broken; nothing to clean
                    logger.debug("stream.hub_close_failed", exc_info=True)


class _LoopResources:
    def __init__(self) -> None:
        self.hub = RunEventHub()
        self.pool: Any = None
        self.pool_lock = asyncio.Lock()


_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopResources] = (
    weakref.WeakKeyDictionary()
)


def _resources() -> _LoopResources:
    loop = asyncio.get_running_loop()
    resources = _per_loop.get(loop)
    if resources is None:
        resources = _per_loop[loop] = _LoopResources()
    return resources


async def _pool() -> Any:
    """The loop's async psycopg pool: streams share a few connections between reads."""
    resources = _resources()
    async with resources.pool_lock:
        if resources.pool is None:
            from psycopg.conninfo import make_conninfo
            from psycopg_pool import AsyncConnectionPool

            db = settings.DATABASES["default"]
            conninfo = make_conninfo(
                dbname=db["NAME"],
                user=db.get("USER") or None,
                password=db.get("PASSWORD") or None,
                host=db.get("HOST") or None,
                port=str(db["PORT"]) if db.get("PORT") else None,
            )
            pool = AsyncConnectionPool(
                conninfo,
                min_size=1,
                max_size=settings.SSE_DB_POOL_SIZE,
                kwargs={"autocommit": True},
                open=False,
                name="sse",
            )
            await pool.open()
            resources.pool = pool
        return resources.pool


_EVENTS_SQL = (
    f"SELECT id, sequence_no, type, data, actor, created_at FROM {RunEvent._meta.db_table} "  # noqa: S608
    "WHERE run_id = %s AND sequence_no > %s ORDER BY sequence_no LIMIT %s"
)
_STATUS_SQL = f"SELECT status FROM {Run._meta.db_table} WHERE id = %s"  # noqa: S608


async def _read(run_id: uuid.UUID, after: int) -> tuple[str, list[dict[str, Any]]]:
    """The run's status, then its events after ``after`` (status first: a terminal
    status is committed with the terminal event, so the events read next include it)."""
    pool = await _pool()
    async with pool.connection() as conn:
        cursor = await conn.execute(_STATUS_SQL, [run_id])
        status_row = await cursor.fetchone()
        cursor = await conn.execute(_EVENTS_SQL, [run_id, after, BATCH])
        rows = await cursor.fetchall()
    events = [
        {
            "id": row[0],
            "sequence": row[1],
            "type": row[2],
            "data": row[3],
            "actor": row[4],
            "created_at": row[5],
        }
        for row in rows
    ]
    return (status_row[0] if status_row else Run.Status.CANCELLED), events


def sse_format(event: dict[str, Any]) -> str:
    data = json.dumps(event, cls=DjangoJSONEncoder, separators=(",", ":"))
    return f"id: {event['sequence']}\nevent: {event['type']}\ndata: {data}\n\n"


async def run_events_stream(
    *, run_id: uuid.UUID, after: int, keepalive: float
) -> AsyncIterator[str]:
    """Yield SSE frames: the events after ``after``, then live ones, until terminal."""
    resources = _resources()
    hub_ready = await resources.hub.start()
    wake = asyncio.Event()
    resources.hub.register(str(run_id), wake)
    try:
        yield f"retry: {settings.SSE_RETRY_MILLISECONDS}\n\n"
        while True:
            # Clear before reading: an announcement during the read sets it again.
            wake.clear()
            status, events = await _read(run_id, after)
            for event in events:
                yield sse_format(event)
                after = event["sequence"]
            if len(events) == BATCH:
                continue
            if status in TERMINAL:
                return
            # Without a hub (Redis away) the keep-alive check is the
            # only wake-up; keep it short there.
            wait = keepalive if hub_ready else min(keepalive, 1.0)
            try:
                await asyncio.wait_for(wake.wait(), timeout=wait)
            except TimeoutError:
                yield ": keep-alive\n\n"
    finally:
        resources.hub.unregister(str(run_id), wake)


async def activity_stream(*, keepalive: float, min_interval: float) -> AsyncIterator[str]:
    """Yield one ``changed`` frame whenever any run announced events, at most one per
    ``min_interval`` seconds; a page that shows many runs re-reads itself on each.

    Without the hub (Redis away) there is nothing to follow: a frame every
    few seconds keeps such a page fresh instead.
    """
    resources = _resources()
    hub_ready = await resources.hub.start()
    wake = asyncio.Event()
    resources.hub.register(ANY_RUN, wake)
    frames = 0
    wait = keepalive if hub_ready else min(keepalive, 10.0)
    try:
        yield f"retry: {settings.SSE_RETRY_MILLISECONDS}\n\n"
        while True:
            try:
                await asyncio.wait_for(wake.wait(), timeout=wait)
            except TimeoutError:
                if hub_ready:
                    yield ": keep-alive\n\n"
                    continue
                if resources.hub.ready:
                    # The subscription came up after this stream gave up waiting for it
                    # (a slow start): follow announcements from now on instead of a frame
                    # every few seconds.
                    hub_ready, wait = True, keepalive
                    yield ": keep-alive\n\n"
                    continue
            wake.clear()
            if not hub_ready and resources.hub.ready:
                # Woken by the hub's re-read as it subscribed: this frame is that re-read.
                hub_ready, wait = True, keepalive
            frames += 1
            yield f"id: {frames}\nevent: changed\ndata: {{}}\n\n"
            # Announcements during the pause set ``wake`` again: one frame covers them.
            await asyncio.sleep(min_interval)
    finally:
        resources.hub.unregister(ANY_RUN, wake)


def _authenticate_sync(header: str) -> Any:
    secret = bearer_secret(header)
    token = api_token_resolve(secret) if secret else None
    return token.user if token is not None else None


def _run_visible_sync(user: Any, run_id: uuid.UUID) -> bool:
    try:
        return Run.objects.filter(
            pk=run_id, task__workspace_id__in=workspace_ids_for(user=user)
        ).exists()
    finally:
        # The stream holds no Django connection while it waits for events.
        connections.close_all()


async def run_stream(request: HttpRequest, pk: uuid.UUID) -> HttpResponse | StreamingHttpResponse:
    """The SSE endpoint (see the module docstring)."""
    if request.method != "GET":
        return problem_json(
            request,
            status_code=405,
            code="method_not_allowed",
            detail=f'Method "{request.method}" not allowed.',
            headers={"Allow": "GET"},
        )
    header = request.headers.get("Authorization", "")
    if header:
        user = await sync_to_async(_authenticate_sync)(header)
    else:
        user = await request.auser()
        user = user if user.is_authenticated else None
    if user is None:
        await sync_to_async(connections.close_all)()
        return problem_json(
            request,
            status_code=401,
            code="not_authenticated",
            detail="Authentication credentials were not provided or are invalid.",
            headers={"WWW-Authenticate": 'Bearer realm="api"'},
        )
    if not await sync_to_async(_run_visible_sync)(user, pk):
        return problem_json(request, status_code=404, code="not_found", detail="Not found.")
    raw = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id") or "0"
    try:
        after = int(raw)
        if after < 0:
            raise ValueError(raw)
    except ValueError:
        return problem_json(
            request,
            status_code=400,
            code="invalid",
            detail="Last-Event-ID must be a sequence number",
        )
    response = StreamingHttpResponse(
        run_events_stream(run_id=pk, after=after, keepalive=settings.SSE_KEEPALIVE_SECONDS),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    # Reverse proxies (nginx) buffer responses by default, which would hold events back.
    response["X-Accel-Buffering"] = "no"
    return response
