"""Exponential backoff with jitter, shared by every retry in the jobs app."""

from __future__ import annotations

import random


def backoff_delay(*, attempt: int, base: float, cap: float) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry).

    "Equal jitter": half the exponential delay is fixed, half random, so retries of many
    failed items spread out instead of hitting a recovering service at the same instant,
    while none retries sooner than half its nominal delay.
    """
    exponential = min(cap, base * (2 ** max(0, attempt - 1)))
    return exponential / 2 + random.uniform(0, exponential / 2)
