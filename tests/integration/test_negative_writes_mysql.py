"""Real negative stock writes on MariaDB (PyMySQL): no ``UPDATE … RETURNING`` there, so the
stock is read back after a relative decrement, for the tables in ``read_back_stock``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import Sentry
from stocksentry.instrumentation.sqlalchemy import instrument_sqlalchemy, uninstrument_sqlalchemy

pytestmark = pytest.mark.integration

NEGATIVE = "stock_inventory_negative_total"
DECREMENT = sa.text("UPDATE products SET available_stock = available_stock - :n WHERE sku = :sku")
SAFE = sa.text(
    "UPDATE products SET available_stock = available_stock - :n"
    " WHERE sku = :sku AND available_stock >= :n"
)


@pytest.fixture
def engine(mysql_sqlalchemy_url: str, registry: CollectorRegistry) -> Iterator[sa.Engine]:
    engine = sa.create_engine(mysql_sqlalchemy_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE products (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
            " sku VARCHAR(32) UNIQUE NOT NULL, available_stock INT NOT NULL)"
        )
        conn.exec_driver_sql(
            "INSERT INTO products (sku, available_stock) VALUES ('EGG-01', 2), ('EGG-02', 2)"
        )
    sentry = Sentry(registry=registry, log=False, trace=False)
    instrument_sqlalchemy(engine, sentry=sentry, read_back_stock=True)
    yield engine
    uninstrument_sqlalchemy(engine)
    engine.dispose()


def test_relative_decrements_read_back_on_mariadb(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    with engine.begin() as conn:
        counts = [conn.execute(DECREMENT, {"n": 1, "sku": "EGG-01"}).rowcount for _ in range(5)]
        refused = [conn.execute(SAFE, {"n": 1, "sku": "EGG-02"}).rowcount for _ in range(5)]
    assert counts == [1] * 5  # the app's rowcounts are untouched by the read-back
    assert refused == [1, 1, 0, 0, 0]
    # 2 - 5 = -3: the writes that left -1, -2, -3; the guarded decrements count nothing.
    assert registry.get_sample_value(NEGATIVE, {"sku": "EGG-01"}) == 3
    assert (registry.get_sample_value(NEGATIVE, {"sku": "EGG-02"}) or 0) == 0
