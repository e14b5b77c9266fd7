"""System checks that refuse unsafe production settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.security, deploy=False)
def production_settings_check(app_configs: Any, **kwargs: Any) -> list[Error]:
    if not settings.PRODUCTION:
        return []
    errors: list[Error] = []
    if settings.DEBUG:
        errors.append(
            Error(
                "DEBUG is on in production mode.",
                hint="Unset DEBUG (or set DEBUG=false) when DATABASE_URL points at PostgreSQL.",
                id="agentplatform.E001",
            )
        )
    if settings.SECRET_KEY == settings.DEFAULT_SECRET_KEY or len(settings.SECRET_KEY) < 32:
        errors.append(
            Error(
                "SECRET_KEY is the embedded default or shorter than 32 characters.",
                hint="Set SECRET_KEY to a long random value in production.",
                id="agentplatform.E002",
            )
        )
    from runs.agent.backends import backend_get

    backend = backend_get()
    if not backend.contains:
        errors.append(
            Error(
                f"SANDBOX_BACKEND={settings.SANDBOX_BACKEND!r} does not contain the agent's "
                "commands.",
                hint="Use SANDBOX_BACKEND=bubblewrap (apt-get install bubblewrap) or a "
                "container backend in production mode.",
                id="agentplatform.E003",
            )
        )
    for problem in backend.problems():
        errors.append(
            Error(
                f"Sandbox backend {backend.name!r} cannot run: {problem}.",
                id="agentplatform.E004",
            )
        )
    return errors
