"""The metric contract (one source: the catalog) and ``stocksentry check-metrics``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from stocksentry.exporter.cli import main
from stocksentry.exporter.contract.check import check
from stocksentry.exporter.contract.exposition import ExpositionError, parse
from stocksentry.exporter.contract.spec import ALLOWED, REQUIRED, contract, contract_json
from stocksentry.instrumentation import catalog, events

ROOT = Path(__file__).resolve().parents[2]


def test_the_published_contract_is_the_catalog() -> None:
    spec = contract()
    assert (ROOT / "docs" / "metric-contract.json").read_text() == contract_json()
    assert [m["name"] for m in spec["metrics"]] == [m.name for m in catalog.ALL]
    for entry, metric in zip(spec["metrics"], catalog.ALL, strict=True):
        assert entry["type"] == metric.kind
        assert [label["name"] for label in entry["labels"]] == list(metric.labels)
        assert entry["samples"] == list(metric.sample_names)
        assert entry.get("buckets") == (list(metric.buckets) if metric.buckets else None)
    conflict = next(m for m in spec["metrics"] if m["name"] == catalog.RESERVATION_CONFLICT.name)
    assert conflict["labels"][1]["allowed"] == list(catalog.CONFLICT_REASONS)
    assert conflict["labels"][0] == {"name": "sku", "max_values": 100, "guarded": True}
    assert all(name in catalog.BY_NAME for name, _ in ALLOWED)
    assert set(catalog.BY_NAME) >= REQUIRED
    update = next(e for e in spec["log_lines"]["events"] if e["event"] == "stock_update")
    assert update["fields"] == list(events.STOCK_UPDATE.fields)


def conforming(registry: CollectorRegistry | None = None) -> str:
    """An app's exposition made with prometheus_client from the catalog's own specs."""
    registry = registry or CollectorRegistry()
    success = Counter(
        catalog.RESERVATION_SUCCESS.base_name, "h", ["sku", "strategy"], registry=registry
    )
    conflict = Counter(
        catalog.RESERVATION_CONFLICT.base_name, "h", ["sku", "reason"], registry=registry
    )
    duration = Histogram(
        catalog.RESERVATION_DURATION.name,
        "h",
        ["outcome"],
        buckets=catalog.LATENCY_BUCKETS,
        registry=registry,
    )
    paid = Counter(catalog.ORDERS_PAID.base_name, "h", ["sku"], registry=registry)
    success.labels("EGG-01", "atomic").inc(3)
    conflict.labels("EGG-01", "out_of_stock").inc()
    duration.labels("success").observe(0.01)
    paid.labels("EGG-01").inc(3)
    return generate_latest(registry).decode()


def kinds(text: str, **options: object) -> list[tuple[str, str, str]]:
    return [(p.kind, p.metric, p.message) for p in check(parse(text), **options)]  # type: ignore[arg-type]


def test_a_conforming_app_has_no_problem() -> None:
    assert kinds(conforming()) == []


def test_missing_required_and_required_on_request() -> None:
    problems = kinds("")
    assert [(k, m) for k, m, _ in problems] == [("missing", name) for name in (
        "stock_reservation_success_total",
        "stock_reservation_conflict_total",
        "stock_reservation_duration_seconds",
        "stock_orders_paid_total",
    )]  # fmt: skip
    extra = kinds(conforming(), require=["stock_lock_hold_ratio"])
    assert extra == [("missing", "stock_lock_hold_ratio", "required, not exposed")]
    with pytest.raises(ValueError, match="not a contract metric: nope"):
        check(parse(""), require=["nope"])


def test_misnamed_metrics_and_labels() -> None:
    text = conforming().replace("stock_orders_paid", "stockOrdersPaid")
    text = text.replace('strategy="atomic"', 'strat="atomic"')
    text += "# TYPE stock_made_up_total counter\nstock_made_up_total 1\n"
    line = text.count("\n")
    assert kinds(text) == [
        (
            "misnamed",
            "stock_reservation_success_total",
            "label(s) strat not in the contract (labels: sku, strategy)",
        ),
        ("misnamed", "stock_reservation_success_total", "lacks label(s) strategy"),
        (
            "misnamed",
            "stock_orders_paid_total",
            "exposed as stockOrdersPaid_total; the contract names it stock_orders_paid_total",
        ),
        ("misnamed", "stock_made_up_total", f"not a contract metric (line {line})"),
    ]


def test_counter_without_total_is_misnamed() -> None:
    text = '# TYPE stock_orders_paid counter\nstock_orders_paid{sku="A"} 1\n'
    problems = kinds(text)
    assert (
        "misnamed",
        "stock_orders_paid_total",
        "sample stock_orders_paid (line 2) lacks _total",
    ) in problems


def test_mistyped_kind_and_buckets() -> None:
    registry = CollectorRegistry()
    Gauge(catalog.LOCK_EXPIRED_WHILE_HELD.name, "h", ["lock"], registry=registry).labels("l").set(
        1
    )
    Histogram(
        catalog.LOCK_HOLD_RATIO.name, "h", ["lock"], buckets=(0.5, 1.0), registry=registry
    ).labels("l").observe(0.2)
    problems = kinds(conforming(registry))
    assert problems == [
        (
            "mistyped",
            "stock_lock_hold_ratio",
            "buckets differ from the contract's (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 2.0, 5.0)",
        ),
        (
            "mistyped",
            "stock_lock_expired_while_held_total",
            "declared gauge; the contract type is counter",
        ),
    ]


def test_unbounded_values() -> None:
    registry = CollectorRegistry()
    paid = Counter(catalog.ORDERS_PAID.base_name, "h", ["sku"], registry=registry)
    for n in range(101):
        paid.labels(f"SKU-{n}").inc()
    conflict = Counter(
        catalog.RESERVATION_CONFLICT.base_name, "h", ["sku", "reason"], registry=registry
    )
    conflict.labels("A b", "sold_out").inc()
    text = generate_latest(registry).decode()
    problems = [p for p in kinds(text) if p[0] == "unbounded"]
    assert problems == [
        (
            "unbounded",
            "stock_reservation_conflict_total",
            "sku='A b' not a guarded value (at most 64 characters of [A-Za-z0-9_.:/@#+\\-])",
        ),
        (
            "unbounded",
            "stock_reservation_conflict_total",
            "reason='sold_out' not one of " + ", ".join(catalog.CONFLICT_REASONS),
        ),
        (
            "unbounded",
            "stock_orders_paid_total",
            "101 distinct sku values, more than 100 (fold the rest into __other__)",
        ),
    ]
    assert not [p for p in kinds(text, max_values=200) if "distinct" in p[2]]


def test_openmetrics_counters_are_accepted() -> None:
    text = conforming()
    om = text.replace("# TYPE stock_orders_paid_total counter", "# TYPE stock_orders_paid counter")
    assert kinds(om) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('stock_x{a="1" 1\n', "line 1: expected , or } after label a"),
        ("stock_x{a=1} 1\n", "line 1: malformed label"),
        ("stock_x one\n", "line 1: 'one' is not a number"),
        ("# TYPE stock_x\n", "line 1: malformed # TYPE line"),
        ("# TYPE stock_x bogus\n", "line 1: unknown metric type 'bogus'"),
        ('stock_x 1\nstock_y{a="\\q"} 1\n', "line 2: bad escape in label a"),
        ('{a="1"} 1\n', "line 1: expected a metric name"),
    ],
)
def test_bad_expositions_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ExpositionError, match=None) as info:
        parse(text)
    assert str(info.value).startswith(message)


def test_parse_bounds_the_samples() -> None:
    with pytest.raises(ExpositionError, match="more than 2 samples"):
        parse("a 1\nb 1\nc 1\n", max_samples=2)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["check-metrics", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.prom"
    good.write_text(conforming())
    assert run([str(good)], capsys)[:2] == (
        0,
        f"{good}: conforms to the metric contract (4 contract metrics)\n",
    )
    bad = tmp_path / "bad.prom"
    bad.write_text(
        conforming().replace(
            "# TYPE stock_orders_paid_total counter", "# TYPE stock_orders_paid_total gauge"
        )
    )
    code, out, _ = run([str(bad), "--format", "json"], capsys)
    assert code == 1
    assert json.loads(out)["problems"] == [
        {
            "kind": "mistyped",
            "metric": "stock_orders_paid_total",
            "message": "declared gauge; the contract type is counter",
        }
    ]
    code, out, _ = run([str(bad)], capsys)
    assert code == 1
    assert "  MISTYPED  stock_orders_paid_total: declared gauge" in out


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        (b"\xff\xfe", [], "not UTF-8 text (byte 0)"),
        (b"stock_x{\n", [], "line 1: malformed label at column 9"),
        (b"a 1\n" * 100, ["--max-bytes", "10"], "larger than --max-bytes (10)"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    extra: list[str],
    message: str,
) -> None:
    path = tmp_path / "in.prom"
    path.write_bytes(content)
    code, out, err = run([str(path), *extra], capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"stocksentry check-metrics: error: {path}: ")
    assert message in err


def test_cli_refuses_directories_missing_files_and_no_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run([str(tmp_path)], capsys)[2].endswith("is not a regular file\n")
    assert run([str(tmp_path / "nope")], capsys)[2].endswith("no such file\n")
    code, _, err = run([], capsys)
    assert code == 2
    assert "give a URL or FILE" in err


def test_cli_prints_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--print-contract"], capsys)
    assert code == 0
    assert json.loads(out) == contract()
