"""The model provider interface: one request in, one reply (text and tool calls) out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


class ModelError(Exception):
    """The model endpoint failed; ``retryable`` says whether asking again may help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass
class ToolCallRequest:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class ModelUsage:
    tokens_in: int = 0
    tokens_out: int = 0


@dataclass
class ModelReply:
    content: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    usage: ModelUsage = field(default_factory=ModelUsage)
    model: str = ""
    raw: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls
            ],
            "usage": {"tokens_in": self.usage.tokens_in, "tokens_out": self.usage.tokens_out},
            "model": self.model,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelReply:
        return cls(
            content=data.get("content", ""),
            tool_calls=[
                ToolCallRequest(id=c["id"], name=c["name"], arguments=c.get("arguments", {}))
                for c in data.get("tool_calls", [])
            ],
            usage=ModelUsage(**data.get("usage", {})),
            model=data.get("model", ""),
        )


class ModelProvider(ABC):
    name: str
    model: str

    @abstractmethod
    def complete(
        self,
        *,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        purpose: str,
        turn_index: int,
    ) -> ModelReply:
        """Answer one turn. ``turn_index`` counts this run's turns of ``purpose``."""
