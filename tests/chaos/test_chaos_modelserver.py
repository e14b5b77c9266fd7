"""The chaos harness's model endpoint: the scripted agent over Chat Completions, asked
through the platform's openai provider, logging each request's turn key."""

from __future__ import annotations

from itertools import pairwise

import pytest

from runs.agent.profiles import profile_build
from runs.agent.tools import TOOL_SCHEMAS
from runs.providers import provider_for_profile
from tests.chaos.modelserver import PROFILE, ScriptedModelServer
from tests.chaos.stack import short_fix_script

pytestmark = pytest.mark.no_services


@pytest.fixture
def server():
    server = ScriptedModelServer(short_fix_script())
    yield server
    server.close()


def test_the_script_is_played_turn_by_turn_and_every_request_logged_with_its_key(server):
    profile = profile_build(PROFILE, server.profile())
    messages = [{"role": "system", "content": "Fix add()."}]

    plan = provider_for_profile(profile, turn_key="r1:1:0").complete(
        messages=messages, tools=[], purpose="plan", turn_index=0
    )
    messages.append({"role": "assistant", "content": plan.content})
    names = []
    for turn in range(4):
        reply = provider_for_profile(profile, turn_key=f"r1:2:{turn}").complete(
            messages=messages, tools=TOOL_SCHEMAS, purpose="act", turn_index=turn
        )
        names.append([c.name for c in reply.tool_calls])
        messages.append(
            {
                "role": "assistant",
                "content": reply.content,
                "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name}}
                    for c in reply.tool_calls
                ],
            }
        )
        messages += [
            {"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in reply.tool_calls
        ]

    assert plan.content == short_fix_script()["plan"]
    # The script's three turns, then the model finishes.
    assert names == [["replace_text"], ["run_command"], ["finish"], ["finish"]]
    assert reply.usage.tokens_in > 0 and not reply.usage.estimated
    logged = server.requests()
    assert [(r.key, r.position) for r in logged] == [
        ("r1:1:0", "plan"),
        ("r1:2:0", "act-0"),
        ("r1:2:1", "act-1"),
        ("r1:2:2", "act-2"),
        ("r1:2:3", "act-3"),
    ]
    assert all(a.at <= b.at for a, b in pairwise(logged))


def _reset_mid_request(port: int) -> None:
    """A client killed in the middle of sending its request: the peer sees a reset."""
    import socket
    import struct

    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_a_client_killed_mid_request_prints_no_traceback_but_other_errors_do(server, capfd):
    import time

    _reset_mid_request(server.port)
    time.sleep(0.3)
    assert "Traceback" not in capfd.readouterr().err

    try:
        raise ValueError("a handler bug")
    except ValueError:
        server.httpd.handle_error(None, ("127.0.0.1", 1))
    assert "ValueError: a handler bug" in capfd.readouterr().err
