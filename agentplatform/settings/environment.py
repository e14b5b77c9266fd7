"""How every setting reads the environment: one variable at a time, a value that does not
parse fails loudly with its name; and the directories everything else is under."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_value(name: str, cast: Any, default: Any) -> Any:
    """Read one variable; a value that does not parse fails loudly with its name."""
    if cast is bool:
        # django-environ reads any unknown word as False; a typo must not turn DEBUG off
        # (or a safety switch on) silently.
        raw = env.str(name, default=None)
        if raw is None:
            return default
        if raw.strip().lower() in _TRUE:
            return True
        if raw.strip().lower() in _FALSE:
            return False
        raise ImproperlyConfigured(f"Invalid value for {name}: {raw!r} is not a boolean")
    try:
        return env.get_value(name, cast=cast, default=default)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"Invalid value for {name}: {exc}") from exc


VAR_DIR = Path(env_value("AGENTPLATFORM_VAR_DIR", str, str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)
