"""The web entry point: one ASGI server, two ways into Django.

The live streams (the SSE views, ``async def``) run on Django's ASGI handler: each holds
its connection open for minutes and must not occupy a thread while it waits. Every other
request (API, webhooks, admin, console pages, static files) runs on Django's WSGI
handler in a fixed pool of ``WEB_THREADS`` threads (a2wsgi): one hand-off from the event
loop per request, where the ASGI handler starts a thread per request and hands off again
at every sync/async boundary of the middleware chain.
"""

import os
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
# The streams' sync code runs in a fresh thread per request; per-thread persistent
# connections would pile up, so connections come from a per-process pool here.
os.environ.setdefault("DATABASE_POOL", "true")

from a2wsgi import WSGIMiddleware
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application
from django.urls import URLResolver, get_resolver

from agentplatform.celery import result_backend_load
from agentplatform.startup import loaded_objects_freeze

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]

asgi_handler = get_asgi_application()
wsgi_handler = WSGIMiddleware(
    get_wsgi_application(),  # type: ignore[arg-type]
    workers=settings.WEB_THREADS,
)
result_backend_load()


def _stream_routes() -> list[re.Pattern[str]]:
    """The full path patterns of the async views, read once from the URLconf."""
    found: list[re.Pattern[str]] = []

    def walk(patterns: list[Any], prefix: str) -> None:
        for entry in patterns:
            regex = entry.pattern.regex.pattern.removeprefix("^")
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + regex)
            elif iscoroutinefunction(entry.callback):
                found.append(re.compile("/" + prefix + regex))

    walk(get_resolver().url_patterns, "")
    return found


_STREAM_ROUTES = _stream_routes()


def streams(path: str) -> bool:
    """Whether ``path`` is served by an async view (a live stream)."""
    return any(route.match(path) for route in _STREAM_ROUTES)


def _body_unsized(scope: Scope) -> bool:
    # WSGI reads a body by its Content-Length; a chunked upload has none. Django's ASGI
    # handler reads the whole body first, so such a request goes there.
    return not any(name == b"content-length" for name, _ in scope["headers"]) and any(
        name == b"transfer-encoding" for name, _ in scope["headers"]
    )


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http" and not streams(scope["path"]) and not _body_unsized(scope):
        await wsgi_handler(scope, receive, send)  # type: ignore[arg-type]
    else:
        await asgi_handler(scope, receive, send)


loaded_objects_freeze()
