"""Rate limits per user and per token (and per address for anonymous callers).

Rates are read from settings on every request rather than captured at import, so an
operator's change (or a test's override) applies without a restart of the class.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from runs.models import ApiToken


class _SettingsRateThrottle(SimpleRateThrottle):
    setting_name = ""

    def __init__(self) -> None:
        # SimpleRateThrottle reads its rate in __init__; do it from live settings.
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)

    def get_rate(self) -> str | None:
        return getattr(settings, self.setting_name, None) or None


class UserRateThrottle(_SettingsRateThrottle):
    """All requests of one user, whichever token or session they use."""

    scope = "user"
    setting_name = "API_THROTTLE_USER_RATE"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if not request.user or not request.user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}


class TokenRateThrottle(_SettingsRateThrottle):
    """Requests made with one API token, so one runaway script cannot starve the rest."""

    scope = "token"
    setting_name = "API_THROTTLE_TOKEN_RATE"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if not isinstance(request.auth, ApiToken):
            return None
        return self.cache_format % {"scope": self.scope, "ident": request.auth.pk}


class AnonRateThrottle(_SettingsRateThrottle):
    scope = "anon"
    setting_name = "API_THROTTLE_ANON_RATE"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if request.user and request.user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
