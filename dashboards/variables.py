"""The dashboards' template variables: datasource, location labels, job and SKU.

Each variable's values come from one known metric, as the monitoring mixins list theirs
from ``up{job=...}``: never from a ``{__name__=~"stock_.+"}`` selector, which makes
Prometheus (or Mimir) look at every series name of the TSDB on each dashboard load.

- the location variables (``$cluster``, ``$namespace``) list the locations of
  ``stocksentry_build_info``, which every stocksentry exporter (sidecar or prober) serves
  on every scrape;
- ``$job`` lists the jobs of that metric and of ``stock_reservation_success_total`` (the
  app's required series, for an app scraped under a job of its own): two exact names,
  which Prometheus resolves as a set, not a regex over every name.

**Single-cluster mode** (``build.py --single-cluster``, kubernetes-mixin's
``showMultiCluster: false``): the ``cluster`` variable is hidden and stays at All (``.*``,
which also matches series without the label), for a Prometheus that sees one cluster.

Example::

    >>> location_variables()[0].build().query
    'label_values(stocksentry_build_info, cluster)'
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.models import dashboard as dashboard_models
from stocksentry.instrumentation import catalog

from . import promql

#: Every panel and query names the datasource through the dashboard variable.
DATASOURCE = dashboard_models.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: The metric whose labels say where stocksentry runs: one per exporter, always present.
LOCATION_METRIC = catalog.BUILD_INFO.name
#: The names whose ``job`` labels the ``$job`` variable lists (exporters and apps).
JOB_METRICS = (catalog.BUILD_INFO.name, catalog.RESERVATION_SUCCESS.name)
#: The location label single-cluster mode hides.
CLUSTER_LABEL = "cluster"

_single_cluster = False


def set_single_cluster(single: bool) -> None:
    """Build the dashboards for one cluster: the ``cluster`` variable hidden, at All."""
    global _single_cluster
    if single and CLUSTER_LABEL not in promql.LOCATION_LABELS:
        raise ValueError(
            f"single-cluster mode hides the {CLUSTER_LABEL} variable, which the location"
            f" labels {','.join(promql.LOCATION_LABELS)} do not have"
        )
    _single_cluster = single


def datasource_variable() -> dashboard_builders.DatasourceVariable:
    """``$datasource``: any Prometheus-compatible datasource (Prometheus, Thanos, Mimir)."""
    return (
        dashboard_builders.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .description("The Prometheus (or Thanos, Mimir) that scrapes stocksentry.")
    )


def _query_variable(
    name: str,
    label: str,
    query: str,
    *,
    sort: dashboard_models.VariableSort = dashboard_models.VariableSort.ALPHABETICAL_ASC,
    multi: bool = True,
) -> dashboard_builders.QueryVariable:
    """A variable over ``query``'s values, refreshed with the time range; a ``multi`` one
    offers and starts at All."""
    variable = (
        dashboard_builders.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(sort)
        .multi(multi)
        .include_all(multi)
    )
    if multi:
        all_selected = dashboard_models.VariableOption(
            selected=True, text=["All"], value=["$__all"]
        )
        variable = variable.current(all_selected)
    return variable


def _selector(name: str, labels: tuple[str, ...]) -> str:
    """``name{a=~"$a", b=~"$b"}`` (just ``name`` without labels)."""
    matchers = ", ".join(f'{label}=~"${label}"' for label in labels)
    return f"{name}{{{matchers}}}" if matchers else name


def location_variables() -> list[dashboard_builders.QueryVariable]:
    """One variable per location label (``$cluster``, ``$namespace``), in order.

    Each lists the values of :data:`LOCATION_METRIC` in the locations the variables
    before it select. "All" is ``.*``, which also matches series without the label, so
    the dashboards work on a Prometheus of one cluster, or outside Kubernetes.
    """
    variables = []
    for index, label in enumerate(promql.LOCATION_LABELS):
        selector = _selector(LOCATION_METRIC, promql.LOCATION_LABELS[:index])
        variable = _query_variable(
            label, label.replace("_", " ").capitalize(), f"label_values({selector}, {label})"
        ).all_value(".*")
        if _single_cluster and label == CLUSTER_LABEL:
            variable = variable.hide(dashboard_models.VariableHide.HIDE_VARIABLE)
        variables.append(variable)
    return variables


def job_variable() -> dashboard_builders.QueryVariable:
    """``$job``: the scrape jobs of exporters and apps in the chosen locations.

    No custom "All" value: All means the listed jobs, so exporter panels on built-in
    series (``up``, ``scrape_*``) do not show every target of the Prometheus.
    """
    names = "|".join(JOB_METRICS)
    location = "".join(f', {label}=~"${label}"' for label in promql.LOCATION_LABELS)
    return _query_variable("job", "Job", f'label_values({{__name__=~"{names}"{location}}}, job)')


def sku_variable(success_metric: str) -> dashboard_builders.QueryVariable:
    """``$sku``: one SKU that had a successful reservation (promo SKUs and the hottest N)."""
    return _query_variable(
        "sku",
        "SKU",
        f"label_values({success_metric}{promql.SEL}, sku)",
        sort=dashboard_models.VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC,
        multi=False,
    )
