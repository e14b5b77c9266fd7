"""Artifacts: large content stored once, referenced from events by id."""

from __future__ import annotations

import hashlib
import re

from runs.models import Artifact, Run

# Redaction before anything is stored: keys and tokens never land in artifacts.
SECRET_PATTERNS = [
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}\b"),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{20,}\b"),
    re.compile(r"(?i)(authorization|api[_-]?key|x-api-key)(\"?\s*[:=]\s*\"?)(bearer\s+)?[^\s\",]+"),
]


def redact(text: str) -> str:
    for pattern in SECRET_PATTERNS:
        if pattern.groups >= 2:
            text = pattern.sub(lambda m: f"{m.group(1)}{m.group(2)}[REDACTED]", text)
        else:
            text = pattern.sub("[REDACTED]", text)
    return text


def artifact_create(
    *,
    run: Run,
    kind: str,
    name: str,
    content: str,
    content_type: str = "text/plain",
    redacted: bool = True,
) -> Artifact:
    """Store content as an artifact of the run (secrets redacted unless told otherwise)."""
    if redacted:
        content = redact(content)
    data = content.encode("utf-8")
    return Artifact.objects.create(
        run=run,
        kind=kind,
        name=name,
        content=content,
        content_type=content_type,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
