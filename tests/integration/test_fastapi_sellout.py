"""A sell-out in a FastAPI app on real PostgreSQL is a conflict, never an error.

The app reserves with a guarded ``UPDATE … AND available_stock >= :qty`` inside
``reservation()``; when it matches no row the SQLAlchemy integration infers the refusal,
and the app answers the buyer the FastAPI way, ``raise HTTPException(409)``. Every buyer
past the stock must be ``out_of_stock``: no ``error`` outcome, no ``reservation_error``
line, no span with status ERROR — or each sell-out would page on-call.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from dbs import Db
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import Sentry, events
from stocksentry.instrumentation.sqlalchemy import instrument_sqlalchemy, uninstrument_sqlalchemy
from structlog.testing import capture_logs

pytestmark = pytest.mark.integration

STOCK = 5
BUYERS = 8
GUARDED = sa.text(
    "UPDATE products SET available_stock = available_stock - :qty"
    " WHERE sku = :sku AND available_stock >= :qty"
)


class SoldOut(Exception):
    """The shop's own sold-out exception, declared with ``conflict_on=``."""


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def sentry(registry: CollectorRegistry, spans: InMemorySpanExporter) -> Sentry:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return Sentry(registry=registry, tracer_provider=provider, conflict_on=[SoldOut])


@pytest.fixture
def engine(pg_database: str, sentry: Sentry) -> Iterator[sa.Engine]:
    from dbs import postgresql

    db: Db = postgresql(pg_database)
    db.create_products(f"('EGG-01', 'egg', {STOCK})")
    engine = sa.create_engine(db.url, pool_size=4)
    instrument_sqlalchemy(engine, sentry=sentry)
    yield engine
    uninstrument_sqlalchemy(engine)
    engine.dispose()


def shop(engine: sa.Engine, sentry: Sentry) -> FastAPI:
    app = FastAPI()

    @app.post("/reserve/{sku}")
    def reserve(sku: str) -> dict[str, str]:
        with sentry.reservation(sku, strategy="atomic"), engine.begin() as conn:
            if conn.execute(GUARDED, {"sku": sku, "qty": 1}).rowcount == 0:
                raise HTTPException(status_code=409, detail="sold out")
        return {"sku": sku}

    @app.post("/declared/{sku}")
    def declared(sku: str) -> dict[str, str]:
        # No SQL refusal to infer from: the app's own exception is its answer.
        with sentry.reservation(sku, strategy="atomic"):
            raise SoldOut(sku)

    @app.exception_handler(SoldOut)
    def sold_out(request: object, exc: SoldOut) -> object:
        from fastapi.responses import JSONResponse

        return JSONResponse({"detail": "sold out"}, status_code=409)

    return app


def test_sell_out_answered_409_is_a_conflict(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry, spans: InMemorySpanExporter
) -> None:
    client = TestClient(shop(engine, sentry))
    with capture_logs() as logs:
        statuses = [client.post("/reserve/EGG-01").status_code for _ in range(BUYERS)]
        statuses.append(client.post("/declared/EGG-01").status_code)
    assert statuses == [200] * STOCK + [409] * (BUYERS - STOCK + 1)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("stock_reservation_success_total", sku="EGG-01", strategy="atomic") == STOCK
    conflicts = sample("stock_reservation_conflict_total", sku="EGG-01", reason="out_of_stock")
    assert conflicts == BUYERS - STOCK + 1
    assert sample("stock_reservation_duration_seconds_count", outcome="error") == 0.0
    assert [line for line in logs if line["event"] == events.RESERVATION_ERROR.name] == []
    refused = [line for line in logs if line.get("reason") == "out_of_stock"]
    assert len(refused) == BUYERS - STOCK + 1
    reserves = [span for span in spans.get_finished_spans() if span.name == "stock.reserve"]
    assert len(reserves) == BUYERS + 1
    assert sorted(str(span.attributes["stock.outcome"]) for span in reserves) == sorted(
        ["success"] * STOCK + ["out_of_stock"] * (BUYERS - STOCK + 1)
    )
    assert all(span.status.status_code != StatusCode.ERROR for span in reserves)
