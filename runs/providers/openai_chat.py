"""Any OpenAI-compatible Chat Completions endpoint: OpenAI itself, vLLM, Ollama, the
llama.cpp server, a LiteLLM proxy. The protocol is spoken by the shared LiteLLM layer
(runs.providers.llm); this is that layer set up from explicit arguments rather than a
profile, for callers that name an endpoint directly.
"""

from __future__ import annotations

from django.conf import settings

from runs.agent.profiles import ModelProfile
from runs.providers.base import ProviderObserver
from runs.providers.llm import LiteLLMProvider
from runs.providers.replies import arguments_read, text_tool_calls_parse

__all__ = ["OpenAIChatProvider", "arguments_read", "text_tool_calls_parse"]


class OpenAIChatProvider(LiteLLMProvider):
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
        observer: ProviderObserver | None = None,
    ) -> None:
        profile = ModelProfile(
            name="openai",
            provider="openai",
            model=model or settings.OPENAI_DEFAULT_MODEL,
            base_url=base_url or settings.OPENAI_BASE_URL,
            # No cap unless asked: the endpoint's own default applies.
            max_output_tokens=max_tokens or 0,
            text_tool_calls=text_tool_calls,
        )
        super().__init__(
            profile,
            api_key=api_key or settings.OPENAI_API_KEY,
            max_retries=max_retries,
            backoff_seconds=backoff_seconds,
            timeout=timeout,
            turn_key=turn_key,
            observer=observer,
        )
