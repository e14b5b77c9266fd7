"""List rows render date-times exactly as the serializer's field does: in the current
time zone, ``Z`` for UTC, microseconds kept, and null as null."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from agentplatform.api.views.runs import _RUN_ROWS, RunOutputSerializer


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "America/St_Johns"])
def test_date_times_render_as_the_serializer_field_renders_them(zone) -> None:
    field = RunOutputSerializer().fields["created_at"]
    values = [
        datetime.datetime(2026, 3, 29, 0, 59, 59, 123456, tzinfo=datetime.UTC),
        datetime.datetime(2026, 7, 1, 12, 0, tzinfo=datetime.UTC),
        datetime.datetime(2026, 7, 1, 12, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=5))),
        datetime.datetime(2026, 7, 1, 12, 0),  # naive: the field's own handling
    ]
    rows = [{column: None for column in _RUN_ROWS.columns} for _ in values]
    for row, value in zip(rows, values, strict=True):
        row["created_at"] = value
    with timezone.override(zone):
        rendered = [row["created_at"] for row in _RUN_ROWS.render(rows)]
        expected = [field.to_representation(value) for value in values]
        assert _RUN_ROWS.render([rows[0] | {"started_at": None}])[0]["started_at"] is None
    assert rendered == expected
    assert "created_at" in _RUN_ROWS._datetimes
