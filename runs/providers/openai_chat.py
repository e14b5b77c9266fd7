"""Any OpenAI-compatible Chat Completions endpoint with tool calling, through the SDK.

OpenAI itself, vLLM, Ollama, the llama.cpp server and a LiteLLM proxy all speak this
protocol. Retries are ours rather than the SDK's: rate limits (429) and server errors
(5xx) are retried here with exponential backoff and full jitter, honouring Retry-After,
so one step never hammers a struggling endpoint; what is still failing after that goes
back to the engine as a retryable ModelError. A reply that does not follow the protocol
is not retried: asking again rarely fixes a broken server and costs money.

A reply that follows the protocol but gets a tool call wrong (arguments cut off or not
JSON) is still a paid reply: it is returned with the error on the call, so the turn is
stored and counted and the model is told what went wrong. A refusal because the
request does not fit the window is a ContextLengthExceeded, which the caller answers by
condensing the conversation.
"""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

import openai
from django.conf import settings

from runs.agent.profiles import tokens_estimate
from runs.providers.base import (
    ContextLengthExceeded,
    ModelError,
    ModelProvider,
    ModelReply,
    ModelUsage,
    ToolCallRequest,
)

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_SECONDS = 30.0
TEXT_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
CONTEXT_LENGTH_HINTS = (
    "context_length_exceeded",
    "context length",
    "context window",
    "maximum context",
    "too many tokens",
    "prompt is too long",
)


def _is_context_length(exc: openai.APIStatusError) -> bool:
    if exc.status_code not in (400, 413):
        return False
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
    text = " ".join(
        str(part) for part in (error.get("code"), error.get("type"), error.get("message"), exc)
    ).lower()
    return any(hint in text for hint in CONTEXT_LENGTH_HINTS)


def _arguments_read(raw: Any) -> tuple[dict[str, Any], str]:
    """Tool call arguments as an object, or an error saying why they are not one."""
    if isinstance(raw, dict):
        return raw, ""
    if raw is None or raw == "":
        return {}, ""
    if not isinstance(raw, str):
        return {}, f"arguments must be a JSON object, got {type(raw).__name__}"
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"arguments are not valid JSON ({exc.msg} at character {exc.pos})"
    if not isinstance(parsed, dict):
        return {}, f"arguments must be a JSON object, got {type(parsed).__name__}"
    return parsed, ""


def text_tool_calls_parse(content: str, turn_tag: str) -> tuple[str, list[ToolCallRequest]]:
    """Tool calls written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Hermes- and Qwen-style chat templates emit calls this way when a server does not
    turn them into protocol tool calls. Returns the text without the blocks.
    """
    calls: list[ToolCallRequest] = []
    for position, match in enumerate(TEXT_TOOL_CALL.finditer(content)):
        block = match.group(1)
        call_id = f"text-{turn_tag}-{position}"
        try:
            parsed = json.loads(block)
        except json.JSONDecodeError as exc:
            calls.append(
                ToolCallRequest(
                    id=call_id,
                    name="",
                    arguments={},
                    error=f"<tool_call> block is not valid JSON ({exc.msg})",
                    raw_arguments=block[:2000],
                )
            )
            continue
        if not isinstance(parsed, dict):
            parsed = {}
        arguments, error = _arguments_read(parsed.get("arguments", parsed.get("parameters")))
        calls.append(
            ToolCallRequest(
                id=call_id,
                name=str(parsed.get("name", "")),
                arguments=arguments,
                error=error,
                raw_arguments=json.dumps(parsed.get("arguments"))[:2000] if error else "",
            )
        )
    return TEXT_TOOL_CALL.sub("", content).strip(), calls


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
        max_tokens: int | None = None,
        text_tool_calls: bool = False,
        turn_key: str = "",
    ) -> None:
        self.model = model or settings.OPENAI_DEFAULT_MODEL
        # Which turn this request answers (``run:step:turn``), sent as Idempotency-Key on
        # every attempt: an endpoint or proxy that deduplicates can answer a repeat from
        # its cache, and its logs tie each request to the run's checkpointed turn.
        self.turn_key = turn_key
        self.max_tokens = max_tokens
        self.text_tool_calls = text_tool_calls
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
        if self.max_tokens:
            request["max_tokens"] = self.max_tokens
        if tools:
            request["tools"] = tools
            request["tool_choice"] = "auto"
        if purpose == "judge":
            request["temperature"] = 0
        if self.turn_key:
            request["extra_headers"] = {"Idempotency-Key": self.turn_key}
        attempt = 0
        while True:
            attempt += 1
            try:
                raw = self.client.chat.completions.with_raw_response.create(**request)
                body = json.loads(raw.text)
            except openai.APIStatusError as exc:
                if _is_context_length(exc):
                    raise ContextLengthExceeded(
                        f"the request does not fit the model's context window: HTTP "
                        f"{exc.status_code}"
                    ) from exc
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
            return self._parse(body, request=request, turn_tag=f"{purpose}-{turn_index}")

    def _parse(
        self, body: Any, *, request: dict[str, Any] | None = None, turn_tag: str = "0"
    ) -> ModelReply:
        """A ModelReply from a Chat Completions body; anything off-protocol is a ModelError.

        Broken arguments of a single call are not off-protocol: the call carries the error.
        """
        try:
            choice = body["choices"][0]
            message = choice["message"]
            content = message.get("content") or ""
            if not isinstance(content, str):
                raise TypeError("message content is not a string")
            calls: list[ToolCallRequest] = []
            for position, call in enumerate(message.get("tool_calls") or []):
                function = call["function"]
                raw = function.get("arguments")
                arguments, error = _arguments_read(raw)
                calls.append(
                    ToolCallRequest(
                        id=str(call.get("id") or f"call-{turn_tag}-{position}"),
                        name=str(function.get("name") or ""),
                        arguments=arguments,
                        error=error,
                        raw_arguments=str(raw)[:2000] if error else "",
                    )
                )
            if self.text_tool_calls and not calls and "<tool_call>" in content:
                content, calls = text_tool_calls_parse(content, turn_tag)
            finish_reason = str(choice.get("finish_reason") or "")
            usage = body.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            tokens_in = int(usage.get("prompt_tokens") or 0)
            tokens_out = int(usage.get("completion_tokens") or 0)
            tokens_cached = int(details.get("cached_tokens") or 0)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise ModelError(f"malformed model reply: {exc!r}", retryable=False) from exc
        estimated = not usage.get("prompt_tokens") and not usage.get("completion_tokens")
        if estimated:
            # No usage is not free: count what was sent and what came back.
            tokens_in = tokens_estimate((request or {}).get("messages", []), model=self.model)
            tokens_out = tokens_estimate(message, model=self.model)
        return ModelReply(
            content=content,
            tool_calls=calls,
            usage=ModelUsage(
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                tokens_cached=tokens_cached,
                estimated=estimated,
            ),
            model=str(body.get("model") or self.model),
            raw=body,
            finish_reason=finish_reason,
        )
