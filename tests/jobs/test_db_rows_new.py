"""``instance_new`` builds the instance the keyword constructor builds: every field its
value or default, its related instances cached (no query to read them back)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.db_rows import instance_new
from runs.models import Repository, Run, Task, Workspace

pytestmark = pytest.mark.django_db

# Defaults that differ between two constructions by design: fresh ids, a fresh trace
# outside any request.
_FRESH = {"id", "traceparent"}


def _fields(instance) -> dict:
    return {
        f.attname: getattr(instance, f.attname)
        for f in type(instance)._meta.concrete_fields
        if f.attname not in _FRESH
    }


def test_new_instances_match_the_keyword_constructor() -> None:
    workspace = Workspace.objects.create(slug="new-rows", name="new rows")
    repository = Repository.objects.create(
        workspace=workspace, name="r", clone_url="https://example.invalid/r.git"
    )
    given = {"instruction": "Fix it", "priority": 5, "budget": {"max_steps": 3}}
    task = instance_new(Task, {"workspace": workspace, "repository": repository}, **given)
    keyword = Task(workspace=workspace, repository=repository, **given)
    assert _fields(task) == _fields(keyword)
    assert task.id is not None and task.id != keyword.id
    assert task._state.adding
    run = instance_new(Run, {"task": task}, run_no=2, workspace_id=workspace.pk)
    assert _fields(run) == _fields(Run(task=task, run_no=2, workspace_id=workspace.pk))
    # A mutable default is a fresh one per instance, as the constructor's.
    assert instance_new(Task, budget={}).budget is not instance_new(Task).budget
    with CaptureQueriesContext(connection) as queries:
        assert run.task is task
        assert task.workspace is workspace and task.repository is repository
    assert len(queries) == 0


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(TypeError, match="no concrete fields \\['repository'\\]"):
        instance_new(Task, repository=1)
