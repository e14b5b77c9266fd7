"""Strict request bodies: a field the endpoint does not know is an error, not a no-op.

A silently dropped field is a silent change of meaning: ``{"executionMode":
"supervised_pr"}`` must not run a task autonomously because the spelling was wrong.
Every write endpoint either validates its body with a ``StrictInput`` serializer or
calls ``body_refuse`` when it takes none; both answer 400 naming each unknown field.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

UNKNOWN_FIELD = "unknown field; this endpoint accepts: {accepted}"


def _unknown_field_errors(data: Mapping[str, Any], accepted: list[str]) -> dict[str, list[str]]:
    listed = ", ".join(sorted(accepted)) or "no fields"
    return {
        str(name): [UNKNOWN_FIELD.format(accepted=listed)]
        for name in sorted(set(data) - set(accepted), key=str)
    }


def _type_error(field: serializers.Field, value: Any) -> str | None:
    """What is wrong with the JSON type of ``value`` for ``field``, as the schema says.

    DRF coerces (``0`` becomes ``"0"``, ``"5"`` becomes ``5``, ``"yes"`` becomes True);
    the published schema promises exact JSON types, so the API holds to them.
    """
    if value is None:
        return None  # allow_null is the field's own business
    if isinstance(field, serializers.ListField):
        if not isinstance(value, list):
            return None  # DRF's own "expected a list" error
        for item in value:
            problem = _type_error(field.child, item)
            if problem:
                return f"items: {problem}"
        return None
    if isinstance(field, serializers.DictField):
        if not isinstance(value, dict):
            return None
        for item in value.values():
            problem = _type_error(field.child, item)
            if problem:
                return f"values: {problem}"
        return None
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else "must be a boolean"
    if isinstance(field, serializers.IntegerField | serializers.PrimaryKeyRelatedField):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else "must be an integer"
    if isinstance(field, serializers.FloatField):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else "must be a number"
    if isinstance(
        field,
        serializers.CharField
        | serializers.ChoiceField
        | serializers.SlugRelatedField
        | serializers.DecimalField,
    ):
        # Decimals travel as strings, exactly as the schema and the responses show them.
        return None if isinstance(value, str) else "must be a string"
    return None


class StrictInput(serializers.Serializer):
    """A serializer that refuses fields it does not declare (read-only ones included)
    and values whose JSON type is not the one its schema publishes."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            writable = {name: field for name, field in self.fields.items() if not field.read_only}
            errors = _unknown_field_errors(data, list(writable))
            for name, field in writable.items():
                if name in data:
                    problem = _type_error(field, data[name])
                    if problem:
                        errors[name] = [problem]
            if errors:
                raise ValidationError(errors)
        return super().to_internal_value(data)


_THREAD_FIELDS = threading.local()


# A ``StrictInput`` whose field instances are made once per thread, not per request.
# DRF deep-copies every declared field (nested serializers included) for each new
# serializer, so that an instance may change its own fields; this one never does. A
# thread validates one request at a time, so each thread keeps one set of fields and
# hands it to every new instance it makes, pointed at that instance: a field's
# ``context`` (the request, the caller) is always its current serializer's. Fields keep
# no state of their own between validations. (No docstring: the API schema describes
# a serializer by the nearest docstring, StrictInput's.)
class ThreadFieldsInput(StrictInput):
    @cached_property
    def fields(self) -> Any:
        made: dict[type, Any] | None = getattr(_THREAD_FIELDS, "made", None)
        if made is None:
            made = _THREAD_FIELDS.made = {}
        fields = made.get(type(self))
        if fields is None:
            fields = made[type(self)] = super().fields
        else:
            fields.serializer = self
            for field in fields.values():
                field.parent = self
        return fields


class StrictModelInput(StrictInput, serializers.ModelSerializer):
    """``StrictInput`` for model-backed input serializers."""


def body_refuse(request: Request) -> None:
    """For endpoints that take no body: any field sent is refused with 400."""
    data = request.data
    if isinstance(data, Mapping):
        errors = _unknown_field_errors(data, [])
        if errors:
            raise ValidationError(errors)
    elif data not in (None, b"", ""):
        raise ValidationError({"non_field_errors": ["this endpoint takes no request body"]})
