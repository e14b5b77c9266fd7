"""Pagination: limit/offset for lists, a sequence cursor for a run's timeline."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import QuerySet
from django.db.models.query import ValuesIterable
from django.utils import timezone
from rest_framework import pagination
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from agentplatform.api.renderers import JSONFragment
from agentplatform.api.rows import ListRows
from jobs.db_rows import cursor_prepared, fetchone_prepared


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

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        """DRF's, with the same two statements (the bounded count, then the page), but a
        ``values()`` queryset is compiled once for both: compiling the list query twice
        (once inside the count's subquery) cost a fifth of a list page's CPU."""
        if not _compiles_once(queryset):
            return super().paginate_queryset(queryset, request, view)
        self.request = request
        self.limit = self.get_limit(request)
        self.offset = self.get_offset(request)
        bound = self.offset + (self.limit or 0) + self.count_lookahead
        compiler = queryset.query.get_compiler(queryset.db)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:  # e.g. no workspaces: as the ORM, no query and no rows
            self.count = 0
            return []
        connection = connections[queryset.db]
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT COUNT(*) FROM ({sql} {connection.ops.limit_offset_sql(0, bound)})"  # noqa: S608 - compiled by the ORM
                " subquery",
                params,
            )
            self.count = int(cursor.fetchone()[0])
            if self.count > (self.limit or 0) and self.template is not None:
                self.display_page_controls = True
            if self.count == 0 or self.offset > self.count:
                return []
            page = connection.ops.limit_offset_sql(self.offset, self.offset + (self.limit or 0))
            cursor.execute(f"{sql} {page}", params)
            rows = cursor.fetchall()
        # Named and converted as ValuesIterable does.
        names = _value_names(queryset.query)
        return [dict(zip(names, row, strict=True)) for row in compiler.results_iter([rows])]

    def paginate_compiled(
        self, compile_for: Callable[[int], CompiledList], scope: list[Any], request: Request
    ) -> list[dict[str, Any]] | JSONFragment:
        """``paginate_queryset`` for a list compiled once for the number of values of its
        scope (``compile_for``, cached by the caller) and those values: the same bounded
        count and page, as prepared statements. The page comes rendered: as JSON text made
        by PostgreSQL when the list has a JSON form (``CompiledList.json_sql``) and
        the current zone is UTC (the count and that page in one statement), else by the
        list's ``ListRows``."""
        self.request = request
        self.limit = self.get_limit(request)
        self.offset = self.get_offset(request)
        if not scope:  # as the ORM for an empty IN: no query, no rows
            self.count = 0
            return []
        compiled = compile_for(len(scope))
        limit = self.limit or 0
        bound = self.offset + limit + self.count_lookahead
        if compiled.json_sql is not None and _in_utc():
            row = fetchone_prepared(
                compiled.json_sql,
                [*scope, bound, *scope, limit, self.offset],
                generic_plan=compiled.generic_plan,
            )
            assert row is not None  # one row: the count and the page
            self.count, text = row
            self._page_controls()
            return JSONFragment(f"[{text}]") if text is not None else []
        with cursor_prepared() as cursor:
            cursor.execute(compiled.count_sql, [*scope, bound])
            self.count = int(cursor.fetchone()[0])
            self._page_controls()
            if self.count == 0 or self.offset > self.count:
                return []
            cursor.execute(compiled.page_sql, [*scope, limit, self.offset])
            rows = cursor.fetchall()
        names = compiled.names
        return compiled.rows.render(
            dict(zip(names, row, strict=True)) for row in compiled.compiler.results_iter([rows])
        )

    def _page_controls(self) -> None:
        if (self.count or 0) > (self.limit or 0) and self.template is not None:
            self.display_page_controls = True


@dataclass(frozen=True)
class CompiledList:
    """A list's query compiled once for a number of scope values (its ``IN`` list): the
    page (``LIMIT``, ``OFFSET``) and the bounded count as fixed statements that take the
    scope's values, then their bounds, as parameters; the compiler converts the rows and
    ``rows`` renders them.

    Compiling the runs list (22 columns, a join, its order) and building its filter took a
    fifth of a page's CPU on every request, and PostgreSQL planned the page longer than
    it ran it; compiled once, both statements are prepared (``cursor_prepared``).

    ``json_sql`` answers the bounded count and the page's rows as JSON (the elements of the
    array, in the list's order) in one statement, the JSON made by PostgreSQL
    (``ListRows.json_sql``): converting the rows, rendering their fields and encoding
    them took a third of a page's CPU in Python. None when a field has no JSON form in
    SQL.

    ``generic_plan``: the statements' best plan is the same whatever the scope's values
    (as for one workspace, a range of an index in the list's order), so they run on
    their generic plan (``fetchone_prepared``) instead of being planned for each request.
    """

    page_sql: str
    count_sql: str
    json_sql: str | None
    compiler: Any
    names: list[str]
    rows: ListRows
    generic_plan: bool = False

    @classmethod
    def of(
        cls,
        rows: QuerySet[Any, Any],
        keys: QuerySet[Any, Any],
        scope: list[Any],
        rendered_by: ListRows,
        *,
        generic_plan: bool = False,
    ) -> CompiledList:
        """``rows``: the list's ``values()`` query of ``rendered_by``'s columns, filtered
        by ``scope`` (stand-in values, all different); ``keys``: the same filter, one
        column (what the count counts, without the list's joins), in whatever order
        reads the fewest pages: the count stops at its bound whichever rows it met."""
        compiler = rows.query.get_compiler(rows.db)
        sql, params = compiler.as_sql()
        count_sql, count_params = keys.query.get_compiler(keys.db).as_sql()
        if list(params) != scope or list(count_params) != scope:
            raise ValueError("a compiled list takes its scope's values as its only parameters")
        names = _value_names(rows.query)
        page_sql = f"{sql} LIMIT %s OFFSET %s"
        count_sql = f"SELECT COUNT(*) FROM ({count_sql} LIMIT %s) subquery"  # noqa: S608 - compiled by the ORM
        json_page = _json_page_sql(page_sql, names, rows.query.order_by, rendered_by)
        return cls(
            page_sql=page_sql,
            count_sql=count_sql,
            json_sql=None if json_page is None else f"SELECT ({count_sql}), ({json_page})",
            compiler=compiler,
            names=names,
            rows=rendered_by,
            generic_plan=generic_plan,
        )


def _json_page_sql(
    page_sql: str, names: list[str], order_by: Sequence[Any], rendered_by: ListRows
) -> str | None:
    """The page's rows as the elements of a JSON array, in the list's order: the page as
    a subquery whose columns are renamed by position, each row's fields made by
    ``rendered_by.json_sql`` and written by ``row_to_json``, joined in the list's order."""
    alias = {name: f"p.c{i}" for i, name in enumerate(names)}
    if any(column not in alias for column in rendered_by.columns):
        return None
    fields = rendered_by.json_sql([alias[column] for column in rendered_by.columns])
    if fields is None:
        return None
    order = []
    for term in order_by:
        name = term.removeprefix("-") if isinstance(term, str) else None
        if name not in alias:
            return None
        order.append(f"{alias[name]} DESC" if term.startswith("-") else alias[name])
    if not order:
        return None
    columns = ", ".join(f"c{i}" for i in range(len(names)))
    return (
        f"SELECT string_agg(row_to_json(r)::text, ',' ORDER BY {', '.join(order)})"  # noqa: S608 - compiled by the ORM
        f" FROM ({page_sql}) AS p({columns}), LATERAL (SELECT {fields}) AS r"
    )


def _in_utc() -> bool:
    """Whether date-times render in UTC now (what a list's JSON form assumes)."""
    return settings.USE_TZ and timezone.get_current_timezone_name() in ("UTC", "Etc/UTC")


def _value_names(query: Any) -> list[str]:
    """The keys of a ``values()`` query's rows, as ValuesIterable names them."""
    if query.selected:
        return list(query.selected)
    return [*query.extra_select, *query.values_select, *query.annotation_select]


def _compiles_once(queryset: Any) -> bool:
    """A plain ``values()`` queryset: its compiled SQL can take a LIMIT and be wrapped."""
    if not isinstance(queryset, QuerySet) or queryset._iterable_class is not ValuesIterable:
        return False
    query = queryset.query
    return not (query.is_sliced or query.combinator)


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

    def response(self, data: list[Any]) -> Response:
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
