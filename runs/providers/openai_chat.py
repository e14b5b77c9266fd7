"""Any OpenAI-compatible Chat Completions endpoint with tool calling, through the SDK.

OpenAI itself, vLLM, Ollama, the llama.cpp server and a LiteLLM proxy all speak this
protocol. Retries are ours rather than the SDK's: rate limits (429) and server errors
(5xx) are retried here with exponential backoff and full jitter, honouring Retry-After,
so one step never hammers a struggling endpoint; what is still failing after that goes
back to the engine as a retryable ModelError. A reply that does not follow the protocol
is not retried: asking again rarely fixes a broken server and costs money.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import openai
from django.conf import settings

from runs.providers.base import ModelError, ModelProvider, ModelReply, ModelUsage, ToolCallRequest

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_SECONDS = 30.0


def _backoff(attempt: int, base: float, retry_after: float | None) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): Retry-After or full jitter."""
    if retry_after is not None:
        return min(retry_after, MAX_RETRY_AFTER_SECONDS)
    return random.uniform(0, base * (2 ** (attempt - 1)))


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our checkpointed conversation in the exact shape the protocol accepts.

    An assistant message may not carry an empty ``tool_calls`` list, and content must be
    a string (or null next to tool calls).
    """
    wire: list[dict[str, Any]] = []
    for message in messages:
        out = {
            k: v
            for k, v in message.items()
            if k in {"role", "content", "tool_calls", "tool_call_id", "name"}
        }
        if not out.get("tool_calls"):
            out.pop("tool_calls", None)
        if out.get("content") is None and "tool_calls" not in out:
            out["content"] = ""
        wire.append(out)
    return wire


class OpenAIChatProvider(ModelProvider):
    name = "openai"

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int | None = None,
        backoff_seconds: float | None = None,
        timeout: float | None = None,
    ) -> None:
        self.model = model or settings.OPENAI_DEFAULT_MODEL
        self.max_retries = settings.OPENAI_MAX_RETRIES if max_retries is None else max_retries
        self.backoff_seconds = (
            settings.OPENAI_RETRY_BACKOFF_SECONDS if backoff_seconds is None else backoff_seconds
        )
        # Local servers (Ollama, llama.cpp) need no key, but the SDK insists on one.
        self.client = openai.OpenAI(
            base_url=base_url or settings.OPENAI_BASE_URL,
            api_key=api_key or settings.OPENAI_API_KEY or "not-needed",
            max_retries=0,
            timeout=timeout or settings.OPENAI_TIMEOUT_SECONDS,
        )

    def complete(
        self,
        *,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        purpose: str,
        turn_index: int,
    ) -> ModelReply:
        request: dict[str, Any] = {"model": self.model, "messages": _wire_messages(messages)}
        if tools:
            request["tools"] = tools
            request["tool_choice"] = "auto"
        if purpose == "judge":
            request["temperature"] = 0
        attempt = 0
        while True:
            attempt += 1
            try:
                raw = self.client.chat.completions.with_raw_response.create(**request)
                body = json.loads(raw.text)
            except openai.APIStatusError as exc:
                if exc.status_code not in RETRYABLE_STATUS:
                    raise ModelError(
                        f"model endpoint refused the request: HTTP {exc.status_code}",
                        retryable=False,
                    ) from exc
                if attempt > self.max_retries:
                    raise ModelError(
                        f"model endpoint still failing after {attempt} attempts: "
                        f"HTTP {exc.status_code}",
                        retryable=True,
                    ) from exc
                time.sleep(_backoff(attempt, self.backoff_seconds, _retry_after(exc)))
                continue
            except (openai.APIConnectionError, openai.APITimeoutError) as exc:
                if attempt > self.max_retries:
                    raise ModelError(f"model endpoint unreachable: {exc}", retryable=True) from exc
                time.sleep(_backoff(attempt, self.backoff_seconds, None))
                continue
            except (ValueError, openai.APIResponseValidationError) as exc:
                raise ModelError(f"model reply is not JSON: {exc}", retryable=False) from exc
            return self._parse(body)

    def _parse(self, body: Any) -> ModelReply:
        """A ModelReply from a Chat Completions body; anything off-protocol is a ModelError."""
        try:
            choice = body["choices"][0]
            message = choice["message"]
            content = message.get("content") or ""
            if not isinstance(content, str):
                raise TypeError("message content is not a string")
            calls: list[ToolCallRequest] = []
            for call in message.get("tool_calls") or []:
                function = call["function"]
                arguments = function.get("arguments") or "{}"
                parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
                if not isinstance(parsed, dict):
                    raise TypeError("tool call arguments are not an object")
                calls.append(
                    ToolCallRequest(
                        id=str(call["id"]), name=str(function["name"]), arguments=parsed
                    )
                )
            usage = body.get("usage") or {}
            tokens_in = int(usage.get("prompt_tokens") or 0)
            tokens_out = int(usage.get("completion_tokens") or 0)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise ModelError(f"malformed model reply: {exc!r}", retryable=False) from exc
        return ModelReply(
            content=content,
            tool_calls=calls,
            usage=ModelUsage(tokens_in=tokens_in, tokens_out=tokens_out),
            model=str(body.get("model") or self.model),
            raw=body,
        )
