"""A worker process for tests/runs/test_shared_rate_limits.py: ``n`` model calls to a
profile with a shared ``rpm``; prints how many answered and how many waits it reported."""

from __future__ import annotations

import json
import sys

import django

django.setup()

from runs.agent.profiles import profile_build  # noqa: E402
from runs.providers.base import ProviderObserver  # noqa: E402
from runs.providers.llm import LiteLLMProvider  # noqa: E402


def main(name: str, base_url: str, calls: int, rpm: int) -> None:
    profile = profile_build(
        name, {"provider": "openai", "model": "gpt-4o", "base_url": base_url, "rpm": rpm}
    )
    waits: list[object] = []
    provider = LiteLLMProvider(profile, observer=ProviderObserver(rate_wait=waits.append))
    answered = 0
    for i in range(calls):
        reply = provider.complete(
            messages=[{"role": "user", "content": f"call {i}"}],
            tools=[],
            purpose="plan",
            turn_index=i,
        )
        answered += bool(reply.content)
    print(json.dumps({"answered": answered, "waits": len(waits)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
