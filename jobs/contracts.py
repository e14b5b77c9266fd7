"""Event contracts: the CloudEvents envelope (docs/design.md §5) and the catalogue of types.

The domain apps register their event types (``catalog_register``, from
``AppConfig.ready``); ``manage.py event_catalog`` writes ``docs/events/<type>/v1.json``
(JSON Schema 2020-12) and ``docs/asyncapi.yaml`` (AsyncAPI 3.0) from the catalogue, and
``--check`` fails when they differ, so the documents and the catalogue cannot drift.
Schemas require what producers always send and allow anything more
(``additionalProperties: true``): adding a field is compatible, removing or renaming
one needs a new version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = "v1"
SCHEMA_ID_BASE = "https://agentplatform.dev/events"
STREAM_CHANNEL = "agent.events.v1"

STR: dict[str, Any] = {"type": "string"}
INT: dict[str, Any] = {"type": "integer"}
NUM: dict[str, Any] = {"type": "number"}
BOOL: dict[str, Any] = {"type": "boolean"}
ID: dict[str, Any] = {"type": ["string", "integer"]}
NULLABLE_STR: dict[str, Any] = {"type": ["string", "null"]}
STR_LIST: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
ANY_LIST: dict[str, Any] = {"type": "array"}
OBJ: dict[str, Any] = {"type": "object"}
DECIMAL: dict[str, Any] = {
    "type": ["string", "number"],
    "description": "US dollars, a decimal string",
}

# Scopes: which envelope extensions an event always carries.
RUN = "run"  # a run's timeline: runid and a gap-free sequence
TASK = "task"  # about a task, possibly before any run exists
SYSTEM = "system"  # about the platform (dead-lettered jobs, intake)


@dataclass(frozen=True)
class EventType:
    type: str
    summary: str
    scope: str = RUN
    required: dict[str, dict[str, Any]] = field(default_factory=dict)
    optional: dict[str, dict[str, Any]] = field(default_factory=dict)


def event_type(
    type: str,
    summary: str,
    scope: str = RUN,
    *,
    required: dict | None = None,
    optional: dict | None = None,
) -> EventType:
    """An entry of a catalogue (``catalog_register``)."""
    return EventType(type, summary, scope, required or {}, optional or {})


# The registered catalogues (``catalog_register``), by type, in registration order; and
# the namespace prefix each type's AsyncAPI message name leaves out.
_catalog: dict[str, EventType] = {}
_namespaces: dict[str, str] = {}


def catalog_register(entries: list[EventType], *, namespace: str = "") -> None:
    """Add a domain's event types to the catalogue (from its ``AppConfig.ready``).

    Registering the same entry twice is harmless; two different entries of one type are
    a programming error.
    """
    for entry in entries:
        known = _catalog.get(entry.type)
        if known is not None and known != entry:
            raise ValueError(f"event type {entry.type} registered twice, differently")
        _catalog[entry.type] = entry
        _namespaces[entry.type] = namespace


def catalog() -> list[EventType]:
    """Every registered event type, in registration order."""
    return list(_catalog.values())


def catalog_entry(type: str) -> EventType | None:
    return _catalog.get(type)


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


def _message_name(type: str) -> str:
    return type.removeprefix(_namespaces.get(type, "")).replace(".", "_")


def asyncapi_document() -> dict[str, Any]:
    """AsyncAPI 3.0: the Redis Stream channel and one message per event type."""
    messages = {}
    for entry in catalog():
        messages[_message_name(entry.type)] = {
            "name": entry.type,
            "title": entry.type,
            "summary": entry.summary,
            "contentType": "application/cloudevents+json",
            "payload": {"$ref": f"./events/{entry.type}/{SCHEMA_VERSION}.json"},
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
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
        },
        "defaultContentType": "application/cloudevents+json",
        "servers": {
            "redis": {
                "host": "localhost:6379",
                "protocol": "redis",
                "description": "The Redis of EVENT_STREAM_REDIS_URL.",
            },
        },
        "channels": _asyncapi_channels(list(messages)),
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
        "components": {
            "messages": {
                **messages,
                "run_wakeup": {
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
                },
            },
        },
    }


def _asyncapi_channels(messages: list[str]) -> dict[str, Any]:
    """The AsyncAPI channels: the event stream, and the runs' live wake-ups."""
    return {
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
        "runWakeups": {
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
        },
    }
