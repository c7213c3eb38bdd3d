"""What the reservation and payment-callback handles share: the block, its span, and the
type check of the values the app passes."""

from __future__ import annotations

from contextvars import Token
from typing import TYPE_CHECKING, Any, Literal, Self

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, StatusCode

if TYPE_CHECKING:
    from .sentry import Sentry


def misuse(**values: object) -> str | None:
    """The first app-provided value of the wrong type, described; ``None`` when all fit.

    The keyword's name says what the value must be: ``sku``, ``strategy``, ``operation``,
    ``cache``, ``reason`` and ``outcome`` a str; ``duration`` a real number or ``None``; any
    other (``qty``, ``stock``, ``new_stock``...) an ``int`` or anything with ``__index__``
    (numpy's integers; never a float or ``Decimal``) or ``None`` (``qty`` never ``None``).
    The description names the type, never the value, so a hostile value cannot flood the
    error log.
    """
    for name, value in values.items():
        if name in _STR_ARGS:
            if not isinstance(value, str):
                return f"{name} must be a str, got {type(value).__name__}"
        elif name == "duration":
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                return f"duration must be a number of seconds, got {type(value).__name__}"
        elif (value is not None or name == "qty") and not (
            isinstance(value, int) or hasattr(type(value), "__index__")
        ):
            return f"{name} must be an int, got {type(value).__name__}"
    return None


_STR_ARGS = frozenset({"sku", "strategy", "operation", "cache", "reason", "outcome"})


class BlockHandle:
    """A sync and async context manager over ``_enter()`` and ``_exit(exc)`` (a subclass's;
    they never raise into the host: they catch, count and log), with a span."""

    _span: Span | None = None
    # The context _use_span attached, and the token to detach it with.
    _ctx: Context | None = None
    _ctx_token: Token[Context] | None = None

    def __init__(
        self, sentry: Sentry, sku: str, qty: int, ids: dict[str, object], **checked: object
    ) -> None:
        self._sentry = sentry
        self.sku = sku
        self.qty = qty
        self.ids = ids
        # A value of the wrong type from the app, described: the handle then records none of
        # its series (all or nothing) and counts one instrumentation error.
        self._misuse = misuse(sku=sku, **checked, qty=qty)

    def _enter(self) -> None:
        raise NotImplementedError

    def _exit(self, exc: BaseException | None) -> None:
        raise NotImplementedError

    def _use_span(self, span: Span) -> None:
        """Make ``span`` this handle's, current until :meth:`_end_span`."""
        self._span = span
        self._ctx = otel_trace.set_span_in_context(span)
        self._ctx_token = otel_context.attach(self._ctx)

    def _end_span(
        self, span: Span, key: str, result: str, failed: bool, exc: BaseException | None
    ) -> None:
        """End ``span`` with ``key=result``; ``failed`` records ``exc`` and an error status."""
        try:
            # No is_recording() test: a span that records nothing ignores all three calls.
            span.set_attribute(key, result)
            if failed:
                if exc is not None:
                    span.record_exception(exc)
                span.set_status(StatusCode.ERROR)
            span.end()
        except Exception as err:
            self._sentry.internal_error("tracing", err)
        finally:
            token, self._ctx_token = self._ctx_token, None
            if token is not None:
                if otel_context.get_current() is not self._ctx:
                    # Ended in another context than it began (another task, say): detach()
                    # cannot restore this one; counted here, as detach() only logs it.
                    self._sentry.internal_error(
                        "tracing", RuntimeError("span context not current at the block's end")
                    )
                otel_context.detach(token)

    def __enter__(self) -> Self:
        self._enter()
        return self

    def __exit__(self, *exc_info: Any) -> Literal[False]:
        self._exit(exc_info[1])  # (type, exception, traceback)
        return False

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(self, *exc_info: Any) -> Literal[False]:
        return self.__exit__(*exc_info)
