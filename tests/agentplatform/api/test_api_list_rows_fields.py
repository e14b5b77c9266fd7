"""List rows render each column as the serializer's field does, where a builtin (int, str)
stands in for the field's own ``to_representation``."""

from __future__ import annotations

import uuid

import pytest
from rest_framework import serializers

from agentplatform.api.rows import ListRows, _builtin_render
from agentplatform.api.views.runs import _EVENT_ROWS, _RUN_ROWS
from agentplatform.api.views.tasks import _TASK_ROWS
from runs.models import Run, Task
from tests.factories import TaskFactory, member_with_repository

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("rows", [_RUN_ROWS, _TASK_ROWS, _EVENT_ROWS], ids=["run", "task", "event"])
def test_every_field_renders_its_columns_values_as_the_field_does(rows: ListRows) -> None:
    _, workspace, repository = member_with_repository()
    task = TaskFactory(workspace=workspace, repository=repository)
    run = Run.objects.create(task=task, run_no=1, status=Run.Status.RUNNING, tokens_in=7)
    model = {id(_RUN_ROWS): Run, id(_TASK_ROWS): Task}.get(id(rows))
    values = (
        model.objects.filter(pk=(run if model is Run else task).pk).values(*rows.columns).get()
        if model is not None
        else {"id": uuid.uuid4(), "sequence_no": 3, "type": "t", "data": {}, "actor": "a"}
    )
    fields = rows.serializer_class().fields
    for name, column, _ in rows.fields:
        field = fields[name]
        if isinstance(field, serializers.RelatedField) or column not in values:
            continue
        value = values[column]
        if value is None:
            continue
        assert _builtin_render(field)(value) == field.to_representation(value), name


def test_choices_keep_their_own_rendering_unless_every_key_is_a_string() -> None:
    by_name = serializers.ChoiceField(choices=[("queued", "Queued")])
    by_number = serializers.ChoiceField(choices=[(1, "one")])
    assert _builtin_render(by_name) is str
    assert _builtin_render(by_name)("elsewhere") == by_name.to_representation("elsewhere")
    assert _builtin_render(by_number) == by_number.to_representation
    hex_uuid = serializers.UUIDField(format="hex")
    assert _builtin_render(hex_uuid) == hex_uuid.to_representation
