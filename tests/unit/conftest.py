"""Unit tests touch no service and start no service binary: :mod:`service_guard` refuses.

Each unit test runs with the guard on; the integration suite's fixtures are replaced by
ones that fail, so a unit test asking for a database says where it belongs.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from service_guard import ServiceUsedInUnitTest, services_refused
from stocksentry.instrumentation.logs import configure_logging


@pytest.fixture(autouse=True)
def _no_services(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Switch the guard on for the test (and its fixtures)."""
    with services_refused(monkeypatch):
        yield


@pytest.fixture
def pg_database() -> str:
    """Unit tests get no PostgreSQL database: the fixture lives in the integration suite."""
    raise ServiceUsedInUnitTest("pg_database is for tests/integration")


@pytest.fixture
def redis_prefix() -> str:
    """Unit tests get no Redis: the fixture lives in the integration suite."""
    raise ServiceUsedInUnitTest("redis_prefix is for tests/integration")


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """stocksentry's JSON logs (stdlib bridged) into a buffer; every global logging change
    undone afterwards."""
    saved_level = logging.getLogger().level
    out = io.StringIO()
    configure_logging("INFO", stream=out)
    try:
        yield out
    finally:
        configure_logging(stream=io.StringIO(), bridge_stdlib=False)
        logging.getLogger().setLevel(saved_level)
        structlog.reset_defaults()
        structlog.contextvars.clear_contextvars()


@pytest.fixture
def app_log(tmp_path: Path) -> Iterator[Path]:
    """stocksentry's JSON logging into a file; every global logging change undone after."""
    path = tmp_path / "app.log"
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = path.open("w", encoding="utf-8")
    configure_logging("INFO", stream=stream)
    try:
        yield path
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        root.setLevel(level)
        structlog.reset_defaults()
        structlog.contextvars.clear_contextvars()
        stream.close()


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """The spans the ``provider`` fixture's tracers ended."""
    return InMemorySpanExporter()


@pytest.fixture
def provider(spans: InMemorySpanExporter) -> TracerProvider:
    """A tracer provider exporting every span, as it ends, to ``spans``."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider
