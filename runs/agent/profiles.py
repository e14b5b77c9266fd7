"""Model profiles: which endpoint, model, window, output limit, prices and capabilities.

A profile is named in settings (``MODEL_PROFILES``) and chosen per task, repository or
workspace, in that order, falling back to ``AGENT_MODEL``. Prices, context windows and
capabilities come from the model catalogue LiteLLM maintains (shipped as
``model_prices.json`` in the ``tokencost`` package), so a dated name such as
``gpt-4o-2024-08-06`` costs what ``gpt-4o`` costs; anything a profile states itself
overrides the catalogue.

``provider`` names the protocol: ``openai`` (Chat Completions), ``openai-responses``
(the Responses API), ``anthropic`` (Messages), ``gemini`` (generateContent), ``local``
(an OpenAI-compatible server such as vLLM, Ollama or llama.cpp: free unless priced) and
``scripted`` (the demo's model: free).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings

MILLION = Decimal(1_000_000)
DEFAULT_CONTEXT_WINDOW = 32_768
DEFAULT_MAX_OUTPUT_TOKENS = 4_096
# What an unknown model costs, so a missing price never makes a run free.
DEFAULT_PRICES = (Decimal("1.00"), Decimal("3.00"), Decimal("0.50"))
DATE_SUFFIX = re.compile(r"(-\d{4}-\d{2}-\d{2}|-\d{8}|-\d{4})$")
PROVIDERS = ("openai", "openai-responses", "anthropic", "gemini", "local", "scripted")
# Providers whose models cost nothing unless the profile states a price.
FREE_PROVIDERS = ("local", "scripted")
# OpenAI's reasoning models (o-series, gpt-5) refuse temperature and top_p.
OPENAI_PROVIDERS = ("openai", "openai-responses")
OPENAI_HOSTED = "https://api.openai.com/"
REASONING_EFFORTS = ("minimal", "low", "medium", "high")


class ProfileError(ValueError):
    """The named profile does not exist or is not usable."""


@dataclass(frozen=True)
class ModelProfile:
    name: str
    provider: str
    model: str
    base_url: str = ""
    api_key_env: str = ""
    context_window: int = DEFAULT_CONTEXT_WINDOW
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
    price_input: Decimal = DEFAULT_PRICES[0]
    price_output: Decimal = DEFAULT_PRICES[1]
    price_cached: Decimal = DEFAULT_PRICES[2]
    # Templates (Hermes, Qwen) that write tool calls as <tool_call> blocks in the text.
    text_tool_calls: bool = False
    catalogue_name: str = ""
    # Capabilities: what the request may carry and how the reply arrives.
    reasoning: bool = False
    reasoning_effort: str = ""
    tool_use: bool = True
    sampling: bool = True
    streaming: bool = False
    prompt_caching: bool = False
    # Condense older turns into a summary the model writes, rather than a list of calls.
    condense_summary: bool = False
    # Requests and tokens per minute the provider allows this profile, shared by every
    # worker through Redis (runs.ratelimits); 0: no limit of ours.
    rpm: int = 0
    tpm: int = 0

    def cost(self, tokens_in: int, tokens_out: int, tokens_cached: int = 0) -> Decimal:
        """US dollars for one reply; cached prompt tokens are billed at the cached price."""
        cached = min(max(tokens_cached, 0), tokens_in)
        return (
            self.price_input * (tokens_in - cached)
            + self.price_cached * cached
            + self.price_output * tokens_out
        ) / MILLION

    def for_model(self, model: str) -> ModelProfile:
        """The same profile priced for the model an endpoint says it actually used."""
        if not model or model == self.model or self.catalogue_name == catalogue_resolve(model):
            return self
        entry = catalogue_entry(model)
        if entry is None:
            return self
        return _with_catalogue(replace(self, model=model), entry, explicit=set())

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "provider": self.provider,
            "model": self.model,
            "base_url": self.base_url,
            "context_window": self.context_window,
            "max_output_tokens": self.max_output_tokens,
            "prices_per_million": {
                "input": str(self.price_input),
                "output": str(self.price_output),
                "cached": str(self.price_cached),
            },
            "text_tool_calls": self.text_tool_calls,
            "condense_summary": self.condense_summary,
            "catalogue_name": self.catalogue_name,
            "capabilities": {
                "reasoning": self.reasoning,
                "reasoning_effort": self.reasoning_effort,
                "tool_use": self.tool_use,
                "sampling": self.sampling,
                "streaming": self.streaming,
                "prompt_caching": self.prompt_caching,
            },
        }


@functools.cache
def catalogue() -> dict[str, dict[str, Any]]:
    """LiteLLM's model map as the pinned package ships it (empty if it is missing)."""
    spec = importlib.util.find_spec("tokencost")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / "model_prices.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def catalogue_resolve(model: str) -> str:
    """The catalogue's name for ``model``: as given, without a provider prefix or a date."""
    entries = catalogue()
    candidates = [model, model.split("/", 1)[-1]]
    candidates += [DATE_SUFFIX.sub("", c) for c in candidates]
    for candidate in candidates:
        if candidate in entries and entries[candidate].get("input_cost_per_token") is not None:
            return candidate
    for candidate in candidates:
        if candidate in entries:
            return candidate
    return ""


