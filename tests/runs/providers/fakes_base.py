"""What the fake model servers share: the neutral view of a request and of an answer."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# OpenAI's reasoning models, and a deployment name that serves one behind a proxy.
REASONING_MODEL = re.compile(r"^(o\d|gpt-5)|reasoner")


@dataclass
class Turn:
    """What the model answers: text, tool calls ``(id, name, arguments)``, usage."""

    text: str = ""
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    reasoning: str = ""
    usage: tuple[int, int, int] = (100, 20, 0)  # in, out, cached


@dataclass
class Refusal:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Seen:
    """A request as any protocol carried it."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    purpose: str
    tool_results: int
    text: str  # the whole request as JSON, for scripts that look for a phrase


Script = Callable[[Seen, int], "Turn | Refusal | bytes"]


def openai_error(message: str, *, param: str = "", code: str = "") -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param or None,
            "code": code or None,
        }
    }


def sse(events: list[tuple[str, dict[str, Any]]], *, done: bool = False) -> list[bytes]:
    out = [
        (f"event: {name}\n" if name else "").encode() + b"data: " + json.dumps(data).encode()
        for name, data in events
    ]
    out = [chunk + b"\n\n" for chunk in out]
    if done:
        out.append(b"data: [DONE]\n\n")
    return out
