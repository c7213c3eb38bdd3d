"""The SQLAlchemy integration's statement classifier on SQL-ish text: it always returns.

Inputs are real statements of the kinds the detector reads (every paramstyle, locking
clauses, compound and nested forms) with token-level mutations (dropped, repeated,
swapped and cut tokens, stray quotes, comments and parameters), and free SQL-ish text.
Inputs are bounded in size (:data:`fuzzing.MAX_TEXT`); hypothesis' deadline is off.
"""

from __future__ import annotations

import subprocess
import sys

from fuzzing import MAX_TEXT, any_text, examples, hostile_text
from hypothesis import given
from hypothesis import strategies as st
from stocksentry.instrumentation.sqlalchemy import StatementInfo, StockTable, classify_statement

_PARAMSTYLES = ["pyformat", "format", "qmark", "named", "numeric", "numeric_dollar"]
_TABLES = [
    None,
    {"products": StockTable()},
    {
        "products": StockTable(version_column="version"),
        "warehouse_stock": StockTable(stock_column="qty", key_columns=("sku", "site")),
        '"Quoted"': StockTable(),
    },
]
_STATEMENTS = [
    "SELECT products.id, products.available_stock FROM products "
    "WHERE products.sku = %(sku_1)s::VARCHAR FOR NO KEY UPDATE NOWAIT",
    "SELECT available_stock FROM products WHERE sku = 'it''s FOR UPDATE' -- FOR UPDATE",
    "SELECT available_stock FROM products WHERE id = 1 FOR KEY SHARE OF products SKIP LOCKED",
    "SELECT p.available_stock FROM products AS p JOIN orders o ON o.sku = p.sku WHERE p.id = ?",
    "SELECT * FROM (SELECT available_stock FROM products WHERE id = $1) AS s UNION SELECT 1",
    "WITH s AS (SELECT * FROM products) SELECT available_stock FROM s WHERE sku = :sku",
    "UPDATE products SET available_stock = %(v)s WHERE sku = %(sku)s",
    "UPDATE products SET available_stock = available_stock - %(q)s "
    "WHERE sku = %(s)s AND available_stock >= %(q)s",
    "UPDATE products SET available_stock = :1, version = version + 1 "
    "WHERE id = :2 AND version = :3",
    "UPDATE ONLY public.products p SET available_stock = p.available_stock - 1 "
    "FROM orders WHERE p.id = orders.product_id RETURNING p.available_stock",
    'UPDATE "products" SET "available_stock" = $1 WHERE "id" = $2',
    "UPDATE `products` SET `available_stock` = ? WHERE `sku` = ?",
    "DELETE FROM products WHERE sku = E'a\\'b' AND id IN (1, 2, 3)",
    "LOCK TABLE ONLY products IN ROW EXCLUSIVE MODE NOWAIT",
    "LOCK products, orders IN ACCESS EXCLUSIVE MODE",
    "BEGIN ISOLATION LEVEL SERIALIZABLE",
    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    "START TRANSACTION READ WRITE, ISOLATION LEVEL READ COMMITTED",
    "INSERT INTO orders (sku) VALUES (%(sku)s) ON CONFLICT (sku) DO UPDATE SET n = 1",
    "SELECT $tag$ FOR UPDATE $tag$ FROM products /* nested /* comment */ */ WHERE id = 1",
    "SELECT U&'\\0041' FROM products WHERE sku = B'101' OR sku = X'FF' OR sku = N'x'",
    "SELECT 1e10, .5, 3., 0x1F FROM products WHERE available_stock %% 2 = 0",
]
_TOKENS = [
    "SELECT",
    "UPDATE",
    "DELETE",
    "FROM",
    "WHERE",
    "SET",
    "FOR",
    "UPDATE",
    "SHARE",
    "KEY",
    "NO",
    "OF",
    "LOCK",
    "TABLE",
    "IN",
    "MODE",
    "BEGIN",
    "LEVEL",
    "ONLY",
    "AS",
    "JOIN",
    "ON",
    "UNION",
    "WITH",
    "RETURNING",
    "products",
    "available_stock",
    "sku",
    "id",
    "version",
    "(",
    ")",
    ",",
    ".",
    "=",
    "-",
    "+",
    "::",
    ":",
    ";",
    "'",
    '"',
    "`",
    "$",
    "$$",
    "$a$",
    "%s",
    "%(x)s",
    "%(",
    "%",
    "?",
    ":1",
    ":name",
    "$1",
    "$0",
    "$99999999999999999999",
    ":99999999999999999999",
    "--",
    "/*",
    "*/",
    "E'",
    'U&"',
    "\\",
    "\n",
    "1e999",
    "99999999999999999999",
]


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    """A real statement, split on spaces, with a few token-level mutations."""
    tokens = draw(st.sampled_from(_STATEMENTS)).split(" ")
    for _ in range(draw(st.integers(0, 6))):
        if not tokens:
            break
        at = draw(st.integers(0, len(tokens) - 1))
        action = draw(st.integers(0, 4))
        if action == 0:
            del tokens[at]
        elif action == 1:
            tokens.insert(at, draw(st.sampled_from(_TOKENS)))
        elif action == 2:
            tokens[at] = tokens[at] * draw(st.integers(2, 4))
        elif action == 3:
            other = draw(st.integers(0, len(tokens) - 1))
            tokens[at], tokens[other] = tokens[other], tokens[at]
        else:
            cut = draw(st.integers(0, len(tokens[at])))
            tokens[at] = tokens[at][:cut]
    joiner = draw(st.sampled_from([" ", "", "\n", "\t/**/"]))
    return joiner.join(tokens)[:MAX_TEXT]


