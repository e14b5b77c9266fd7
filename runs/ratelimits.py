"""Rate limits on outgoing calls, shared by every worker process and host through Redis.

A model profile's ``rpm`` and ``tpm`` (requests and tokens per minute) and
``GIT_PROVIDER_REQUESTS_PER_HOUR`` per git host are counted in Redis with the ``limits``
library, as the API throttles are: requests in a moving window (exact: no 60 seconds
ever hold more than ``rpm``), tokens in a sliding window counter (a hit of any cost is one
command). A call that would pass a limit waits until the window has room rather than
failing; the wait is reported (the model's on the run's timeline). What is reserved for
a model call is what providers count against their own limits: the prompt's estimated
tokens plus the reply's ``max_tokens``. A 429 still backs off (runs.providers.llm).

When Redis cannot be reached the call goes ahead (logged): the provider's own 429s and
back-off remain the limit of last resort.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from django.conf import settings
from limits import RateLimitItem, RateLimitItemPerSecond
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

log = structlog.get_logger("agentplatform.ratelimits")

KEY_PREFIX = "agentplatform:ratelimit"
# The longest single wait before the window is asked again.
MAX_WAIT_SECONDS = 10.0
MIN_WAIT_SECONDS = 0.05
# Seconds added to each window: what a provider counts is a request's arrival, which
# follows the acquisition by the client's own latency (the first call of a process loads
# LiteLLM's modules: two seconds and more on a busy host), so our minute is longer.
WINDOW_MARGIN_SECONDS = 5


def per_minute(amount: int) -> RateLimitItem:
    return RateLimitItemPerSecond(amount, 60 + WINDOW_MARGIN_SECONDS)


def per_hour(amount: int) -> RateLimitItem:
    return RateLimitItemPerSecond(amount, 3600 + WINDOW_MARGIN_SECONDS)


@dataclass(frozen=True)
class Wait:
    limit: str  # "requests" or "tokens"
    wait_seconds: float


@functools.cache
def _limiters(url: str) -> tuple[MovingWindowRateLimiter, SlidingWindowCounterRateLimiter]:
    options: dict[str, Any] = {}
    if url.startswith(("redis://", "rediss://")):
        options = {"key_prefix": KEY_PREFIX, "socket_timeout": 2, "socket_connect_timeout": 2}
    storage = storage_from_string(url, **options)
    return MovingWindowRateLimiter(storage), SlidingWindowCounterRateLimiter(storage)


def _limiters_now() -> tuple[MovingWindowRateLimiter, SlidingWindowCounterRateLimiter]:
    return _limiters(settings.REDIS_URL)


def _wait_of(limiter: Any, item: RateLimitItem, key: str) -> float:
    stats = limiter.get_window_stats(item, key)
    return min(max(stats.reset_time - time.time(), MIN_WAIT_SECONDS), MAX_WAIT_SECONDS)


def _try(
    key: str, requests: RateLimitItem | None, tokens: RateLimitItem | None, cost: int
) -> Wait | None:
    """Take one request and ``cost`` tokens if both fit now; else how long to wait."""
    moving, counter = _limiters_now()
    if requests is not None and not moving.test(requests, key):
        return Wait("requests", _wait_of(moving, requests, key))
    if tokens is not None and not counter.test(tokens, key, cost=cost):
        return Wait("tokens", _wait_of(counter, tokens, key))
    # Taken in this order, a request refused costs nothing; tokens refused after it leave
    # a request slot used (a little under the limit, never over it).
    if requests is not None and not moving.hit(requests, key):
        return Wait("requests", _wait_of(moving, requests, key))
    if tokens is not None and not counter.hit(tokens, key, cost=cost):
        return Wait("tokens", _wait_of(counter, tokens, key))
    return None


def acquire(
    key: str,
    *,
    requests: RateLimitItem | None,
    tokens: RateLimitItem | None = None,
    cost: int = 1,
    on_wait: Callable[[Wait], None] = lambda wait: None,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Wait until one request (and ``cost`` tokens) fit under the limits of ``key``;
    seconds waited."""
    if requests is None and tokens is None:
        return 0.0
    if tokens is not None:
        cost = max(1, min(cost, tokens.amount))  # a call bigger than the window waits once
    waited = 0.0
    while True:
        try:
            wait = _try(key, requests, tokens, cost)
        except Exception:
            log.warning("ratelimit.unavailable", key=key, exc_info=True)
            return waited
        if wait is None:
            return waited
        on_wait(wait)
        sleep(wait.wait_seconds)
        waited += wait.wait_seconds


def prompt_tokens_estimate(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """About four characters a token, as providers estimate before counting."""
    chars = sum(len(str(m.get("content") or "")) for m in messages) + len(str(tools))
    return chars // 4 + 1


def model_acquire(
    profile: Any,
    *,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    on_wait: Callable[[Wait], None],
) -> float:
    """Before a call to ``profile``'s model: wait for its ``rpm`` and ``tpm``."""
    rpm, tpm = int(getattr(profile, "rpm", 0) or 0), int(getattr(profile, "tpm", 0) or 0)
    if not rpm and not tpm:
        return 0.0
    cost = prompt_tokens_estimate(messages, tools) + int(profile.max_output_tokens or 0)
    return acquire(
        f"model:{profile.name}",
        requests=per_minute(rpm) if rpm else None,
        tokens=per_minute(tpm) if tpm else None,
        cost=cost,
        on_wait=on_wait,
    )


def git_acquire(service: str, host: str) -> float:
    """Before a call to a git host's API: wait for ``GIT_PROVIDER_REQUESTS_PER_HOUR``."""
    limit = int(getattr(settings, "GIT_PROVIDER_REQUESTS_PER_HOUR", 0) or 0)
    if not limit:
        return 0.0

    def waiting(wait: Wait) -> None:
        log.info("ratelimit.git_wait", service=service, host=host, seconds=wait.wait_seconds)

    return acquire(f"git:{service}:{host}", requests=per_hour(limit), on_wait=waiting)
