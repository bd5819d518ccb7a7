"""The post path's reads, their SQL compiled once
(docs/benchmarks/2026-12-05.md#b-post-reads-compiled).

Django compiles a queryset's SQL and resolves its columns every time it runs, in Python
that costs many times what the statement itself takes. A
`Prepared` read is a queryset compiled once per database connection, with stand-in
parameters; each run executes that SQL with the real ones, and Django's own compiler
turns the rows into what the queryset would give (the backend's converters, the model
instances and their `select_related` ones, or `values_list` tuples). So a read is the
queryset it is written as, and tests/test_prepared.py checks that both give the same.

Only for the reads that run on every post, and the writes that end every reply
(`PreparedUpdate`, docs/benchmarks/2026-12-05.md#b-end-writes-compiled); anything
else goes through the ORM.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import QuerySet
from django.db.models.query import get_related_populators  # type: ignore[attr-defined]  # not in the stubs
from django.db.models.sql import UpdateQuery
from django.db.models.sql.compiler import SQLCompiler

T = TypeVar("T")

# Stand-in parameters, so that each one's place in the compiled SQL's parameters is found
# (and a query whose parameters are not its arguments, once each, is refused). In a 32-bit
# integer column's range (Django drops a lookup outside it from the SQL: an argument
# compared with a small-integer column is refused, PreparedUpdate), and unlike any value a
# query of this module holds itself.
_STANDINS = (1_999_999_901, 1_999_999_902, 1_999_999_903, 1_999_999_904)


class _Compiled:
    __slots__ = ("compiler", "fixed", "names", "places", "populators", "span", "sql")

    def __init__(self, compiler: SQLCompiler, sql: str, places: list[int | None], fixed: tuple[Any, ...]) -> None:
        self.compiler = compiler
        self.sql = sql
        self.places = places  # per parameter of the SQL: which argument it is (None: fixed)
        self.fixed = fixed
        # For model rows (not values_list): the model's columns in a row, their names, and
        # what fills the select_related instances; the same for every run.
        klass_info = compiler.klass_info
        self.span = (0, 0)
        self.names: list[str] = []
        self.populators: list[Any] = []
        if klass_info is not None:
            select = compiler.select
            start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
            self.span = (start, end)
            self.names = [f[0].target.attname for f in select[start:end]]
            self.populators = get_related_populators(klass_info, select, DEFAULT_DB_ALIAS)


class Prepared(Generic[T]):
    """`make(*args)` -> the queryset; `Prepared(make).rows(*args)` its model instances, or
    `.values(*args)` its values_list rows, from SQL compiled once per thread. The
    arguments are integers (ids, seqs), as the stand-ins are."""

    def __init__(self, make: Callable[..., QuerySet[Any, T]], arity: int) -> None:
        assert arity <= len(_STANDINS)
        self._make = make
        self._arity = arity
        # Per thread, as Django's connections are: a compiler holds its thread's connection,
        # and both go with the thread.
        self._local = threading.local()

    def _compile(self) -> tuple[Any, _Compiled]:
        connection = connections[DEFAULT_DB_ALIAS]
        compiled: _Compiled | None = getattr(self._local, "compiled", None)
        if compiled is None or compiled.compiler.connection is not connection:
            standins = _STANDINS[: self._arity]
            compiler = self._make(*standins).query.get_compiler(using=DEFAULT_DB_ALIAS)
            sql, params = compiler.as_sql()  # also fills compiler.select and klass_info
            places = [standins.index(p) if p in standins else None for p in params]
            if sorted(p for p in places if p is not None) != list(range(self._arity)):
                raise ValueError(f"each argument must be a parameter of the query once: {params!r}")
            compiled = self._local.compiled = _Compiled(compiler, sql, places, tuple(params))
        return connection, compiled

    def _fetch(self, args: tuple[int, ...]) -> tuple[_Compiled, list[Any]]:
        if len(args) != self._arity:
            raise TypeError(f"{self._arity} arguments, not {len(args)}")
        connection, compiled = self._compile()
        values = [int(a) for a in args]  # as the ORM would take them (an id as a string, say)
        params = [
            values[i] if i is not None else fixed for i, fixed in zip(compiled.places, compiled.fixed, strict=True)
        ]
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        return compiled, list(compiled.compiler.results_iter([rows]))

    def rows(self, *args: int) -> list[T]:
        """The model instances the queryset gives, with their select_related ones."""
        compiled, rows = self._fetch(args)
        klass_info = compiled.compiler.klass_info
        assert klass_info is not None, "a values() queryset: use .values()"
        model = klass_info["model"]
        (start, end), names = compiled.span, compiled.names
        out = []
        for row in rows:
            obj = model.from_db(DEFAULT_DB_ALIAS, names, row[start:end])
            for populator in compiled.populators:
                populator.populate(row, obj)
            out.append(obj)
        return out

    def values(self, *args: int) -> list[tuple[Any, ...]]:
        """The rows of a values_list() queryset, as tuples."""
        _compiled, rows = self._fetch(args)
        return [tuple(row) for row in rows]


class PreparedUpdate:
    """`make(*args)` -> a queryset; `PreparedUpdate(make, arity).run(values, *args)` is
    `make(*args).update(**values)`, the number of rows it changed, from SQL compiled once
    per thread and shape of `values` (its fields, and which are None: Django writes
    `col = NULL` for those). Each value is prepared for its column as `update` prepares
    it (`get_db_prep_save`); plain values only, not expressions or model instances, and
    a queryset that `update()` takes (no slice, no union)."""

    def __init__(self, make: Callable[..., QuerySet[Any, Any]], arity: int) -> None:
        assert arity <= len(_STANDINS)
        self._make = make
        self._arity = arity
        queryset = make(*_STANDINS[:arity])
        if queryset.query.is_sliced or queryset.query.combinator:  # update() refuses them; here they would be dropped
            raise ValueError("update() takes no sliced or combined queryset")
        self._meta = queryset.model._meta
        self._local = threading.local()  # per thread, as Prepared's

    def run(self, values: dict[str, Any], *args: int) -> int:
        if len(args) != self._arity:
            raise TypeError(f"{self._arity} arguments, not {len(args)}")
        if not values:
            raise ValueError("nothing to update")
        connection = connections[DEFAULT_DB_ALIAS]
        cache: dict[Any, tuple[str, list[int | None], tuple[Any, ...]]] | None = getattr(self._local, "compiled", None)
        if cache is None or getattr(self._local, "connection", None) is not connection:
            cache = self._local.compiled = {}
            self._local.connection = connection
        get_field = self._meta.get_field
        prepped = [get_field(name).get_db_prep_save(value, connection=connection) for name, value in values.items()]
        shape = (tuple(values), tuple(v is None for v in prepped))
        compiled = cache.get(shape)
        if compiled is None:
            compiled = cache[shape] = self._compile(values, prepped)
        sql, places, fixed = compiled
        numbers = [int(a) for a in args]  # as the ORM would take them
        params = [v for v in prepped if v is not None]
        params += [numbers[i] if i is not None else f for i, f in zip(places, fixed, strict=True)]
        with transaction.mark_for_rollback_on_error(DEFAULT_DB_ALIAS), connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)

    def _compile(self, values: dict[str, Any], prepped: list[Any]) -> tuple[str, list[int | None], tuple[Any, ...]]:
        standins = _STANDINS[: self._arity]
        query = cast(UpdateQuery, self._make(*standins).query.chain(UpdateQuery))
        query.add_update_values(values)
        try:
            sql, params = query.get_compiler(using=DEFAULT_DB_ALIAS).as_sql()
        except EmptyResultSet as exc:  # none(), pk__in=[], or a stand-in out of a column's range
            raise ValueError("a query that can match no row is not compiled") from exc
        if query.related_updates or any(hasattr(field, "get_placeholder") for field, _m, _v in query.values):
            raise ValueError("only a model's own columns, with plain placeholders")
        given = [v for v in prepped if v is not None]
        # The values come first, as prepared here (by type: an adapter such as psycopg's
        # Jsonb has no equality).
        if [type(p) for p in params[: len(given)]] != [type(v) for v in given]:
            raise ValueError(f"the update's parameters are not its values: {params!r}")
        where = params[len(given) :]
        places = [standins.index(p) if p in standins else None for p in where]
        if sorted(p for p in places if p is not None) != list(range(self._arity)):
            raise ValueError(f"each argument must be a parameter of the query once: {where!r}")
        return sql, places, tuple(where)