def catalogue_entry(model: str) -> dict[str, Any] | None:
    name = catalogue_resolve(model)
    return {**catalogue()[name], "_name": name} if name else None


def _per_million(value: Any) -> Decimal | None:
    if value is None:
        return None
    return Decimal(format((Decimal(str(value)) * MILLION).normalize(), "f"))


def _with_catalogue(
    profile: ModelProfile, entry: dict[str, Any], explicit: set[str]
) -> ModelProfile:
    changes: dict[str, Any] = {"catalogue_name": entry["_name"]}
    window = entry.get("max_input_tokens") or entry.get("max_tokens")
    if "context_window" not in explicit and window:
        changes["context_window"] = int(window)
    output = entry.get("max_output_tokens")
    if "max_output_tokens" not in explicit and output:
        changes["max_output_tokens"] = min(int(output), settings.MODEL_MAX_OUTPUT_TOKENS_CAP)
    priced = profile.provider not in FREE_PROVIDERS
    for field_name, key in (
        ("price_input", "input_cost_per_token"),
        ("price_output", "output_cost_per_token"),
        ("price_cached", "cache_read_input_token_cost"),
    ):
        price = _per_million(entry.get(key))
        if priced and field_name not in explicit and price is not None:
            changes[field_name] = price
    if (
        priced
        and "price_cached" not in explicit
        and entry.get("cache_read_input_token_cost") is None
    ):
        changes["price_cached"] = changes.get("price_input", profile.price_input)
    if "reasoning" not in explicit and entry.get("supports_reasoning"):
        changes["reasoning"] = True
    return replace(profile, **changes)


def _streams_by_default(profile: ModelProfile) -> bool:
    """Anthropic and OpenAI's own endpoint stream well; a compatible server may not (some
    drop usage or tool calls from a stream), so it streams when its profile says so."""
    if profile.provider == "anthropic":
        return True
    base_url = profile.base_url or settings.OPENAI_BASE_URL
    return profile.provider == "openai" and base_url.startswith(OPENAI_HOSTED)


def _capabilities(profile: ModelProfile, spec: dict[str, Any]) -> ModelProfile:
    """What the profile states, else what the model's kind implies.

    OpenAI's reasoning models take ``max_completion_tokens`` and ``reasoning_effort``
    and refuse sampling parameters; other providers' reasoning is asked for only when
    the profile names an effort.
    """
    reasoning = bool(spec.get("reasoning", profile.reasoning))
    openai_reasoning = reasoning and profile.provider in OPENAI_PROVIDERS
    effort = str(spec.get("reasoning_effort") or ("medium" if openai_reasoning else ""))
    if effort and effort not in REASONING_EFFORTS:
        raise ProfileError(
            f"profile {profile.name!r}: reasoning_effort must be one of "
            f"{', '.join(REASONING_EFFORTS)}, not {effort!r}"
        )
    return replace(
        profile,
        reasoning=reasoning,
        reasoning_effort=effort if reasoning else "",
        tool_use=bool(spec.get("tool_use", True)),
        # Anthropic's extended thinking (what an effort turns on) refuses temperature too.
        sampling=bool(
            spec.get(
                "sampling", not (openai_reasoning or (effort and profile.provider == "anthropic"))
            )
        ),
        streaming=bool(spec.get("streaming", _streams_by_default(profile))),
        # Anthropic caches only what the request marks; the others cache on their own.
        prompt_caching=bool(spec.get("prompt_caching", profile.provider == "anthropic")),
    )


