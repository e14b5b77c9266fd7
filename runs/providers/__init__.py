"""Model providers behind one interface."""

from __future__ import annotations

from runs.providers.base import ModelProvider, ModelReply, ModelUsage, ToolCallRequest


def provider_for(name: str, *, options: dict | None = None) -> ModelProvider:
    """The provider configured by ``name`` ("scripted", "openai", "openai:<model>")."""
    kind, _, model = name.partition(":")
    if kind == "scripted":
        from runs.providers.scripted import ScriptedProvider

        options = options or {}
        return ScriptedProvider(script=options.get("script"), run_no=options.get("run_no", 1))
    if kind == "openai":
        from runs.providers.openai_chat import OpenAIChatProvider

        return OpenAIChatProvider(model=model or None)
    raise ValueError(f"unknown model provider {name!r}")


__all__ = ["ModelProvider", "ModelReply", "ModelUsage", "ToolCallRequest", "provider_for"]