_sqlish = st.lists(st.sampled_from(_TOKENS), max_size=80).map(" ".join)
_inputs = st.one_of(_mutated(), _sqlish, hostile_text, any_text)


@examples(3000)
@given(_inputs, st.sampled_from(_PARAMSTYLES), st.sampled_from(_TABLES))
def test_classification_always_returns(sql: str, paramstyle: str, tables: object) -> None:
    info = classify_statement(sql, paramstyle=paramstyle, stock_tables=tables)  # type: ignore[arg-type]
    assert isinstance(info, StatementInfo)


_BIG_STATEMENTS = r"""
import resource, sys
from stocksentry.instrumentation.sqlalchemy import classify_statement

resource.setrlimit(resource.RLIMIT_CPU, (20, 20))
resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))
n = 100_000
for sql in (
    "SELECT " + "(" * n + "1" + ")" * n + " FROM products",
    "/*" * n,
    "SELECT available_stock FROM products WHERE "
    + " AND ".join(f"sku = %(p{i})s" for i in range(n // 2)),
    "SELECT available_stock FROM products " + "FOR " * n,
    "UPDATE products SET "
    + ", ".join(f"available_stock = available_stock - {i}" for i in range(n // 2))
    + " WHERE id = 1",
    "SELECT available_stock FROM " + ", ".join(f"t{i}" for i in range(n)),
    "SELECT '" + "''" * n,
    "SELECT " + "$a$" * n,
    "SELECT available_stock FROM products WHERE id = 1 " + "UNION SELECT 1 " * n,
):
    classify_statement(sql)
print("done")
"""


def test_megabyte_statements_classify_within_a_cpu_and_memory_limit() -> None:
    """Statements of about a megabyte each, the shapes that could go quadratic (nesting,
    long WHERE and SET lists, unterminated quotes and comments), classify well inside
    20 s of CPU and 2 GiB of address space (limits set in a child process: a wall-clock
    bound would be flaky on a shared machine). Measured: about 4 s of CPU, imports included.
    """
    done = subprocess.run(
        [sys.executable, "-c", _BIG_STATEMENTS], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout, done.stderr[-2000:]) == (0, "done\n", "")
