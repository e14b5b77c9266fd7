"""The Redis commands of one commit's wake-ups, sent in one round trip per server.

A transaction's on-commit callbacks each tell Redis something: the outbox relay (its two
coalescing keys) and the run's live views (a ``PUBLISH``); one by one they cost a round
trip each. (The run's own wake-up is a Celery message, published by kombu.) Inside
``together()`` each ``send`` is queued instead; the block's end sends each server's
commands as one pipeline, in the order they were given, and then hands every sender its
own results.

Outside ``together()`` a ``send`` is one pipeline of its own, at once, and an error its
``done`` raises reaches the caller: callers need not know whether they are in a block.
In a block such an error is logged (the commit it follows has happened; the other
senders still get their results).

"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from jobs.logs import log

# (command name, arguments, keyword arguments) as the pipeline's method takes them.
Command = tuple[str, tuple[Any, ...], dict[str, Any]]
# Given the commands' results (an error in place of a command that failed), or the error
# that failed them all (the server unreachable).
Done = Callable[[list[Any] | Exception], None]
# A send waiting for its round: the client, its commands, its ``done``.
Queued = tuple[Any, Sequence[Command], Done | None]

_local = threading.local()


def command(name: str, *args: Any, **kwargs: Any) -> Command:
    return name, args, kwargs


def error_of(outcome: list[Any] | Exception, commands: int) -> Exception | None:
    """The error a ``done`` was given for its first ``commands`` commands, if any: the
    server's, or the first command's that failed."""
    if isinstance(outcome, Exception):
        return outcome
    return next((result for result in outcome[:commands] if isinstance(result, Exception)), None)


def send(client: Any, commands: Sequence[Command], done: Done | None = None) -> None:
    """Send ``commands`` to ``client``'s server, in one pipeline with those of every other
    ``send`` of the current ``together()`` block to the same server, or at once outside
    one; then call ``done`` with their results."""
    queued: list[Queued] | None = getattr(_local, "queued", None)
    if queued is None:
        _execute(client, [(commands, done)], raising=True)
    else:
        queued.append((client, commands, done))


@contextmanager
def together() -> Iterator[None]:
    """Queue the ``send``s made inside; send them when the block ends, errors or not
    (what was queued was decided by callbacks of a commit that happened). A block inside
    another one adds to the outer block's round."""
    if getattr(_local, "queued", None) is not None:
        yield
        return
    queued: list[Queued] = []
    _local.queued = queued
    try:
        yield
    finally:
        _local.queued = None
        if queued:
            _send_by_server(queued)


def _send_by_server(queued: list[Queued]) -> None:
    """One pipeline per server of every send queued, in the order they were made."""
    by_server: dict[tuple[Any, ...], tuple[Any, list[tuple[Sequence[Command], Done | None]]]]
    by_server = {}
    for client, commands, done in queued:
        entry = by_server.setdefault(_server(client), (client, []))
        entry[1].append((commands, done))
    for client, sends in by_server.values():
        _execute(client, sends, raising=False)


def _server(client: Any) -> tuple[Any, ...]:
    """Which server a client talks to (clients of one server may differ in timeouts)."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    return (
        pool.connection_class,
        kwargs.get("host"),
        kwargs.get("port"),
        kwargs.get("path"),
        kwargs.get("db"),
        kwargs.get("username"),
        kwargs.get("password"),
    )


def _execute(
    client: Any, sends: list[tuple[Sequence[Command], Done | None]], *, raising: bool
) -> None:
    """One pipeline of every command in ``sends``; each ``done`` then gets its results.
    ``raising``: a ``done`` that fails raises (a single send, whose caller sees it, as
    it would without the round); in a round it is logged and the others still run."""
    outcome: list[Any] | Exception
    try:
        pipe = client.pipeline(transaction=False)
        for commands, _ in sends:
            for name, args, kwargs in commands:
                getattr(pipe, name)(*args, **kwargs)
        outcome = pipe.execute(raise_on_error=False)
    except Exception as exc:  # the server unreachable: every command of it failed
        outcome = exc
    start = 0
    for commands, done in sends:
        end = start + len(commands)
        if done is not None:
            try:
                done(outcome if isinstance(outcome, Exception) else outcome[start:end])
            except Exception:
                if raising:
                    raise
                log.warning("redis_round.done_failed", exc_info=True)
        start = end
