"""Sandbox backends, chosen by ``SANDBOX_BACKEND``: ``bubblewrap`` (the default),
``process`` (development only) or the dotted path of a ``SandboxBackend`` class."""

from __future__ import annotations

import functools

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from runs.agent.backends.base import CommandSpec, ContainmentUnavailable, Limits, SandboxBackend

BACKENDS = {
    "bubblewrap": "runs.agent.backends.bubblewrap.BubblewrapBackend",
    "process": "runs.agent.backends.process.ProcessBackend",
}

__all__ = [
    "BACKENDS",
    "CommandSpec",
    "ContainmentUnavailable",
    "Limits",
    "SandboxBackend",
    "backend_get",
]


@functools.cache
def _backend(name: str) -> SandboxBackend:
    path = BACKENDS.get(name, name)
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"SANDBOX_BACKEND={name!r} is neither one of {sorted(BACKENDS)} nor an importable "
            "SandboxBackend class"
        ) from exc
    backend = cls()
    if not isinstance(backend, SandboxBackend):
        raise ImproperlyConfigured(f"SANDBOX_BACKEND={name!r} is not a SandboxBackend")
    return backend


def backend_get(name: str | None = None) -> SandboxBackend:
    """The configured backend (one instance per name and process)."""
    return _backend(name or settings.SANDBOX_BACKEND)
