"""Structured logging: one pipeline for our loggers, Django, uvicorn and Celery.

Every record, from structlog or from the standard library, goes through the same
processors: context variables (request id, workspace, task, run, event, Celery task,
trace), level, logger name, timestamp, the traceback rendered as text, secrets redacted;
then JSON (production) or aligned key=value lines (development).
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Iterable
from typing import Any

import structlog

# Keys whose values are secrets whatever they contain.
_SECRET_KEY = re.compile(
    r"(^|[_-])(token|secret|password|passwd|passphrase|api[_-]?key|authorization|cookie|"
    r"credentials?|private[_-]?key|access[_-]?key|signature|dsn)($|[_-])",
    re.IGNORECASE,
)
# Secrets recognisable by their shape, wherever they appear in a message.
_SECRET_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # user:password@ or token@ in a URL (clone URLs, DSNs)
    (re.compile(r"(?i:\b([a-z][a-z0-9+.-]*://)[^/\s@:]*(?::[^/\s@]*)?@)"), r"\1[REDACTED]@"),
    (re.compile(r"(?i:\bbearer\s+[a-z0-9._~+/=-]{8,})"), "Bearer [REDACTED]"),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"), "[REDACTED]"),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), "[REDACTED]"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), "[REDACTED]"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "[REDACTED]"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "[REDACTED]"),
    (
        re.compile(r"(?s:-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----)"),
        "[REDACTED]",
    ),
)
# Substrings every shape above contains: most strings hold none and skip the regexes.
_SHAPE_MARKERS = ("://", "earer", "EARER", "gh", "glpat-", "sk-", "xox", "AKIA", "PRIVATE KEY")
REDACTED = "[REDACTED]"
# Settings named like secrets that only describe one (a cookie's name, a token's rate).
_NOT_A_SECRET_SETTING = re.compile(
    r"_(NAME|RATE|AGE|PATH|DOMAIN|SECURE|HTTPONLY|SAMESITE|HEADER|CLASS|BACKEND|MODULE)S?$"
)
# Shorter values would redact ordinary words.
_MIN_SECRET_LENGTH = 6
_MAX_KNOWN_SECRETS = 2000

_known_lock = threading.Lock()
_known_secrets: dict[str, None] = {}
_known_pattern: re.Pattern[str] | None = None


def secrets_register(values: Iterable[Any]) -> None:
    """Redact these exact values from every log line from now on (settings, repository
    secrets, model keys). Values too short to be secrets are ignored."""
    global _known_pattern
    fresh = [v for v in values if isinstance(v, str) and len(v) >= _MIN_SECRET_LENGTH and v.strip()]
    with _known_lock:
        added = False
        for value in fresh:
            if value not in _known_secrets:
                _known_secrets[value] = None
                added = True
        while len(_known_secrets) > _MAX_KNOWN_SECRETS:
            _known_secrets.pop(next(iter(_known_secrets)))
        if added:
            ordered = sorted(_known_secrets, key=len, reverse=True)
            _known_pattern = re.compile("|".join(re.escape(v) for v in ordered))


def _secrets_in(value: Any, depth: int = 0) -> list[str]:
    """Secret-named values inside a nested setting (``MODEL_PROFILES``); a ``*_env`` key
    names the environment variable that holds the secret."""
    found: list[str] = []
    if depth > 4 or not isinstance(value, dict):
        return found
    for key, item in value.items():
        if isinstance(item, dict):
            found += _secrets_in(item, depth + 1)
        elif isinstance(key, str) and isinstance(item, str) and _SECRET_KEY.search(key):
            found.append(os.environ.get(item, "") if key.endswith("_env") else item)
    return found


def secrets_from_settings(settings: Any) -> list[str]:
    """Values of settings named like secrets (keys, tokens, passwords, the secret key),
    and of secret-named entries of dictionary settings such as the model profiles."""
    found: list[str] = []
    for name in dir(settings):
        if name.isupper() and isinstance(getattr(settings, name, None), dict):
            found += _secrets_in(getattr(settings, name))
        if not name.isupper() or not _SECRET_KEY.search(name.lower()):
            continue
        if _NOT_A_SECRET_SETTING.search(name):  # SESSION_COOKIE_NAME, API_THROTTLE_TOKEN_RATE
            continue
        value = getattr(settings, name, None)
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list | tuple):  # SECRET_KEY_FALLBACKS
            found.extend(item for item in value if isinstance(item, str))
    database = getattr(settings, "DATABASES", {}).get("default", {})
    if database.get("PASSWORD"):
        found.append(str(database["PASSWORD"]))
    return found


def redact_text(text: str) -> str:
    if len(text) < _MIN_SECRET_LENGTH:
        return text
    pattern = _known_pattern
    if pattern is not None and pattern.search(text):
        text = pattern.sub(REDACTED, text)
    if any(marker in text for marker in _SHAPE_MARKERS):
        for regex, replacement in _SECRET_PATTERNS:
            text = regex.sub(replacement, text)
    return text


@functools.lru_cache(maxsize=4096)
def _is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def redact_value(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if depth > 6:
        return value
    if isinstance(value, dict):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and _is_secret_key(k) and v not in (None, "")
                else redact_value(v, depth + 1)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(v, depth + 1) for v in value]
    return value


def redact_processor(logger: Any, method: str, event_dict: Any) -> Any:
    """Drop secret-named fields and scrub secrets out of every string, tracebacks included."""
    return redact_value(event_dict)


def _stringify_foreign(logger: Any, method: str, event_dict: Any) -> Any:
    # Standard-library messages may carry objects (a uvicorn address tuple, an exception);
    # the event itself is always text.
    if not isinstance(event_dict.get("event"), str):
        event_dict["event"] = str(event_dict.get("event"))
    return event_dict


def _drop_color_message(logger: Any, method: str, event_dict: Any) -> Any:
    # uvicorn attaches an ANSI-coloured duplicate of each message.
    event_dict.pop("color_message", None)
    return event_dict


_SHARED_PROCESSORS: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]

structlog.configure(
    processors=[
        *_SHARED_PROCESSORS,
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=True,
)


class StructuredFormatter(structlog.stdlib.ProcessorFormatter):
    """Renders every record as JSON (production) or as aligned key=value lines.

    Tracebacks are rendered as text before redaction, so a JSON line keeps the whole
    traceback (not a ``<traceback object>`` repr) and secrets inside it are scrubbed too.
    """

    def __init__(self, json: bool = False, **kwargs: Any) -> None:
        from django.conf import settings

        if settings.configured:
            secrets_register(secrets_from_settings(settings))
        renderer: Any = (
            structlog.processors.JSONRenderer()
            if json
            else structlog.dev.ConsoleRenderer(colors=False)
        )
        super().__init__(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _drop_color_message,
                structlog.processors.format_exc_info,
                redact_processor,
                renderer,
            ],
            # ExtraAdder: a standard-library record's ``extra={...}`` fields become keys.
            foreign_pre_chain=[
                *_SHARED_PROCESSORS,
                structlog.stdlib.ExtraAdder(),
                _stringify_foreign,
            ],
            **kwargs,
        )
