"""Rows of hand-written statements become instances through the fields' database
converters: the same values the ORM reads from the same rows."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection

from agentplatform.api.auth import api_token_issue
from jobs import db_rows
from runs.models import ApiToken, Workspace
from tests.factories import UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


def _raw_row(model: type, pk: int) -> list:
    columns = ", ".join(connection.ops.quote_name(f.column) for f in model._meta.concrete_fields)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns} FROM {model._meta.db_table} WHERE id = %s",  # noqa: S608
            [pk],
        )
        return list(cursor.fetchone())


def test_rows_convert_as_the_orm_converts_them() -> None:
    workspace = WorkspaceFactory(daily_cost_budget_usd=Decimal("1.50"))
    token, _ = api_token_issue(user=UserFactory(), name="ci")
    for model, pk in ((ApiToken, token.pk), (Workspace, workspace.pk)):
        built = db_rows.instance_from_row(model, _raw_row(model, pk))
        loaded = model.objects.get(pk=pk)
        for field in model._meta.concrete_fields:
            assert getattr(built, field.attname) == getattr(loaded, field.attname), field.name
            assert type(getattr(built, field.attname)) is type(getattr(loaded, field.attname))
        assert built._state.db == "default" and not built._state.adding
