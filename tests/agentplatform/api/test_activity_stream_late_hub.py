"""The staff activity stream when its Redis subscription comes up late.

A stream that gave up waiting for the subscription (a slow start of the process, the
first request after a restart) falls back to a frame every few seconds; once the
subscription is active it must follow announcements again, not keep re-reading pages on
a timer for as long as it stays open.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentplatform.api import stream

pytestmark = pytest.mark.slow


def test_a_stream_whose_subscription_came_up_late_stops_polling(monkeypatch: Any) -> None:
    async def scenario() -> list[tuple[float, str]]:
        hub = stream._resources().hub
        real_start = hub.start

        async def late_start(timeout: float = 2.0) -> bool:
            # The subscription is started, but this stream does not wait for it.
            asyncio.get_running_loop().create_task(real_start(timeout=10))
            return False

        monkeypatch.setattr(hub, "start", late_start)
        frames: list[tuple[float, str]] = []
        began = time.monotonic()

        async def follow() -> None:
            async for frame in stream.activity_stream(keepalive=0.3, min_interval=0):
                frames.append((time.monotonic() - began, frame))

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(follow(), timeout=4)
        assert hub._ready.is_set()
        return frames

    frames = asyncio.run(scenario())
    changed = [at for at, frame in frames if "event: changed" in frame]
    # Without the subscription a frame every 0.3 s; with it, at most the re-read the hub
    # makes as it subscribes.
    assert len(changed) <= 2, frames
    assert any(frame.startswith(": keep-alive") for _, frame in frames)
