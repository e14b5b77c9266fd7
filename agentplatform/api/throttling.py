"""Rate limits per user and per token (and per address for anonymous callers).

The counts live where ``API_THROTTLE_STORAGE_URL`` says: Redis by default, so every
web process (and every web host) counts against the same limit. Each check is one
atomic round trip (the ``limits`` library's sliding window counter), so concurrent
requests cannot both take the last slot. When the storage cannot be reached the request
is let through and the failure logged: an outage of the counts must not take the API
down with it.

Rates are read from settings on every request rather than captured at import, so an
operator's change (or a test's override) applies without a restart.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import structlog
from django.conf import settings
from limits import RateLimitItem, RateLimitItemPerSecond
from limits.storage import storage_from_string
from limits.strategies import RateLimiter, SlidingWindowCounterRateLimiter
from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

from runs.models import ApiToken

log = structlog.get_logger("agentplatform.api")

KEY_PREFIX = "agentplatform:throttle"


def limiter() -> RateLimiter:
    """The throttles' limiter over ``API_THROTTLE_STORAGE_URL``."""
    return _limiter(settings.API_THROTTLE_STORAGE_URL)


@functools.cache
def _limiter(url: str) -> RateLimiter:
    """One limiter per storage URL per process (its Redis connections are pooled)."""
    options: dict[str, Any] = {}
    if url.startswith(("redis://", "rediss://")):
        options = {"key_prefix": KEY_PREFIX, "socket_timeout": 1, "socket_connect_timeout": 1}
    return SlidingWindowCounterRateLimiter(storage_from_string(url, **options))


@functools.cache
def rate_item(rate: str) -> RateLimitItem:
    """``"<n>/<period>"`` as DRF reads it (``s``, ``m``, ``h``, ``d`` or any word that
    starts so, e.g. ``120/minute``): n requests per that many seconds."""
    count, seconds = SimpleRateThrottle.parse_rate(None, rate)  # type: ignore[arg-type]
    if count is None or seconds is None:  # DRF's answer to no rate at all
        raise ValueError(f"not a rate: {rate!r}")
    return RateLimitItemPerSecond(count, seconds)


class _SettingsRateThrottle(BaseThrottle):
    scope = ""
    setting_name = ""

    def __init__(self) -> None:
        self._wait: float | None = None

    def ident_of(self, request: Request, view: Any) -> str | None:
        """Whom this throttle counts the request against; None: not its concern."""
        raise NotImplementedError

    def allow_request(self, request: Request, view: Any) -> bool:
        rate = getattr(settings, self.setting_name, None)
        if not rate:
            return True
        ident = self.ident_of(request, view)
        if ident is None:
            return True
        item = rate_item(rate)
        counts = limiter()
        try:
            if counts.hit(item, self.scope, ident):
                return True
            reset_at = counts.get_window_stats(item, self.scope, ident).reset_time
        except RedisError:  # the store unreachable or refusing: the counts are lost
            log.warning("api.throttle_unavailable", scope=self.scope, exc_info=True)
            return True
        self._wait = max(1.0, reset_at - time.time())
        return False

    def wait(self) -> float | None:
        return self._wait


class UserRateThrottle(_SettingsRateThrottle):
    """All requests of one user, whichever token or session they use."""

    scope = "user"
    setting_name = "API_THROTTLE_USER_RATE"

    def ident_of(self, request: Request, view: Any) -> str | None:
        if not request.user or not request.user.is_authenticated:
            return None
        return str(request.user.pk)


class TokenRateThrottle(_SettingsRateThrottle):
    """Requests made with one API token, so one runaway script cannot starve the rest."""

    scope = "token"
    setting_name = "API_THROTTLE_TOKEN_RATE"

    def ident_of(self, request: Request, view: Any) -> str | None:
        if not isinstance(request.auth, ApiToken):
            return None
        return str(request.auth.pk)


class AnonRateThrottle(_SettingsRateThrottle):
    """Unauthenticated requests, per client address."""

    scope = "anon"
    setting_name = "API_THROTTLE_ANON_RATE"

    def ident_of(self, request: Request, view: Any) -> str | None:
        if request.user and request.user.is_authenticated:
            return None
        return self.get_ident(request)
