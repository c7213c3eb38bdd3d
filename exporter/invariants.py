"""The invariant SQL: the one place that says how a double-sell shows in the shop's tables.

Four invariants, checked by the sidecar's probes and ``stocksentry reconcile`` with the
statements built here from the config's ``schema``: **negative stock**; **oversold** (paid
units beyond a SKU's allocation); **duplicate orders per key** (external reference or
idempotency key); **paid without items**. Each has one *rows* statement (what reconcile
prints), and the probes' figures aggregate exactly those rows, so the two never disagree.

A :class:`Query` is SQL text in parts plus parameters, no driver needed. Identifiers reach
SQL only through :func:`quote` (validated plain names), values only as parameters; a
``constant`` :class:`Param` comes from the config and may be inlined (a partial index whose
predicate lists the same values stays usable).

Example::

    >>> from stocksentry.exporter.config import SchemaConfig
    >>> sql = InvariantSql(SchemaConfig())
    >>> query = sql.negative_stock()
    >>> query.text().split(" WHERE ")  # doctest: +NORMALIZE_WHITESPACE
    ['SELECT p."sku" AS sku, p."available_stock" AS stock FROM "products" AS p',
     'p."available_stock" < 0 ORDER BY p."available_stock", p."sku"']
    >>> query.columns
    ('sku', 'stock')
    >>> sql.negative_stock(skus=["EGG-01"]).params
    {'sku0': 'EGG-01'}
"""

# ruff: noqa: S608 - this module builds SQL text: identifiers only through quote(), values
# only as parameters.

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from .config import SchemaConfig

#: The invariants, in the order they are reported.
INVARIANTS: Final = ("negative_stock", "oversold", "duplicate_keys", "paid_without_items")
#: ``named``: ``:name`` (SQLAlchemy ``text()``); ``pyformat``: ``%(name)s`` (psycopg).
ParamStyle = Literal["named", "pyformat"]


