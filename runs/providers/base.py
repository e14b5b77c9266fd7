"""The model provider interface: one request in, one reply (text and tool calls) out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ModelError(Exception):
    """The model endpoint failed; ``retryable`` says whether asking again may help.

    ``status`` is the HTTP status (0 when there was none) and ``body`` what the endpoint
    answered, so the operator reads the provider's own explanation.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int = 0,
        body: str = "",
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.body = body
        self.attempts = attempts


class ReplayDiverged(ModelError):
    """A replayed run sent a request that differs from the recorded one."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class ContextLengthExceeded(ModelError):
    """The endpoint refused the request because it does not fit the model's window."""

    def __init__(self, message: str, *, status: int = 0, body: str = "") -> None:
        super().__init__(message, retryable=False, status=status, body=body)


@dataclass(frozen=True)
class RetryNotice:
    """A request that failed transiently and is about to be sent again."""

    attempt: int
    status: int
    error: str
    wait_seconds: float
    retry_after: bool = False


@dataclass(frozen=True)
class StreamProgress:
    """How much of a streamed reply has arrived so far."""

    chunks: int
    chars: int
    elapsed_ms: int


@dataclass
class ProviderObserver:
    """Where a provider reports what happens during one call (the timeline, in a run)."""

    retry: Callable[[RetryNotice], None] = lambda notice: None
    progress: Callable[[StreamProgress], None] = lambda progress: None
    # A wait for a shared rate limit (runs.ratelimits.Wait) before a request.
    rate_wait: Callable[[Any], None] = lambda wait: None


@dataclass
class ToolCallRequest:
    id: str
    name: str
    arguments: dict[str, Any]
    # Set when the arguments could not be read (cut off, not JSON): the call is
    # answered with this error and never run.
    error: str = ""
    raw_arguments: str = ""


@dataclass
class ModelUsage:
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    estimated: bool = False


@dataclass
class ModelReply:
    content: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    usage: ModelUsage = field(default_factory=ModelUsage)
    model: str = ""
    raw: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = ""
    # What a reasoning model said it thought (reasoning_content, thinking blocks):
    # kept with the turn for the operator, never sent back.
    reasoning: str = ""

    def to_json(self) -> dict[str, Any]:
        calls = []
        for c in self.tool_calls:
            call: dict[str, Any] = {"id": c.id, "name": c.name, "arguments": c.arguments}
            if c.error:
                call.update(error=c.error, raw_arguments=c.raw_arguments)
            calls.append(call)
        data: dict[str, Any] = {
            "content": self.content,
            "tool_calls": calls,
            "usage": {"tokens_in": self.usage.tokens_in, "tokens_out": self.usage.tokens_out},
            "model": self.model,
        }
        if self.usage.tokens_cached:
            data["usage"]["tokens_cached"] = self.usage.tokens_cached
        if self.usage.estimated:
            data["usage"]["estimated"] = True
        if self.finish_reason:
            data["finish_reason"] = self.finish_reason
        if self.reasoning:
            data["reasoning"] = self.reasoning
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelReply:
        return cls(
            content=data.get("content", ""),
            tool_calls=[
                ToolCallRequest(
                    id=c["id"],
                    name=c["name"],
                    arguments=c.get("arguments", {}),
                    error=c.get("error", ""),
                    raw_arguments=c.get("raw_arguments", ""),
                )
                for c in data.get("tool_calls", [])
            ],
            usage=ModelUsage(**data.get("usage", {})),
            model=data.get("model", ""),
            finish_reason=data.get("finish_reason", ""),
            reasoning=data.get("reasoning", ""),
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
