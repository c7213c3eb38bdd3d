"""An exception the app answers a buyer with ends a reservation as a conflict, not an error.

A sell-out that raises ``HTTPException(409)`` after a refusal must not page on-call as a
checkout error; an exception the app declares (``conflict_on=``) or a web framework's HTTP
4xx exception is an answer, a 5xx one and anything else still a failure.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import Sentry
from stocksentry.instrumentation.outcomes import http_status_of, is_answer
from stocksentry.instrumentation.reservation import imply_outcome

CONFLICT = "stock_reservation_conflict_total"
ERRORS = "stock_reservation_duration_seconds_count"


STARLETTE = "starlette.exceptions"


class SoldOut(Exception):
    pass


def framework_exception(module: str, name: str, **attributes: object) -> BaseException:
    """An exception class named and placed as a framework's, without the framework."""
    kind = type(name, (Exception,), {"__module__": module})
    exc = kind()
    for key, value in attributes.items():
        setattr(exc, key, value)
    return exc


@pytest.mark.parametrize(
    ("module", "name", "attributes", "status"),
    [
        ("starlette.exceptions", "HTTPException", {"status_code": 409}, 409),
        ("werkzeug.exceptions", "HTTPException", {"code": 410}, 410),
        ("aiohttp.web_exceptions", "HTTPException", {"status_code": 409}, 409),
        ("falcon.errors", "HTTPError", {"status": "409 Conflict"}, 409),
        ("rest_framework.exceptions", "APIException", {"status_code": 503}, 503),
        ("django.http.response", "Http404", {}, 404),
        ("myshop.errors", "HTTPException", {"status_code": 409}, None),
    ],
)
def test_http_status_by_class_name(
    module: str, name: str, attributes: dict[str, object], status: int | None
) -> None:
    assert http_status_of(framework_exception(module, name, **attributes)) == status


def test_subclass_of_a_framework_exception_matches() -> None:
    base = type("HTTPException", (Exception,), {"__module__": "starlette.exceptions"})
    fastapi = type("HTTPException", (base,), {"__module__": "fastapi.exceptions"})
    own = type("Gone", (fastapi,), {"__module__": "shop.api"})
    error = own()
    error.status_code = 409  # type: ignore[attr-defined]
    assert is_answer(error)
    error.status_code = 500  # type: ignore[attr-defined]
    assert not is_answer(error)


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=False, trace=False, conflict_on=[SoldOut])


def test_inferred_conflict_stays_through_any_app_exception(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    def refused_then_raised() -> None:
        with sentry.reservation("EGG-01", strategy="atomic") as r:
            imply_outcome(r, "out_of_stock")
            raise RuntimeError("the app's own 409")

    with pytest.raises(RuntimeError):
        refused_then_raised()
    labels = {"sku": "EGG-01", "reason": "out_of_stock"}
    assert registry.get_sample_value(CONFLICT, labels) == 1.0
    assert registry.get_sample_value(ERRORS, {"outcome": "error"}) == 0.0


@pytest.mark.parametrize(
    ("exc", "counted"),
    [
        (SoldOut(), "conflict"),
        (
            framework_exception(STARLETTE, "HTTPException", status_code=409),
            "conflict",
        ),
        (framework_exception(STARLETTE, "HTTPException", status_code=500), "error"),
        (KeyError("sku"), "error"),
    ],
)
def test_answers_are_conflicts(
    sentry: Sentry, registry: CollectorRegistry, exc: BaseException, counted: str
) -> None:
    with pytest.raises(type(exc)), sentry.reservation("EGG-01", strategy="atomic"):
        raise exc
    conflict = registry.get_sample_value(CONFLICT, {"sku": "EGG-01", "reason": "out_of_stock"})
    error = registry.get_sample_value(ERRORS, {"outcome": "error"})
    if counted == "conflict":
        assert (conflict, error) == (1.0, 0.0)
    else:
        assert (conflict, error) == (None, 1.0)


def test_conflict_on_per_reservation(registry: CollectorRegistry) -> None:
    sentry = Sentry(registry=registry, log=False, trace=False)
    with pytest.raises(SoldOut), sentry.reservation("EGG-01", conflict_on=(SoldOut,)):
        raise SoldOut
    with pytest.raises(SoldOut), sentry.reservation("EGG-01"):
        raise SoldOut
    assert registry.get_sample_value(CONFLICT, {"sku": "EGG-01", "reason": "out_of_stock"}) == 1
    assert registry.get_sample_value(ERRORS, {"outcome": "error"}) == 1.0


def test_conflict_on_refuses_what_is_not_an_exception_class(registry: CollectorRegistry) -> None:
    with pytest.raises(TypeError, match="conflict_on must be exception classes"):
        Sentry(registry=registry, conflict_on=["SoldOut"])  # type: ignore[list-item]
