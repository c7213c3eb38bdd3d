"""The decorator's SKU forms, an async refusal and ``conflict_on``'s forms, counted exactly."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import Sentry


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=False, trace=False)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_a_fixed_sku_and_a_sku_of_another_type(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    @sentry.reserves(strategy="atomic", sku="FIXED-1")
    def fixed(order: str) -> bool:
        return True

    @sentry.reserves(strategy="atomic")
    def by_id(sku: uuid.UUID) -> bool:
        return True

    product = uuid.UUID(int=7)
    assert fixed("o-1") is True
    assert by_id(product) is True
    success = "stock_reservation_success_total"
    assert value(registry, success, sku="FIXED-1", strategy="atomic") == 1
    assert value(registry, success, sku=str(product), strategy="atomic") == 1


def test_a_call_that_does_not_bind_fails_inside_its_reservation(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    @sentry.reserves(strategy="atomic")
    def reserve(sku: str) -> bool:
        return True

    with pytest.raises(TypeError):
        reserve("A", "extra")  # one argument too many
    assert value(registry, "stock_reservation_duration_seconds_count", outcome="error") == 1


async def test_an_async_function_returning_false_is_out_of_stock(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    @sentry.reserves(strategy="atomic")
    async def reserve(sku: str) -> bool:
        return False

    assert await reserve("A") is False
    conflict = "stock_reservation_conflict_total"
    assert value(registry, conflict, sku="A", reason="out_of_stock") == 1


def test_conflict_on_takes_one_class_and_refuses_others(registry: CollectorRegistry) -> None:
    sentry = Sentry(registry=registry, log=False, trace=False, conflict_on=LookupError)
    with pytest.raises(KeyError), sentry.reservation("A"):
        raise KeyError("A")
    conflict = "stock_reservation_conflict_total"
    assert value(registry, conflict, sku="A", reason="out_of_stock") == 1
    with pytest.raises(TypeError, match="conflict_on must be exception classes"):
        Sentry(registry=None, conflict_on=["not a class"])
