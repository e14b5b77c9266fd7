"""Reading what a model sent back: tool call arguments, and tool calls written as text."""

from __future__ import annotations

import json
import re
from typing import Any

from runs.providers.base import ToolCallRequest

TEXT_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def arguments_read(raw: Any) -> tuple[dict[str, Any], str]:
    """Tool call arguments as an object, or an error saying why they are not one."""
    if isinstance(raw, dict):
        return raw, ""
    if raw is None or raw == "":
        return {}, ""
    if not isinstance(raw, str):
        return {}, f"arguments must be a JSON object, got {type(raw).__name__}"
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"arguments are not valid JSON ({exc.msg} at character {exc.pos})"
    if not isinstance(parsed, dict):
        return {}, f"arguments must be a JSON object, got {type(parsed).__name__}"
    return parsed, ""


def text_tool_calls_parse(content: str, turn_tag: str) -> tuple[str, list[ToolCallRequest]]:
    """Tool calls written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Hermes- and Qwen-style chat templates emit calls this way when a server does not
    turn them into protocol tool calls. Returns the text without the blocks.
    """
    calls: list[ToolCallRequest] = []
    for position, match in enumerate(TEXT_TOOL_CALL.finditer(content)):
        block = match.group(1)
        call_id = f"text-{turn_tag}-{position}"
        try:
            parsed = json.loads(block)
        except json.JSONDecodeError as exc:
            calls.append(
                ToolCallRequest(
                    id=call_id,
                    name="",
                    arguments={},
                    error=f"<tool_call> block is not valid JSON ({exc.msg})",
                    raw_arguments=block[:2000],
                )
            )
            continue
        if not isinstance(parsed, dict):
            parsed = {}
        arguments, error = arguments_read(parsed.get("arguments", parsed.get("parameters")))
        calls.append(
            ToolCallRequest(
                id=call_id,
                name=str(parsed.get("name", "")),
                arguments=arguments,
                error=error,
                raw_arguments=json.dumps(parsed.get("arguments"))[:2000] if error else "",
            )
        )
    return TEXT_TOOL_CALL.sub("", content).strip(), calls
