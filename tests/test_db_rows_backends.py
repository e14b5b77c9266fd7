"""Rows of hand-written statements become instances through each backend's converters:
on SQLite (the embedded mode) too, where the converters read the column's output field."""

from __future__ import annotations

import datetime
from decimal import Decimal

from django.db import connections
from django.db.backends.sqlite3.base import DatabaseWrapper

from jobs import db_rows
from runs.models import ApiToken, Workspace


def test_sqlite_rows_convert_as_the_orm_converts_them(monkeypatch) -> None:
    sqlite = DatabaseWrapper(
        {
            **connections["default"].settings_dict,
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": ":memory:",
        },
        alias="sqlite_probe",
    )
    monkeypatch.setattr(db_rows, "connection", sqlite)
    monkeypatch.setattr(db_rows, "_ROW_READERS", {})
    row = {f.attname: None for f in ApiToken._meta.concrete_fields}
    row.update(id=1, user_id=2, name="ci", prefix="agp_x", key_hash="h")
    row["created_at"] = "2026-11-23 01:00:00.250000"
    token = db_rows.instance_from_row(ApiToken, list(row.values()))
    assert token.created_at == datetime.datetime(2026, 11, 23, 1, 0, 0, 250000, tzinfo=datetime.UTC)
    assert token.revoked_at is None
    workspace = {f.attname: None for f in Workspace._meta.concrete_fields}
    decimals = [
        f.attname
        for f in Workspace._meta.concrete_fields
        if f.get_internal_type() == "DecimalField"
    ]
    for name in decimals:
        workspace[name] = 1.5  # SQLite returns a decimal column as a float
    built = db_rows.instance_from_row(Workspace, list(workspace.values()))
    assert all(getattr(built, name) == Decimal("1.5") for name in decimals)