def quote(identifier: str, dialect: str = "postgresql") -> str:
    """A validated, possibly schema-qualified name as a quoted SQL identifier: backticks
    on MySQL and MariaDB, double quotes elsewhere; a quote inside a part is doubled.

    Example::

        >>> quote("shop.products")
        '"shop"."products"'
        >>> quote("orders", "mysql")
        '`orders`'
    """
    mark = "`" if dialect in ("mysql", "mariadb") else '"'
    return ".".join(
        f"{mark}{part.replace(mark, mark * 2)}{mark}" for part in identifier.split(".")
    )


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a :class:`Query`; ``constant``: from the config, not a request,
    so a caller may inline it as a properly quoted literal (the probes do)."""

    name: str
    value: object
    constant: bool = False


@dataclass(frozen=True, slots=True)
class Query:
    """A statement: SQL text in parts, parameters in between, and its result columns.

    Example::

        >>> q = Query(("SELECT 1 WHERE ", Param("a", 2), " > 1"), ("one",))
        >>> q.text(), q.text("pyformat"), q.params
        ('SELECT 1 WHERE :a > 1', 'SELECT 1 WHERE %(a)s > 1', {'a': 2})
    """

    parts: tuple[str | Param, ...]
    #: What each result column means, in order (the SQL's own aliases may differ).
    columns: tuple[str, ...]

    @property
    def params(self) -> dict[str, object]:
        """Every parameter by name."""
        return {part.name: part.value for part in self.parts if isinstance(part, Param)}

    def text(self, style: ParamStyle = "named") -> str:
        """The SQL with placeholders in ``style``."""
        pattern = ":{}" if style == "named" else "%({})s"
        return "".join(
            pattern.format(part.name) if isinstance(part, Param) else part for part in self.parts
        )


class _Parts:
    """Builds the parts of one statement, naming its parameters uniquely."""

    def __init__(self) -> None:
        self.parts: list[str | Param] = []

    def sql(self, *texts: str) -> _Parts:
        self.parts.extend(texts)
        return self

    def param(self, name: str, value: object, *, constant: bool = False) -> _Parts:
        # One value can appear twice (the same window in two sub-selects): same name.
        self.parts.append(Param(name, value, constant))
        return self

    def in_list(self, prefix: str, values: Sequence[object], *, constant: bool) -> _Parts:
        """``(:prefix0, :prefix1, ...)``: one parameter per value."""
        self.parts.append("(")
        for index, value in enumerate(values):
            if index:
                self.parts.append(", ")
            self.param(f"{prefix}{index}", value, constant=constant)
        self.parts.append(")")
        return self

    def query(self, columns: Iterable[str]) -> Query:
        return Query(tuple(self.parts), tuple(columns))


class InvariantSql:
    """The invariant statements for one schema mapping and dialect. ``since``: a point in
    time or a window back from the server's clock; ``skus``: only those SKUs.

    Example::

        sql = InvariantSql(config.schema, dialect=engine.dialect.name)
        rows = conn.execute(text(sql.oversold().text()), sql.oversold().params)
    """

    def __init__(self, schema: SchemaConfig, dialect: str = "postgresql") -> None:
        self.schema = schema
        self.dialect = dialect

    def quote(self, identifier: str) -> str:
        """``identifier`` quoted for this dialect (:func:`quote`)."""
        return quote(identifier, self.dialect)

    @property
    def mysql(self) -> bool:
        """Whether the dialect is MySQL or MariaDB (the same SQL serves both)."""
        return self.dialect in ("mysql", "mariadb")

    def _col(self, alias: str, column: str) -> str:
        return f"{alias}.{self.quote(column)}"

    def _units(self, alias: str) -> str:  # an item's units: its column, or 1 (a row per unit)
        q = self.schema.order_items.quantity
        return self._col(alias, q) if isinstance(q, str) else str(q)

    # --- shared predicates -----------------------------------------------------------------

    def negative_predicate(self, alias: str | None = None) -> str:
        """``stock < 0``: the predicate a partial index for negative stock must have."""
        stock = self.quote(self.schema.products.stock)
        return f"{alias}.{stock} < 0" if alias else f"{stock} < 0"

    def held_predicate(self) -> Query:
        """The predicate of a reservation that still holds its stock (statuses as constants)."""
        r = self.schema.reservations
        assert r is not None  # noqa: S101 - callers checked
        if r.status is None:
            assert r.released_at is not None  # noqa: S101 - the config sets one of the two
            return Query((f"{self.quote(r.released_at)} IS NULL",), ())
        parts = _Parts().sql(f"{self.quote(r.status)} IN ")
        return parts.in_list("held", r.held_statuses, constant=True).query(())

    def _paid(self, parts: _Parts, alias: str) -> None:
        o = self.schema.orders
        parts.sql(f"{self._col(alias, o.status)} IN ")
        parts.in_list("paid", o.paid_statuses, constant=True)

    def _created_since(
        self, parts: _Parts, alias: str, since: datetime | timedelta | None
    ) -> None:
        if since is None:
            return
        created = self._col(alias, self.schema.orders.created_at)
        if isinstance(since, timedelta) and self.mysql:
            # MySQL subtracts an interval only as INTERVAL n unit (a timedelta parameter
            # would be a TIME string, subtracted as a number); microseconds keep it exact.
            parts.sql(f" AND {created} >= now(6) - INTERVAL ").param(
                "window", since // timedelta(microseconds=1)
            ).sql(" MICROSECOND")
        elif isinstance(since, timedelta):
            parts.sql(f" AND {created} >= now() - ").param("window", since)
        else:
            parts.sql(f" AND {created} >= ").param("since", since)

    def _product_ids_of(self, parts: _Parts, skus: Sequence[str]) -> None:
        """``(SELECT id FROM products WHERE sku IN (...))``."""
        p = self.schema.products
        parts.sql(
            f"(SELECT {self._col('sp', p.id)} FROM {self.quote(p.table)} AS sp"
            f" WHERE {self._col('sp', p.sku)} IN "
        )
        parts.in_list("sku", skus, constant=True).sql(")")

    # --- negative stock --------------------------------------------------------------------

    def negative_stock(self, *, skus: Sequence[str] | None = None, ordered: bool = True) -> Query:
        """Rows ``(sku, stock)`` of the SKUs below zero, lowest stock first (through the
        partial index ``products(stock) WHERE stock < 0`` where there is one)."""
        p = self.schema.products
        parts = _Parts().sql(
            f"SELECT {self._col('p', p.sku)} AS sku, {self._col('p', p.stock)} AS stock"
            f" FROM {self.quote(p.table)} AS p WHERE {self.negative_predicate('p')}"
        )
        if skus:
            parts.sql(f" AND {self._col('p', p.sku)} IN ").in_list("sku", skus, constant=True)
        if ordered:
            parts.sql(f" ORDER BY {self._col('p', p.stock)}, {self._col('p', p.sku)}")
        return parts.query(("sku", "stock"))

    def negative_stock_totals(self) -> Query:
        """One row ``(skus, units)``: how many SKUs are below zero, and by how many units."""
        inner = self.negative_stock(ordered=False)
        return Query(
            ("SELECT count(*), coalesce(sum(-n.stock), 0) FROM (", *inner.parts, ") AS n"),
            ("skus", "units"),
        )

    # --- oversold --------------------------------------------------------------------------

    @property
    def lateral(self) -> bool:
        """Whether the dialect has ``LATERAL`` (PostgreSQL): a join that must stay a
        nested loop over an index is written as one, whatever the planner estimates."""
        return self.dialect == "postgresql"

    def _paid_items(
        self, parts: _Parts, *, count_orders: bool = False, by_order: bool = False
    ) -> None:
        """``SELECT product_id, sum(quantity) AS sold FROM order_items JOIN orders ...
        WHERE status IN (paid)``: the one definition of paid units, which every oversold
        statement aggregates (the caller adds to the ``WHERE`` and groups). ``by_order``:
        the orders (a range of ``created_at``) drive, each one's items read through
        ``order_items(order_id)``, whatever the planner estimates: a ``LATERAL`` join
        (``OFFSET 0`` keeps it from being flattened), ``STRAIGHT_JOIN`` on MySQL."""
        o, oi = self.schema.orders, self.schema.order_items
        orders = f", count(DISTINCT {self._col('o', o.id)}) AS orders" if count_orders else ""
        parts.sql(
            f"SELECT {self._col('oi', oi.product_id)} AS product_id,"
            f" sum({self._units('oi')}) AS sold{orders} FROM "
        )
        if by_order and self.lateral:
            parts.sql(
                f"{self.quote(o.table)} AS o CROSS JOIN LATERAL (SELECT"
                f" {self._col('i', oi.product_id)}, {self._units('i')}"
                f" FROM {self.quote(oi.table)} AS i"
                f" WHERE {self._col('i', oi.order_id)} = {self._col('o', o.id)} OFFSET 0) AS oi"
                " WHERE "
            )
        elif by_order and self.mysql:
            parts.sql(
                f"{self.quote(o.table)} AS o STRAIGHT_JOIN {self.quote(oi.table)} AS oi"
                f" ON {self._col('oi', oi.order_id)} = {self._col('o', o.id)} WHERE "
            )
        else:
            parts.sql(
                f"{self.quote(oi.table)} AS oi JOIN {self.quote(o.table)} AS o"
                f" ON {self._col('o', o.id)} = {self._col('oi', oi.order_id)} WHERE "
            )
        self._paid(parts, "o")

    def _group_by_product(self, parts: _Parts) -> None:
        parts.sql(f" GROUP BY {self._col('oi', self.schema.order_items.product_id)}")

    def _created_range(self, parts: _Parts, start: datetime | None, end: datetime | None) -> None:
        created = self._col("o", self.schema.orders.created_at)
        if start is not None:
            parts.sql(f" AND {created} >= ").param("start", start)
        if end is not None:
            parts.sql(f" AND {created} < ").param("end", end)

    def _allocation(self) -> str:
        allocation = self.schema.products.allocation
        if allocation is None:
            raise ValueError("the oversold check needs schema.products.allocation")
        return self._col("p", allocation)

    def oversold(
        self,
        *,
        skus: Sequence[str] | None = None,
        worst_first: bool = False,
        count_orders: bool = False,
    ) -> Query:
        """Rows ``(sku, allocation, sold_units, oversold_units[, paid_orders])`` of the SKUs
        whose paid units, summed per product, exceed ``schema.products.allocation``: the
        full recount the incremental probe equals. By SKU, or ``worst_first``;
        ``count_orders`` adds the distinct paid orders per SKU."""
        p = self.schema.products
        allocation = self._allocation()
        parts = _Parts().sql(
            f"SELECT {self._col('p', p.sku)}, {allocation}, s.sold, s.sold - {allocation}"
            + (", s.orders" if count_orders else "")
            + " FROM ("
        )
        self._paid_items(parts, count_orders=count_orders)
        if skus:
            parts.sql(f" AND {self._col('oi', self.schema.order_items.product_id)} IN ")
            self._product_ids_of(parts, skus)
        self._group_by_product(parts)
        parts.sql(
            f") AS s JOIN {self.quote(p.table)} AS p ON {self._col('p', p.id)} = s.product_id"
            f" WHERE s.sold > {allocation}"
            + (" ORDER BY 4 DESC, 1" if worst_first else " ORDER BY 1")
        )
        columns = ("sku", "allocation", "sold_units", "oversold_units")
        return parts.query((*columns, "paid_orders") if count_orders else columns)

    # --- oversold, incrementally -----------------------------------------------------------
    # The full recount's sum split by the orders' creation time at a boundary, so that a
    # caller keeping per-product totals (probes.soldtotals) reads only what changed.

    def paid_units_created(
        self, *, start: datetime | None = None, end: datetime | None = None
    ) -> Query:
        """Rows ``(product_id, sku, allocation, sold_units)``: paid units per product of
        the orders created in ``[start, end)`` (``None``: open), through
        ``orders(created_at)`` then ``order_items(order_id)``: work as the range's orders."""
        p = self.schema.products
        allocation = self._allocation()
        parts = _Parts().sql(
            f"SELECT s.product_id, {self._col('p', p.sku)}, {allocation}, s.sold FROM ("
        )
        self._paid_items(parts, by_order=True)
        self._created_range(parts, start, end)
        self._group_by_product(parts)
        # Each summed row's product by primary key (LATERAL, or STRAIGHT_JOIN on MySQL).
        if self.lateral:
            parts.sql(
                f") AS s CROSS JOIN LATERAL (SELECT {self._col('q', p.sku)},"
                + (f" {self._col('q', p.allocation)}" if p.allocation else " NULL")
                + f" FROM {self.quote(p.table)} AS q WHERE {self._col('q', p.id)}"
                " = s.product_id OFFSET 0) AS p"
            )
        else:
            # MariaDB would otherwise scan products and probe a materialised derived table
            # by key: STRAIGHT_JOIN keeps the few summed rows first, each product by its
            # primary key.
            join = "STRAIGHT_JOIN" if self.mysql else "JOIN"
            parts.sql(
                f") AS s {join} {self.quote(p.table)} AS p"
                f" ON {self._col('p', p.id)} = s.product_id"
            )
        return parts.query(("product_id", "sku", "allocation", "sold_units"))

    def paid_units_of_products(self, product_ids: Sequence[object], *, end: datetime) -> Query:
        """Rows ``(product_id, sold_units)``: paid units of these products over the orders
        created before ``end`` (none: no row), through ``order_items(product_id)``."""
        if not product_ids:
            raise ValueError("paid_units_of_products needs at least one product id")
        parts = _Parts()
        self._paid_items(parts)
        parts.sql(f" AND {self._col('oi', self.schema.order_items.product_id)} IN ")
        parts.in_list("product", product_ids, constant=False)
        self._created_range(parts, None, end)
        self._group_by_product(parts)
        return parts.query(("product_id", "sold_units"))

    def paid_units_chunk(self, *, after: object | None, limit: int, end: datetime) -> Query:
        """Rows ``(product_id, sku, allocation, sold_units)`` of the next ``limit``
        products by id after ``after`` (``None``: the first), with their paid units over
        the orders created before ``end`` (0 when none): one step of a spread recount."""
        p, o, oi = self.schema.products, self.schema.orders, self.schema.order_items
        allocation = self._allocation()
        parts = _Parts().sql(
            f"SELECT {self._col('p', p.id)}, {self._col('p', p.sku)}, {allocation}, coalesce(("
        )
        if self.mysql:
            # MariaDB refuses an outer reference inside a derived table: the paid items of
            # the one product summed directly (the same sum as over its single group).
            parts.sql(
                f"SELECT sum({self._units('oi')}) FROM {self.quote(oi.table)} AS oi"
                f" JOIN {self.quote(o.table)} AS o"
                f" ON {self._col('o', o.id)} = {self._col('oi', oi.order_id)} WHERE "
            )
            self._paid(parts, "o")
            parts.sql(f" AND {self._col('oi', oi.product_id)} = {self._col('p', p.id)}")
            self._created_range(parts, None, end)
        else:
            parts.sql("SELECT sum(s.sold) FROM (")
            self._paid_items(parts)
            parts.sql(f" AND {self._col('oi', oi.product_id)} = {self._col('p', p.id)}")
            self._created_range(parts, None, end)
            self._group_by_product(parts)
            parts.sql(") AS s")
        parts.sql(f"), 0) FROM {self.quote(p.table)} AS p")
        if after is not None:
            parts.sql(f" WHERE {self._col('p', p.id)} > ").param("after", after)
        parts.sql(f" ORDER BY {self._col('p', p.id)} LIMIT ").param("limit", limit)
        return parts.query(("product_id", "sku", "allocation", "sold_units"))

    # --- duplicate orders per key ----------------------------------------------------------

    def key_columns(self) -> list[tuple[str, str]]:
        """The mapped key columns as ``(kind, column)``, ``external_ref`` first."""
        o = self.schema.orders
        mapped = (("external_ref", o.external_ref), ("idempotency_key", o.idempotency_key))
        return [(kind, column) for kind, column in mapped if column is not None]

    def duplicate_keys(
        self,
        column: str,
        *,
        since: datetime | timedelta | None = None,
        skus: Sequence[str] | None = None,
        ordered: bool = True,
    ) -> Query:
        """Rows ``(key, orders)``: values of the orders' ``column`` held by more than one
        order (created ``since``; with an item of ``skus``), most orders first."""
        s = self.schema
        o, oi = s.orders, s.order_items
        key = self._col("o", column)
        parts = _Parts().sql(
            f"SELECT {key}, count(*) FROM {self.quote(o.table)} AS o WHERE {key} IS NOT NULL"
        )
        self._created_since(parts, "o", since)
        if skus:
            parts.sql(
                f" AND {self._col('o', o.id)} IN (SELECT {self._col('oi', oi.order_id)}"
                f" FROM {self.quote(oi.table)} AS oi WHERE {self._col('oi', oi.product_id)} IN "
            )
            self._product_ids_of(parts, skus)
            parts.sql(")")
        parts.sql(f" GROUP BY {key} HAVING count(*) > 1")
        if ordered:
            parts.sql(" ORDER BY 2 DESC, 1")
        return parts.query(("key", "orders"))

    def keys_created(self, column: str, *, start: datetime) -> Query:
        """Rows ``(key,)``: the distinct values of the orders' ``column`` among the orders
        created at or after ``start`` (through ``orders(created_at)``)."""
        o = self.schema.orders
        key = self._col("o", column)
        parts = (
            _Parts()
            .sql(
                f"SELECT DISTINCT {key} FROM {self.quote(o.table)} AS o WHERE {key} IS NOT NULL"
                f" AND {self._col('o', o.created_at)} >= "
            )
            .param("start", start)
        )
        return parts.query(("key",))

    def duplicate_key_expiry(
        self, column: str, *, window: timedelta, keys: Sequence[object] | None = None
    ) -> Query:
        """Rows ``(key, second_newest)``: the keys of :meth:`duplicate_keys` over the last
        ``window``, each with the creation time of its second newest order there (a
        duplicate until it leaves the window); ``keys``: only those (through their index)."""
        o = self.schema.orders
        key = self._col("o", column)
        created = self._col("o", o.created_at)
        if keys and self.lateral:
            # Per key, its second newest order of the window through the key's index,
            # whatever the planner thinks the window holds.
            parts = _Parts().sql("SELECT kk.k, s.created FROM (VALUES ")
            for index, value in enumerate(keys):
                parts.sql(", " if index else "", "(").param(f"key{index}", value).sql(")")
            parts.sql(
                f") AS kk(k) CROSS JOIN LATERAL (SELECT {created} AS created"
                f" FROM {self.quote(o.table)} AS o WHERE {key} = kk.k"
            )
            self._created_since(parts, "o", window)
            parts.sql(f" ORDER BY {created} DESC OFFSET 1 LIMIT 1) AS s")
            return parts.query(("key", "second_newest"))
        parts = _Parts().sql(
            f"SELECT d.k, d.created FROM (SELECT {key} AS k, {created} AS created,"
            f" row_number() OVER (PARTITION BY {key} ORDER BY {created} DESC) AS n"
            f" FROM {self.quote(o.table)} AS o WHERE {key} IS NOT NULL"
        )
        self._created_since(parts, "o", window)
        if keys:
            parts.sql(f" AND {key} IN ").in_list("key", keys, constant=False)
        parts.sql(") AS d WHERE d.n = 2")
        return parts.query(("key", "second_newest"))

    def duplicate_key_totals(self, *, since: datetime | timedelta | None = None) -> Query:
        """One row ``(keys,)``: the key values, over every mapped key column, held by more
        than one order (:class:`ValueError` when none is mapped)."""
        columns = self.key_columns()
        if not columns:
            raise ValueError("the duplicate check needs orders.external_ref or idempotency_key")
        parts: list[str | Param] = ["SELECT "]
        for index, (_, column) in enumerate(columns):
            inner = self.duplicate_keys(column, since=since, ordered=False)
            parts.extend((" + " if index else "", "(SELECT count(*) FROM (", *inner.parts))
            parts.append(f") AS d{index})")
        return Query(tuple(parts), ("keys",))

    def duplicate_key_skus(self, column: str, keys: Sequence[object], *, since: datetime) -> Query:
        """Rows ``(sku, keys)``: per SKU, how many of ``keys`` (of the orders' ``column``)
        have an order created since ``since`` with an item of that SKU."""
        o, oi, p = self.schema.orders, self.schema.order_items, self.schema.products
        key = self._col("o", column)
        parts = _Parts().sql(
            f"SELECT {self._col('p', p.sku)}, count(DISTINCT {key}) FROM {self.quote(o.table)}"
            f" AS o JOIN {self.quote(oi.table)} AS oi"
            f" ON {self._col('oi', oi.order_id)} = {self._col('o', o.id)}"
            f" JOIN {self.quote(p.table)} AS p"
            f" ON {self._col('p', p.id)} = {self._col('oi', oi.product_id)}"
            f" WHERE {self._col('o', o.created_at)} >= "
        )
        parts.param("since", since).sql(f" AND {key} IN ").in_list("key", keys, constant=False)
        return parts.sql(f" GROUP BY {self._col('p', p.sku)}").query(("sku", "keys"))

    # --- paid without items ----------------------------------------------------------------

    def paid_without_items(
        self, *, since: datetime | timedelta | None = None, limit: int = 1000
    ) -> Query:
        """Rows ``(order_id, status)`` of paid orders without any order item, by id."""
        s = self.schema
        o, oi = s.orders, s.order_items
        order_id = self._col("o", o.id)
        parts = _Parts().sql(
            f"SELECT {order_id}, {self._col('o', o.status)} FROM {self.quote(o.table)} AS o WHERE "
        )
        self._paid(parts, "o")
        self._created_since(parts, "o", since)
        parts.sql(
            f" AND NOT EXISTS (SELECT 1 FROM {self.quote(oi.table)} AS oi"
            f" WHERE {self._col('oi', oi.order_id)} = {order_id})"
            f" ORDER BY {order_id} LIMIT "
        )
        return parts.param("limit", limit).query(("order_id", "status"))
