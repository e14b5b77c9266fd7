"""Pagination: limit/offset for lists, a sequence cursor for a run's timeline."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import pagination
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    """DRF's, except that a malformed limit or offset is a 400, not silently ignored."""

    default_limit = 50
    max_limit = 200

    def get_limit(self, request: Request) -> int | None:
        value = SequenceCursorPagination._int_param(request, self.limit_query_param, -1)
        if value != -1:
            if value < 1:
                raise ValidationError({self.limit_query_param: ["must be at least 1"]})
            return min(value, self.max_limit)
        return self.default_limit

    def get_offset(self, request: Request) -> int:
        return SequenceCursorPagination._int_param(request, self.offset_query_param, 0)

    # Counting every row of a long list costs more than the page itself (a quarter of a
    # second over 100,000 runs): ``count`` is exact up to this many rows past the page,
    # and past that a lower bound, which still tells whether a next page exists.
    count_lookahead = 1000

    def get_count(self, queryset: Any) -> int:
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        offset = self.get_offset(self.request) if self.request is not None else 0
        bound = offset + (self.limit or 0) + self.count_lookahead
        return int(queryset[:bound].count())


class SequenceCursorPagination:
    """Events after a sequence number, in order; ``next`` carries the last one seen.

    A cursor by sequence (not by offset) stays correct while the run keeps appending
    events, and resumes exactly where a client stopped, like Last-Event-ID does.
    """

    default_limit = 100
    max_limit = 500

    def parse(self, request: Request) -> None:
        """Read ``after`` and ``limit`` (400 when malformed), for ``page_of`` to follow."""
        self.request = request
        self.after = self._int_param(request, "after", 0)
        self.limit = min(self._int_param(request, "limit", self.default_limit), self.max_limit)
        if self.limit < 1:
            raise ValidationError({"limit": ["must be at least 1"]})

    def page_of(self, rows: list[Any]) -> list[Any]:
        """The page from up to ``limit + 1`` rows after the cursor, read in order."""
        self.has_more = len(rows) > self.limit
        self.page = rows[: self.limit]
        return self.page

    @staticmethod
    def _int_param(request: Request, name: str, default: int) -> int:
        given = request.query_params.getlist(name)
        if len(given) > 1:
            raise ValidationError({name: ["given more than once"]})
        raw = given[0] if given else None
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ValidationError({name: ["must be an integer"]}) from None
        if value < 0 or value > 2**31 - 1:
            raise ValidationError({name: ["out of range"]})
        return value

    @staticmethod
    def _sequence_no(row: Any) -> int:
        """The sequence number of a row of the page: a model instance or a ``values()`` row."""
        return int(row["sequence_no"] if isinstance(row, dict) else row.sequence_no)

    def response(self, data: Any) -> Response:
        next_url = None
        last = self._sequence_no(self.page[-1]) if self.page else self.after
        if self.has_more:
            url = self.request.build_absolute_uri()
            next_url = replace_query_param(url, "after", last)
        return Response({"next": next_url, "last_sequence": last, "results": data})


def sequence_cursor_schema(item_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["next", "last_sequence", "results"],
        "properties": {
            "next": {"type": "string", "format": "uri", "nullable": True},
            "last_sequence": {"type": "integer"},
            "results": {"type": "array", "items": item_schema},
        },
    }
