"""The documents made from the event catalog (``jobs.contracts``): one JSON Schema per
event type (envelope + data) and the AsyncAPI 3.0 document of the stream.

``manage.py event_catalog`` writes them to ``docs/events/`` and ``docs/asyncapi.yaml``;
``--check`` fails when the files differ from what this module makes.
"""

from __future__ import annotations

from typing import Any

from jobs.contracts import (
    CATALOG,
    RUN,
    SCHEMA_ID_BASE,
    SCHEMA_VERSION,
    STREAM_CHANNEL,
    SYSTEM,
    TASK,
    EventType,
)

_ENVELOPE_PROPERTIES: dict[str, Any] = {
    "specversion": {"const": "1.0"},
    "id": {"type": "string", "minLength": 1},
    "source": {"type": "string", "minLength": 1, "format": "uri-reference"},
    "subject": {"type": "string", "minLength": 1},
    "time": {"type": "string", "format": "date-time"},
    "datacontenttype": {"const": "application/json"},
    "eventversion": {"type": "string", "description": "Major version of the data schema."},
    "workspaceid": {"type": "string"},
    "taskid": {"type": "string", "format": "uuid"},
    "runid": {
        "type": "string",
        "format": "uuid",
        "description": "Partition key: events of one run are ordered.",
    },
    "sequence": {
        "type": "integer",
        "minimum": 1,
        "description": "Gap-free position in the run's timeline.",
    },
    "correlationid": {"type": "string"},
    "causationid": {"type": "string"},
    "traceparent": {
        "type": "string",
        "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
    },
}
_BASE_REQUIRED = [
    "specversion",
    "id",
    "source",
    "type",
    "time",
    "datacontenttype",
    "data",
    "eventversion",
]
_SCOPE_REQUIRED = {
    SYSTEM: [],
    TASK: ["subject", "workspaceid", "taskid", "correlationid", "traceparent"],
    RUN: ["subject", "workspaceid", "taskid", "correlationid", "traceparent", "runid", "sequence"],
}


def schema_path(event_type: str) -> str:
    return f"docs/events/{event_type}/{SCHEMA_VERSION}.json"


def data_schema(entry: EventType) -> dict[str, Any]:
    return {
        "type": "object",
        "required": sorted(entry.required),
        "properties": {**entry.required, **entry.optional},
        "additionalProperties": True,
    }


def event_schema(entry: EventType) -> dict[str, Any]:
    """The JSON Schema of a whole event (envelope + data) of one type."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"{SCHEMA_ID_BASE}/{entry.type}/{SCHEMA_VERSION}.json",
        "title": entry.type,
        "description": entry.summary,
        "type": "object",
        "required": _BASE_REQUIRED + _SCOPE_REQUIRED[entry.scope],
        "properties": {
            **_ENVELOPE_PROPERTIES,
            "type": {"const": entry.type},
            "eventversion": {"const": SCHEMA_VERSION.lstrip("v")},
            "data": data_schema(entry),
        },
        "additionalProperties": True,
    }


def _message_name(event_type: str) -> str:
    return event_type.removeprefix("agent.").replace(".", "_")


# The parts of the AsyncAPI document that do not depend on the catalog.
ASYNCAPI_INFO: dict[str, Any] = {
    "title": "agentplatform events",
    "version": "1.0.0",
    "description": (
        "Facts recorded by agentplatform, published at least once by the outbox "
        "relay as CloudEvents 1.0 (structured JSON) with the extensions eventversion, "
        "workspaceid, taskid, runid, sequence, correlationid, causationid and "
        "traceparent. Events of one run are published in order (partition key: "
        "runid, or taskid before a run exists); consumers deduplicate by id, order "
        "by sequence and ignore fields they do not know."
    ),
}
ASYNCAPI_SERVERS: dict[str, Any] = {
    "redis": {
        "host": "localhost:6379",
        "protocol": "redis",
        "description": "The Redis of EVENT_STREAM_REDIS_URL.",
    },
}
RUN_WAKEUPS_CHANNEL: dict[str, Any] = {
    "address": "agent.run.{runId}",
    "title": "Live timeline wake-ups",
    "description": (
        "Redis pub/sub: a small JSON wake-up {run_id, sequence, id, type} when a "
        "run's event is recorded or published. Not the event itself: read the "
        "timeline from the API. Lost wake-ups cost latency, never data."
    ),
    "parameters": {"runId": {"description": "The run's id (UUID)."}},
    "servers": [{"$ref": "#/servers/redis"}],
    "messages": {"wakeup": {"$ref": "#/components/messages/run_wakeup"}},
}
RUN_WAKEUP_MESSAGE: dict[str, Any] = {
    "name": "run_wakeup",
    "contentType": "application/json",
    "payload": {
        "type": "object",
        "required": ["run_id", "sequence"],
        "properties": {
            "run_id": {"type": "string"},
            "sequence": {"type": ["integer", "null"]},
            "id": {"type": "string"},
            "type": {"type": "string"},
        },
    },
}


def asyncapi_document() -> dict[str, Any]:
    """AsyncAPI 3.0: the Redis Stream channel and one message per event type."""
    messages = {}
    for entry in CATALOG:
        messages[_message_name(entry.type)] = {
            "name": entry.type,
            "title": entry.type,
            "summary": entry.summary,
            "contentType": "application/cloudevents+json",
            "payload": {"$ref": f"./events/{entry.type}/{SCHEMA_VERSION}.json"},
        }
    return {
        "asyncapi": "3.0.0",
        "info": ASYNCAPI_INFO,
        "defaultContentType": "application/cloudevents+json",
        "servers": ASYNCAPI_SERVERS,
        "channels": {
            "events": {
                "address": STREAM_CHANNEL,
                "title": "The event stream",
                "description": (
                    "A Redis Stream (XADD with approximate MAXLEN = EVENT_STREAM_MAXLEN). "
                    "Each entry has the fields event (the CloudEvent as JSON), id, type "
                    "and partition. Read it with consumer groups (XREADGROUP)."
                ),
                "servers": [{"$ref": "#/servers/redis"}],
                "messages": {name: {"$ref": f"#/components/messages/{name}"} for name in messages},
            },
            "runWakeups": RUN_WAKEUPS_CHANNEL,
        },
        "operations": {
            "receiveEvents": {
                "action": "receive",
                "channel": {"$ref": "#/channels/events"},
                "summary": "Consume every event of the platform.",
                "messages": [{"$ref": f"#/channels/events/messages/{name}"} for name in messages],
            },
            "receiveRunWakeups": {
                "action": "receive",
                "channel": {"$ref": "#/channels/runWakeups"},
                "messages": [{"$ref": "#/channels/runWakeups/messages/wakeup"}],
            },
        },
        "components": {"messages": {**messages, "run_wakeup": RUN_WAKEUP_MESSAGE}},
    }
