"""PromQL building blocks for the dashboards.

Every metric name comes from the catalog (:mod:`stocksentry.instrumentation.catalog`);
every rate window is Grafana's ``$__rate_interval`` (or ``$__range`` for totals over the
dashboard's time range), never a literal like ``[5m]``; every selector carries the
dashboard's location variables (``cluster``, ``namespace``: :data:`LOCATION_LABELS`) and
its ``job`` variable, and every aggregation keeps the location labels.

Example::

    from dashboards import promql
    from stocksentry.instrumentation import catalog

    promql.sum_rate(catalog.RESERVATION_SUCCESS, by=("sku",))
    # 'sum by (cluster, namespace, sku) (rate(stock_reservation_success_total{
    #   cluster=~"$cluster", namespace=~"$namespace", job=~"$job"}[$__rate_interval]))'
"""

from __future__ import annotations

from collections.abc import Sequence

from stocksentry.instrumentation.catalog import MetricSpec

#: Grafana's rate window: at least four scrape intervals, so rate() always has two samples.
RATE_WINDOW = "$__rate_interval"
#: The dashboard's whole time range, for "how many in the range" totals.
RANGE_WINDOW = "$__range"

#: The labels that say where a series comes from (``build.py --location-labels``): every
#: aggregation keeps them, every selector matches them against a dashboard variable of the
#: same name (:func:`dashboards.variables.location_variables`).
LOCATION_LABELS: tuple[str, ...] = ("cluster", "namespace")
#: Matchers every query carries. The location matchers are regexes so that "All" (``.*``)
#: also matches series without the label (a Prometheus outside Kubernetes, one cluster).
BASE_MATCHERS: tuple[str, ...] = ()
#: The SKU deep dive's SKU: a single value, matched exactly.
SKU_MATCHER = 'sku="$sku"'
#: The selector of the overview and exporter dashboards (set by :func:`set_location_labels`).
SEL = ""
#: The selector of the SKU deep dive, for metrics that carry a ``sku`` label.
SKU_SEL = ""


def set_location_labels(labels: Sequence[str]) -> None:
    """Build the dashboards for these location labels (at least one, in this order)."""
    global LOCATION_LABELS, BASE_MATCHERS, SEL, SKU_SEL
    if not labels or len(set(labels)) != len(labels):
        raise ValueError(f"location labels: {list(labels)} must be distinct and not empty")
    LOCATION_LABELS = tuple(labels)
    BASE_MATCHERS = (*(f'{label}=~"${label}"' for label in LOCATION_LABELS), 'job=~"$job"')
    SEL = selector()
    SKU_SEL = selector(SKU_MATCHER)


def selector(*extra: str) -> str:
    """A label selector with the dashboard's variables and ``extra`` matchers."""
    return "{" + ", ".join((*BASE_MATCHERS, *extra)) + "}"


def by(*labels: str) -> str:
    """``by (<location labels>, labels...)``: the grouping of a hand-written aggregation."""
    return f"by ({', '.join((*LOCATION_LABELS, *labels))})"


def sample(spec: MetricSpec, suffix: str = "") -> str:
    """The exposed sample name of ``spec`` (``suffix``: ``_bucket``, ``_count``, ``_sum``).

    Raises :class:`ValueError` for a suffix the metric does not expose, so a histogram
    turned counter in the catalog breaks the build here.
    """
    name = spec.name + suffix
    if name not in spec.sample_names:
        raise ValueError(f"{spec.name} ({spec.kind}) exposes no sample {name}")
    return name


def _sum(labels: Sequence[str]) -> str:
    """``sum by (<location labels>, a, b) (``: the opening of an aggregation."""
    return f"sum {by(*labels)} ("


def series(spec: MetricSpec, sel: str | None = None, suffix: str = "") -> str:
    """The instant selector of a catalog metric: ``name{matchers}``."""
    return sample(spec, suffix) + (SEL if sel is None else sel)


def rate(spec: MetricSpec, sel: str | None = None, suffix: str = "") -> str:
    """``rate(name{matchers}[$__rate_interval])``."""
    return f"rate({series(spec, sel, suffix)}[{RATE_WINDOW}])"


def sum_rate(
    spec: MetricSpec, by: Sequence[str] = (), sel: str | None = None, suffix: str = ""
) -> str:
    """Per-second rate summed over instances, kept apart by ``by``."""
    return f"{_sum(by)}{rate(spec, sel, suffix)})"


def increase_in_range(spec: MetricSpec, by: Sequence[str] = (), sel: str | None = None) -> str:
    """How much a counter grew over the dashboard's time range, kept apart by ``by``.

    ``increase()`` alone misses a series born inside the range: a labelled counter child
    exists only from its first increment, and when a burst (49 negative writes in 50 ms)
    happens between two scrapes, the first sample already holds the whole burst and
    ``increase`` reports 0. A series that did not exist at the start of the range
    counts with its whole value instead (it was 0 before it existed); the others with
    their ``increase``, which handles counter resets.
    """
    current = series(spec, sel)
    return (
        f"{_sum(by)}\n"
        f"  ({current} unless {current} offset {RANGE_WINDOW})\n"
        f"  or\n"
        f"  increase({current}[{RANGE_WINDOW}])\n"
        f")"
    )


def topk(k: int, expr: str) -> str:
    """The ``k`` largest series of ``expr``."""
    return f"topk({k},\n{expr}\n)"


def quantile(q: float, spec: MetricSpec, by: Sequence[str] = (), sel: str | None = None) -> str:
    """``histogram_quantile`` of a catalog histogram over ``$__rate_interval``."""
    return f"histogram_quantile({q:g}, {_sum(('le', *by))}{rate(spec, sel, '_bucket')}))"


def ratio_zero_filled(part: str, rest: str, by: Sequence[str]) -> str:
    """``part / (part + rest)`` per ``by``, where either side may have no series at all.

    ``part`` and ``rest`` are inner vectors (``rate(...)``), before aggregation. Counter
    children exist only once incremented: a SKU that never lost a race has no conflict
    series, and a plain division would drop it from the graph instead of showing 0. The
    denominator is the union of both sides (their label sets differ, so ``or`` keeps
    every series of each); the numerator falls back to zero for keys that only ``rest``
    has.
    """
    total = f"{_sum(by)}{part} or {rest})"
    return f"({_sum(by)}{part}) or 0 * {total})\n/\n{total}"


set_location_labels(LOCATION_LABELS)
