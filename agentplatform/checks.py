"""System checks that refuse unsafe production settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from agentplatform.api.throttling import rate_item
from runs.agent.backends import backend_get


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
    return errors


CONTAINMENT_HINT = (
    "A worker contains the agent's commands only where bwrap can run them as an "
    "unprivileged host uid in user namespaces (unprivileged user namespaces allowed), "
    "with a cgroup per command limiting memory, processes and CPU (cgroup v2 with "
    "memory and pids delegated to the worker's user, named in SANDBOX_CGROUP_ROOT, or "
    "cgroup v1 memory and pids hierarchies writable by it). A root worker's commands run "
    "as SANDBOX_HOST_UID/SANDBOX_HOST_GID (default: the account agentsandbox, else uid "
    "2100000000). See docs/sandbox-backends.md."
)


def containment_errors() -> list[Error]:
    """Why the configured sandbox backend cannot contain commands on this host."""
    backend = backend_get()
    if not backend.contains:
        return []  # refused in production mode (E003); development only otherwise
    return [
        Error(
            f"Sandbox backend {backend.name!r} cannot contain commands here: {problem}.",
            hint=CONTAINMENT_HINT,
            id="agentplatform.E004",
        )
        for problem in backend.problems()
    ]


@register(Tags.security)
def sandbox_containment_check(app_configs: Any, **kwargs: Any) -> list[Error]:
    """In every mode: a worker started with these settings refuses to run (see
    ``agentplatform.celery``), so say so wherever the checks run."""
    return containment_errors()


# Not under Tags.staticfiles: collectstatic runs that tag's checks before it writes the
# manifest, and would warn about the very files it is about to collect.
@register("console")
def static_files_collected_check(app_configs: Any, **kwargs: Any) -> list[Warning]:
    """The console's pages name hashed static files from collectstatic's manifest; without
    it they fail to render, and the web process serves no styles."""
    backend = settings.STORAGES.get("staticfiles", {}).get("BACKEND", "")
    if "Manifest" not in backend:
        return []
    manifest = Path(settings.STATIC_ROOT) / "staticfiles.json"
    if manifest.exists():
        return []
    return [
        Warning(
            f"Static files are not collected ({manifest} is missing).",
            hint="Run `manage.py collectstatic --noinput` (make setup does) before serving.",
            id="agentplatform.W010",
        )
    ]


@register(Tags.security)
def throttle_rates_check(app_configs: Any, **kwargs: Any) -> list[Error]:
    """A rate the throttles cannot read would fail every API request it applies to."""
    errors: list[Error] = []
    for name in ("API_THROTTLE_USER_RATE", "API_THROTTLE_TOKEN_RATE", "API_THROTTLE_ANON_RATE"):
        rate = getattr(settings, name, "")
        if not rate:
            continue
        try:
            rate_item(rate)
        except (ValueError, KeyError, IndexError):
            errors.append(
                Error(
                    f"{name}={rate!r} is not a rate.",
                    hint='Write "<n>/<second|minute|hour|day>" (e.g. 600/minute), or leave '
                    "it empty to turn that throttle off.",
                    id="agentplatform.E005",
                )
            )
    return errors
