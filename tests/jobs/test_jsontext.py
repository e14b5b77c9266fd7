"""The hot paths' JSON (orjson) means what ``json.dumps(value, default=str)`` meant: the
same values for the same input, and no new refusals."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from jobs import jsontext


@dataclass
class _Point:
    x: int


@pytest.mark.parametrize(
    "value",
    [
        {"a": [1, 2.5, None, True, "é\u2028"], "b": {"c": ""}},
        {"when": datetime(2026, 11, 28, 14, 5, 6, 789, tzinfo=UTC), "day": date(2026, 11, 28)},
        {"id": uuid.UUID("01a2228f-5c1f-771d-8201-6b5feea95be0"), "cost": Decimal("0.100000")},
        {"point": _Point(3)},
        {"big": 2**70, "negative": -(2**65)},  # beyond 64 bits: orjson refuses
        {1: "an integer key"},  # orjson refuses a key that is not a string
        {"control": "a\x00b\x1f"},
    ],
)
def test_the_text_means_what_the_standard_library_wrote(value) -> None:
    written = jsontext.dumps(value)
    assert isinstance(written, str)
    assert json.loads(written) == json.loads(json.dumps(value, default=str))


def test_a_string_that_is_not_unicode_is_written_as_before() -> None:
    value = {"lone": "\ud800"}
    assert jsontext.dumps(value) == json.dumps(value, default=str)
