"""Model providers behind one interface."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from django.conf import settings

from runs.agent.profiles import ProfileError, profile_get
from runs.providers.base import (
    ModelProvider,
    ModelReply,
    ModelUsage,
    ProviderObserver,
    ToolCallRequest,
)
from runs.providers.scripted import ScriptedProvider

if TYPE_CHECKING:
    from runs.agent.profiles import ModelProfile


def provider_for_profile(
    profile: ModelProfile,
    *,
    options: dict | None = None,
    turn_key: str = "",
    observer: ProviderObserver | None = None,
) -> ModelProvider:
    """The provider a model profile describes; its key is read from the named variable.

    ``turn_key`` names the turn asked (``run:step:turn``) to endpoints that take one;
    ``observer`` hears of retries and of a streamed reply's progress.
    """
    options = options or {}
    if profile.provider == "scripted":
        return ScriptedProvider(script=options.get("script"), run_no=options.get("run_no", 1))
    # LiteLLM takes seconds to import: only the processes that call a model pay for it.
    from runs.providers.llm import LiteLLMProvider

    api_key = os.environ.get(profile.api_key_env, "") if profile.api_key_env else ""
    if not api_key and profile.api_key_env == "OPENAI_API_KEY":
        api_key = settings.OPENAI_API_KEY
    # Never fall back to another endpoint's key: a local server needs none.
    return LiteLLMProvider(profile, api_key=api_key, turn_key=turn_key, observer=observer)


def provider_for(name: str, *, options: dict | None = None) -> ModelProvider:
    """The provider of profile ``name`` ("scripted", "openai", "openai:<model>", ...)."""
    try:
        profile = profile_get(name)
    except ProfileError as exc:
        raise ValueError(str(exc)) from exc
    return provider_for_profile(profile, options=options)


__all__ = [
    "ModelProvider",
    "ModelReply",
    "ModelUsage",
    "ProviderObserver",
    "ToolCallRequest",
    "provider_for",
    "provider_for_profile",
]
