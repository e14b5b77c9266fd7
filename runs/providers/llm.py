"""Every model protocol through one layer, LiteLLM: OpenAI Chat Completions and the
Responses API, Anthropic Messages, Gemini and OpenAI-compatible local servers.

Retries are ours rather than the library's: rate limits (429), server errors (5xx), a
reply without choices and lost connections are retried here with exponential backoff
and full jitter, honouring Retry-After, and each retry is reported to the observer (the
run's timeline) before its back-off. What still fails after that goes back to the
engine as a retryable ModelError. A refusal carries the provider's own explanation
(``Unsupported parameter: 'max_tokens' ...``), never just a status.

A reply that follows the protocol but gets a tool call wrong (arguments cut off or not
JSON) is still a paid reply: it is returned with the error on the call. A refusal
because the request does not fit the window is a ContextLengthExceeded, which the
caller answers by condensing the conversation.

A streamed reply is assembled into the same reply a non-streamed call returns (LiteLLM's
``stream_chunk_builder``), so what is checkpointed does not depend on how it arrived;
while it arrives the observer hears about it, throttled.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import random
import re
import time
import warnings
from typing import Any

import openai
from django.conf import settings
from django.db import connection

from runs import ratelimits
from runs.agent.profiles import ModelProfile, tokens_estimate
from runs.providers.base import (
    ContextLengthExceeded,
    ModelError,
    ModelProvider,
    ModelReply,
    ModelUsage,
    ProviderObserver,
    RetryNotice,
    StreamProgress,
    ToolCallRequest,
)
from runs.providers.replies import arguments_read, text_tool_calls_parse
from runs.providers.wire import api_base, request_params

# LiteLLM fetches its model map from the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
with warnings.catch_warnings():
    # Its typed dicts make pydantic warn at import; nothing a caller can act on.
    warnings.simplefilter("ignore")
    import litellm
# The same warning comes again when pydantic first builds those schemas, mid-call.
warnings.filterwarnings("ignore", message=r"Items? .* (is|are) using the `ReadOnly` qualifier")
# One line per call at INFO is the library's chatter; the turn's own event says more.
for _name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
    logging.getLogger(_name).setLevel(logging.WARNING)
litellm.suppress_debug_info = True
litellm.telemetry = False

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_SECONDS = 30.0
BODY_LIMIT = 2000
CONTEXT_LENGTH_HINTS = (
    "context_length_exceeded",
    "context length",
    "context window",
    "maximum context",
    "too many tokens",
    "prompt is too long",
)
# LiteLLM reports a 200 reply that is not JSON as a 500 of its own.
NOT_JSON = re.compile(r"Expecting value|JSONDecodeError|Received response - <APIResponse \[2")
BYTES_REPR = re.compile(r"^b(['\"]).*\1$", re.DOTALL)
LITELLM_PREFIX = re.compile(r"^(litellm\.\w+: )+(\w+Exception - |\w+Error - )?")


class EmptyReply(Exception):
    """The endpoint answered 200 without a choice: asked again like a 5xx."""


def _backoff(attempt: int, base: float, retry_after: float | None) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): Retry-After or full jitter."""
    if retry_after is not None:
        return min(retry_after, MAX_RETRY_AFTER_SECONDS)
    return random.uniform(0, base * (2 ** (attempt - 1)))


def _response_of(exc: Exception) -> Any:
    response = getattr(exc, "response", None)
    return response if hasattr(response, "headers") else None


def _retry_after(exc: Exception) -> float | None:
    response = _response_of(exc)
    headers = dict(getattr(exc, "litellm_response_headers", None) or {})
    if response is not None:
        headers.update({k.lower(): v for k, v in response.headers.items()})
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_body(exc: Exception) -> str:
    """What the endpoint answered, as text (its JSON error body when it sent one)."""
    response = _response_of(exc)
    text = ""
    if response is not None:
        try:
            text = response.text
        except Exception:  # a streamed response whose body was never read
            text = ""
    if not text:
        text = LITELLM_PREFIX.sub("", str(getattr(exc, "message", "") or exc)).strip()
        if BYTES_REPR.match(text):
            # Some of LiteLLM's clients put the body in their message as a bytes literal.
            with contextlib.suppress(ValueError, SyntaxError, UnicodeDecodeError):
                text = ast.literal_eval(text).decode("utf-8")
    return text[:BODY_LIMIT]


def error_explained(body: str) -> str:
    """The provider's explanation from its error body: OpenAI, Anthropic and Gemini all
    put it at ``error.message``; anything else is shown as sent."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:500]
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:500]
    if isinstance(error, str):
        return error[:500]
    return body.strip()[:500]


def _status(exc: Exception) -> int:
    status = getattr(exc, "status_code", 0)
    return status if isinstance(status, int) else 0


def _is_context_length(exc: Exception, status: int, body: str) -> bool:
    if isinstance(exc, litellm.ContextWindowExceededError):
        return True
    if status not in (400, 413):
        return False
    return any(hint in f"{body} {exc}".lower() for hint in CONTEXT_LENGTH_HINTS)


def _transient(exc: Exception, status: int) -> bool:
    if NOT_JSON.search(str(exc)):
        return False
    if status in RETRYABLE_STATUS:
        return True
    return isinstance(exc, litellm.APIConnectionError | litellm.Timeout) and not status


class LiteLLMProvider(ModelProvider):
    """The provider of any profile but the scripted one."""

    def __init__(
        self,
        profile: ModelProfile,
        *,
        api_key: str = "",
        max_retries: int | None = None,
        backoff_seconds: float | None = None,
        timeout: float | None = None,
        turn_key: str = "",
        observer: ProviderObserver | None = None,
    ) -> None:
        self.profile = profile
        self.name = profile.provider
        self.model = profile.model
        # Local servers need no key, but the OpenAI client insists on one.
        self.api_key = api_key or "not-needed"
        # Which turn this request answers (``run:step:turn``), sent as Idempotency-Key on
        # every attempt: an endpoint or proxy that deduplicates can answer a repeat from
        # its cache, and its logs tie each request to the run's checkpointed turn.
        self.turn_key = turn_key
        self.observer = observer or ProviderObserver()
        self.max_retries = settings.OPENAI_MAX_RETRIES if max_retries is None else max_retries
        self.backoff_seconds = (
            settings.OPENAI_RETRY_BACKOFF_SECONDS if backoff_seconds is None else backoff_seconds
        )
        self.timeout = timeout or settings.OPENAI_TIMEOUT_SECONDS

    def request(
        self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]], purpose: str
    ) -> dict[str, Any]:
        """The arguments of the call, credentials and transport included."""
        params = request_params(self.profile, messages=messages, tools=tools, purpose=purpose)
        params.update(
            api_key=self.api_key,
            timeout=self.timeout,
            # Our retries, reported on the timeline: none inside the library or its clients.
            max_retries=0,
            num_retries=0,
        )
        base = api_base(self.profile)
        if base:
            params["api_base"] = base
        if self.turn_key:
            params["extra_headers"] = {"Idempotency-Key": self.turn_key}
        return params

    def complete(
        self,
        *,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        purpose: str,
        turn_index: int,
    ) -> ModelReply:
        params = self.request(messages=messages, tools=tools, purpose=purpose)
        # A model turn waits seconds: outside a transaction the thread's database
        # connection goes back meanwhile (to the pool, with DATABASE_POOL), so the
        # connections a worker holds count its runs at work, not those waiting on a model.
        if not connection.in_atomic_block:
            connection.close()
        attempt = 0
        while True:
            attempt += 1
            try:
                # Shared with every worker through Redis: waits, never fails.
                ratelimits.model_acquire(
                    self.profile, messages=messages, tools=tools, on_wait=self.observer.rate_wait
                )
                body = self._call(params)
                return self._parse(
                    body, messages=params["messages"], turn_tag=f"{purpose}-{turn_index}"
                )
            except EmptyReply as exc:
                status, body_text, explained = 200, str(exc), str(exc)
                retry_after = None
            except ModelError:
                raise
            except openai.OpenAIError as exc:
                # LiteLLM's exceptions, whatever the protocol, are the OpenAI SDK's.
                status, body_text = _status(exc), error_body(exc)
                explained = error_explained(body_text)
                if _is_context_length(exc, status, body_text):
                    raise ContextLengthExceeded(
                        f"the request does not fit the model's context window: HTTP {status}: "
                        f"{explained}",
                        status=status,
                        body=body_text,
                    ) from exc
                if NOT_JSON.search(str(exc)):
                    raise ModelError(
                        f"model reply is not JSON: {explained}", retryable=False, status=200
                    ) from exc
                if not _transient(exc, status):
                    raise ModelError(
                        f"model endpoint refused the request: HTTP {status}: {explained}",
                        retryable=False,
                        status=status,
                        body=body_text,
                    ) from exc
                retry_after = _retry_after(exc)
            if attempt > self.max_retries:
                raise ModelError(
                    f"model endpoint still failing after {attempt} attempts: "
                    f"HTTP {status}: {explained}",
                    retryable=True,
                    status=status,
                    body=body_text,
                    attempts=attempt,
                )
            wait = _backoff(attempt, self.backoff_seconds, retry_after)
            self.observer.retry(
                RetryNotice(
                    attempt=attempt,
                    status=status,
                    error=explained[:500],
                    wait_seconds=round(wait, 3),
                    retry_after=retry_after is not None,
                )
            )
            time.sleep(wait)

    def _call(self, params: dict[str, Any]) -> dict[str, Any]:
        """One request; the reply as a plain dict, streamed or not."""
        if not params.get("stream"):
            return litellm.completion(**params).model_dump()
        started = time.monotonic()
        every = settings.MODEL_STREAM_PROGRESS_SECONDS
        told = started
        chunks: list[Any] = []
        chars = 0
        for chunk in litellm.completion(**params):
            chunks.append(chunk)
            for choice in getattr(chunk, "choices", None) or []:
                delta = getattr(choice, "delta", None)
                chars += len(getattr(delta, "content", None) or "")
                for call in getattr(delta, "tool_calls", None) or []:
                    chars += len(getattr(call.function, "arguments", None) or "")
            now = time.monotonic()
            if now - told >= every:
                told = now
                self.observer.progress(
                    StreamProgress(
                        chunks=len(chunks), chars=chars, elapsed_ms=int((now - started) * 1000)
                    )
                )
        if not chunks:
            raise EmptyReply("the streamed reply carried no chunks")
        built = litellm.stream_chunk_builder(chunks, messages=params["messages"])
        if built is None:
            raise EmptyReply("the streamed reply carried no choices")
        return built.model_dump()

    def _parse(
        self, body: dict[str, Any], *, messages: list[dict[str, Any]], turn_tag: str = "0"
    ) -> ModelReply:
        """A ModelReply from a Chat Completions-shaped body; anything off-protocol is a
        ModelError. Broken arguments of a single call are not off-protocol: the call
        carries the error."""
        if not body.get("choices"):
            raise EmptyReply("the reply has no choices")
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
                arguments, error = arguments_read(raw)
                calls.append(
                    ToolCallRequest(
                        id=str(call.get("id") or f"call-{turn_tag}-{position}"),
                        name=str(function.get("name") or ""),
                        arguments=arguments,
                        error=error,
                        raw_arguments=str(raw)[:2000] if error else "",
                    )
                )
            text_calls = self.profile.text_tool_calls or not self.profile.tool_use
            if text_calls and not calls and "<tool_call>" in content:
                content, calls = text_tool_calls_parse(content, turn_tag)
            finish_reason = str(choice.get("finish_reason") or "")
            usage = body.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            tokens_in = int(usage.get("prompt_tokens") or 0)
            tokens_out = int(usage.get("completion_tokens") or 0)
            tokens_cached = int(details.get("cached_tokens") or 0)
            reasoning = str(message.get("reasoning_content") or "")
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise ModelError(f"malformed model reply: {exc!r}", retryable=False) from exc
        estimated = not tokens_in and not tokens_out
        if estimated:
            # No usage is not free: count what was sent and what came back.
            tokens_in = tokens_estimate(messages, model=self.model)
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
            reasoning=reasoning,
        )
