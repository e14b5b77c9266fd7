"""Query filters (django-filter), documented in the schema through the filterset."""

from __future__ import annotations

import django_filters
from django import forms
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from jobs.models import DeadLetter
from runs.models import Repository, Run, Task
from webhooks.models import WebhookReceipt


@extend_schema_field(OpenApiTypes.INT)
class IdFilter(django_filters.NumberFilter):
    """An integer id; a fractional or out-of-range number is a 400, not a query."""

    field_class = forms.IntegerField

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", 2**63 - 1)
        super().__init__(*args, **kwargs)


class TaskFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=Task.Status.choices)
    source = django_filters.ChoiceFilter(choices=Task.Source.choices)
    repository = IdFilter(field_name="repository_id")
    workspace = django_filters.CharFilter(field_name="workspace__slug")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Task
        fields = ["status", "source", "repository", "workspace", "created_after", "created_before"]


class RunFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=Run.Status.choices)
    task = django_filters.UUIDFilter(field_name="task_id")
    repository = IdFilter(field_name="task__repository_id")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Run
        fields = ["status", "task", "repository", "created_after", "created_before"]


class RepositoryFilter(django_filters.FilterSet):
    workspace = django_filters.CharFilter(field_name="workspace__slug")
    provider = django_filters.ChoiceFilter(choices=Repository.Provider.choices)

    class Meta:
        model = Repository
        fields = ["workspace", "provider"]


class DeadLetterFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=DeadLetter.Status.choices)
    task_name = django_filters.CharFilter()

    class Meta:
        model = DeadLetter
        fields = ["status", "task_name"]


class WebhookReceiptFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=WebhookReceipt.Status.choices)
    provider = django_filters.CharFilter()
    event = django_filters.CharFilter()

    class Meta:
        model = WebhookReceipt
        fields = ["status", "provider", "event"]