def _default_model(spec: dict[str, Any]) -> str:
    return settings.OPENAI_DEFAULT_MODEL if spec.get("provider", "openai") == "openai" else ""


def _default_prices(provider: str) -> tuple[Decimal, Decimal, Decimal]:
    if provider in FREE_PROVIDERS:
        return (Decimal(0), Decimal(0), Decimal(0))
    return DEFAULT_PRICES


def profile_build(name: str, spec: dict[str, Any]) -> ModelProfile:
    """A profile from its settings entry, completed from the catalogue."""
    prices = spec.get("prices_per_million") or {}
    explicit = {"reasoning"} & set(spec)
    provider = str(spec.get("provider", "openai"))
    if provider not in PROVIDERS:
        raise ProfileError(
            f"profile {name!r}: unknown provider {provider!r}; known: {', '.join(PROVIDERS)}"
        )
    default_input, default_output, default_cached = _default_prices(provider)
    fields: dict[str, Any] = {
        "name": name,
        "provider": provider,
        "price_input": default_input,
        "price_output": default_output,
        "price_cached": default_cached,
        "model": str(spec.get("model") or _default_model(spec)),
        "base_url": str(spec.get("base_url", "")),
        "api_key_env": str(spec.get("api_key_env", "")),
        "text_tool_calls": bool(spec.get("text_tool_calls", False)),
        "condense_summary": bool(spec.get("condense_summary", False)),
        "rpm": int(spec.get("rpm") or 0),
        "tpm": int(spec.get("tpm") or 0),
    }
    for key in ("context_window", "max_output_tokens"):
        if spec.get(key):
            fields[key] = int(spec[key])
            explicit.add(key)
    for field_name, key in (
        ("price_input", "input"),
        ("price_output", "output"),
        ("price_cached", "cached"),
    ):
        if prices.get(key) is not None:
            fields[field_name] = Decimal(str(prices[key]))
            explicit.add(field_name)
    if "price_input" in explicit and "price_cached" not in explicit:
        fields["price_cached"] = fields["price_input"]
    profile = ModelProfile(**fields)
    entry = catalogue_entry(profile.model) if profile.model else None
    if entry:
        profile = _with_catalogue(profile, entry, explicit)
    return _capabilities(profile, spec)


def profile_get(name: str) -> ModelProfile:
    """The profile called ``name``; ``kind:model`` is profile ``kind`` with another model."""
    profiles: dict[str, dict[str, Any]] = settings.MODEL_PROFILES
    if name in profiles:
        return profile_build(name, profiles[name])
    kind, sep, model = name.partition(":")
    if sep and kind in profiles and model:
        return profile_build(name, {**profiles[kind], "model": model})
    raise ProfileError(f"unknown model profile {name!r}; known: {', '.join(sorted(profiles))}")


def profile_name_for(task: Any) -> str:
    """Task, then repository, then workspace, then the installation's default."""
    options = task.model_options or {}
    return (
        options.get("profile")
        or options.get("provider")
        or getattr(task.repository, "model_profile", "")
        or getattr(task.workspace, "model_profile", "")
        or settings.AGENT_MODEL
    )


@functools.lru_cache(maxsize=64)
def _encoding_for(model: str) -> Any:
    # bpe-openai carries its vocabularies inside the package: nothing is downloaded at
    # run time. A dated name uses its family's tokenizer; a model outside OpenAI's
    # families is counted with o200k_base, the nearest widely used vocabulary.
    import bpe_openai

    for name in (model, DATE_SUFFIX.sub("", model)):
        try:
            return bpe_openai.get_encoding(bpe_openai.encoding_name_for_model(name))
        except (bpe_openai.UnsupportedModelError, ValueError, KeyError):
            continue
    return bpe_openai.get_encoding("o200k_base")


def tokens_estimate(payload: Any, *, model: str = "") -> int:
    """Tokens of ``payload`` by the model's tokenizer, for an endpoint that reports no usage.

    The payload is counted as the JSON the request carried, which adds a few tokens of
    punctuation per message: an estimate on the high side, flagged as one on the turn.
    """
    text = payload if isinstance(payload, str) else json.dumps(payload, default=str)
    return max(1, len(_encoding_for(model).encode(text)))
