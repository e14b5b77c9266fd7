"""JSON text for the hot paths that write it (a submission's rows, a broker message).

``dumps`` writes what ``json.dumps(value, default=str)`` would mean, several times
faster (orjson): datetimes, and anything else JSON has no type for, go through ``str``
exactly as they did; what orjson refuses (an integer beyond 64 bits, a key that is not a
string, a string that is not valid Unicode) is written by the standard library instead,
so that no value is written differently or refused where it was not before.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def dumps(value: Any) -> str:
    """``value`` as JSON text; values JSON has no type for as their ``str``."""
    try:
        return orjson.dumps(value, default=str, option=_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, default=str)
