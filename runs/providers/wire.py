"""One model request as LiteLLM takes it, from a profile and our conversation.

The conversation is checkpointed in Chat Completions shape (system, user, assistant
with ``tool_calls``, ``tool`` results); LiteLLM turns it into each protocol's own
(Anthropic ``tool_use``/``tool_result`` blocks, Gemini function parts, Responses
items). What differs between models is decided here from the profile's capabilities:
which output cap parameter, whether reasoning effort or sampling parameters are sent,
where prompt-cache breakpoints go, and how tools are offered to a model without native
tool calling.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from runs.agent.profiles import OPENAI_PROVIDERS, ModelProfile

WIRE_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})
EPHEMERAL = {"type": "ephemeral"}
TEXT_TOOLS_INSTRUCTION = (
    "Call a tool by writing a block of this form (one block per call):\n"
    '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>\n'
    "The tools:\n"
)


def litellm_model(profile: ModelProfile) -> str:
    """The model as LiteLLM routes it: ``<provider>/<model>``."""
    if profile.provider == "openai-responses":
        return f"openai/responses/{profile.model}"
    if profile.provider in ("openai", "local"):
        return f"openai/{profile.model}"
    return f"{profile.provider}/{profile.model}"


def api_base(profile: ModelProfile) -> str | None:
    if profile.base_url:
        return profile.base_url
    if profile.provider in OPENAI_PROVIDERS:
        return str(settings.OPENAI_BASE_URL)
    return None


def wire_messages(messages: list[dict[str, Any]], profile: ModelProfile) -> list[dict[str, Any]]:
    """Our checkpointed conversation in the shape the protocol accepts.

    An assistant message may not carry an empty ``tool_calls`` list, and content must be
    a string (or null next to tool calls).
    """
    wire: list[dict[str, Any]] = []
    for message in messages:
        out = {k: v for k, v in message.items() if k in WIRE_KEYS}
        if not out.get("tool_calls"):
            out.pop("tool_calls", None)
        if out.get("content") is None and "tool_calls" not in out:
            out["content"] = ""
        wire.append(out)
    if not profile.tool_use:
        wire = _tool_calls_as_text(wire)
    if profile.prompt_caching:
        wire = _cache_breakpoints(wire)
    return wire


def _cache_breakpoints(wire: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark the system prompt and the newest message as cache breakpoints.

    Anthropic caches the prefix up to each marked block (tools, system, then messages),
    so each turn reads everything before its newest message from the cache.
    """
    marked = list(wire)
    for position in {0, len(marked) - 1} if marked else set():
        message = dict(marked[position])
        content = message.get("content")
        if message.get("role") == "tool":
            message["cache_control"] = EPHEMERAL
        elif isinstance(content, str) and content:
            message["content"] = [{"type": "text", "text": content, "cache_control": EPHEMERAL}]
        else:
            continue
        marked[position] = message
    return marked


def _tool_calls_as_text(wire: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History for a model without native tool calling: calls and results as text."""
    out: list[dict[str, Any]] = []
    for message in wire:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            blocks = [
                "<tool_call>"
                + json.dumps(
                    {
                        "name": call["function"]["name"],
                        "arguments": _arguments_object(call["function"].get("arguments")),
                    }
                )
                + "</tool_call>"
                for call in message["tool_calls"]
            ]
            text = "\n".join(filter(None, [message.get("content") or "", *blocks]))
            out.append({"role": "assistant", "content": text})
        elif message.get("role") == "tool":
            result = f"Result of tool call {message.get('tool_call_id', '')}:\n{message['content']}"
            out.append({"role": "user", "content": result})
        else:
            out.append(message)
    return out


def _arguments_object(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _tools_described(wire: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
    """Offer the tools in the system prompt to a model that cannot take them natively."""
    described = TEXT_TOOLS_INSTRUCTION + json.dumps([t["function"] for t in tools])
    if wire and wire[0].get("role") == "system" and isinstance(wire[0].get("content"), str):
        wire[0] = {**wire[0], "content": f"{wire[0]['content']}\n\n{described}"}
    else:
        wire.insert(0, {"role": "system", "content": described})


def request_params(
    profile: ModelProfile,
    *,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    purpose: str,
) -> dict[str, Any]:
    """LiteLLM ``completion`` arguments for one turn (no credentials, no transport)."""
    wire = wire_messages(messages, profile)
    params: dict[str, Any] = {"model": litellm_model(profile), "messages": wire}
    if tools and profile.tool_use:
        params["tools"] = tools
        params["tool_choice"] = "auto"
    elif tools:
        _tools_described(wire, tools)
    if profile.max_output_tokens:
        # Chat Completions reasoning models refuse max_tokens; LiteLLM maps max_tokens to
        # every other protocol's own cap (max_output_tokens, maxOutputTokens).
        reasoning_chat = profile.reasoning and profile.provider == "openai"
        key = "max_completion_tokens" if reasoning_chat else "max_tokens"
        params[key] = profile.max_output_tokens
    if profile.reasoning_effort:
        params["reasoning_effort"] = profile.reasoning_effort
    if purpose == "judge" and profile.sampling:
        params["temperature"] = 0
    if profile.streaming:
        params["stream"] = True
        if profile.provider in ("openai", "local"):
            params["stream_options"] = {"include_usage": True}
    return params
