"""Structured logging: structlog for our own loggers, the same rendering for the rest."""

from __future__ import annotations

from typing import Any

import structlog

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
    """Renders every record as JSON (production) or as aligned key=value lines."""

    def __init__(self, json: bool = False, **kwargs: Any) -> None:
        renderer: Any = (
            structlog.processors.JSONRenderer()
            if json
            else structlog.dev.ConsoleRenderer(colors=False)
        )
        super().__init__(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=_SHARED_PROCESSORS,
            **kwargs,
        )
