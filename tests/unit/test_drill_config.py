"""The drill file: read through the exporter's config machinery; every bad file is one
line naming file, line and key, and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from stocksentry.exporter.cli import main
from stocksentry.exporter.config import ConfigError
from stocksentry.exporter.drill.config import parse_drill_config

GOOD = """\
target:
  checkout:
    url: http://127.0.0.1:8080/checkout/atomic
    headers:
      Idempotency-Key: "{idempotency_key}"
    body: |
      {"sku": "{sku}", "qty": {qty}, "ref": "{payment_reference}"}
  success:
    status: [200, 201]
    json_field: ok
database:
  url: postgresql://shop@127.0.0.1/shop
schema:
  products:
    stock: stock_left
drill:
  sku: EGG-01
  stock: 5
"""


def test_good_file_fills_placeholders() -> None:
    config = parse_drill_config(GOOD, "drill.yaml")
    assert config.drill.sku == "EGG-01"
    assert (config.drill.stock, config.drill.requests, config.drill.concurrency) == (5, 50, 20)
    assert config.schema.products.stock == "stock_left"
    method, url, headers, body = config.target.checkout.render(
        {"sku": 'EGG"01', "qty": "2", "payment_reference": "p-1", "idempotency_key": "k-1"}
    )
    assert (method, url) == ("POST", "http://127.0.0.1:8080/checkout/atomic")
    assert ("Idempotency-Key", "k-1") in headers
    assert ("Content-Type", "application/json") in headers
    # The SKU is escaped inside its JSON string; qty stays a number.
    assert body == b'{"sku": "EGG\\"01", "qty": 2, "ref": "p-1"}\n'


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("  stock: 5", "  stok: 5"),
            'drill.yaml:18: drill.stok: unknown key (did you mean "stock"?)',
        ),
        (
            ("url: http://127.0.0.1:8080/checkout/atomic", "url: ftp://x/y"),
            'drill.yaml:3: target.checkout.url: expected an http:// or https:// URL, got "ftp://x/y"',
        ),
        (
            ('"qty": {qty}', '"qty": {qty'),
            "drill.yaml:6: target.checkout.body: not JSON once its placeholders are filled",
        ),
        (
            ('"ref": "{payment_reference}"', '"ref": "{payment_ref}"'),
            "drill.yaml:6: target.checkout.body: unknown placeholder {payment_ref}",
        ),
        (("  sku: EGG-01\n", ""), "drill.yaml:17: drill.sku: is required"),
        (
            ("    status: [200, 201]", "    status: [200, 99]"),
            "drill.yaml:9: target.success.status[1]: must be at least 100, got 99",
        ),
        (
            ("  stock: 5", "  stock: 5\n  concurrency: 80"),
            "drill.yaml:19: drill.concurrency: must not be above drill.requests",
        ),
        (
            ("  stock: 5", "  stock: 5\n  scenarios: [duplicate_callback]"),
            "drill.yaml:19: drill.scenarios: duplicate_callback needs target.callback",
        ),
        (
            ("url: postgresql://shop@127.0.0.1/shop", "url: postgresql://shop:pw@127.0.0.1/shop"),
            "drill.yaml:12: database.url: the URL carries a password",
        ),
    ],
)
def test_bad_file_is_one_line_naming_line_and_key(
    change: tuple[str, str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = change
    assert old in GOOD
    text = GOOD.replace(old, new, 1)
    with pytest.raises(ConfigError) as caught:
        parse_drill_config(text, "drill.yaml")
    assert str(caught.value).startswith(expected), str(caught.value)
    path = tmp_path / "drill.yaml"
    path.write_text(text, encoding="utf-8")
    assert main(["drill", "--config", str(path), "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"stocksentry drill: error: {path}:")


def test_missing_section_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^drill.yaml:1: database: is required$"):
        parse_drill_config(GOOD.split("database:")[0], "drill.yaml")
    with pytest.raises(ConfigError, match="the file is empty"):
        parse_drill_config("", "drill.yaml")


def test_checkout_url_override_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "drill.yaml"
    path.write_text(GOOD, encoding="utf-8")
    status = main(["drill", "--config", str(path), "--yes", "--checkout-url", "nope"])
    assert status == 2
    assert "--checkout-url: expected an http:// or https:// URL" in capsys.readouterr().err


def test_the_docs_staging_file_is_valid() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "drill.md").read_text("utf-8")
    staging = docs.split("## On your own staging", 1)[1]
    block = staging.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = parse_drill_config(
        block,
        "docs/drill.md",
        environ={"STAGING_DATABASE_URL": "postgresql://drill@staging-db/shop"},
    )
    assert config.drill.sku == "DRILL-EGG-01"
    assert config.database.url_source == "env STAGING_DATABASE_URL"
    assert config.target.success.json_field == "order.id"
    assert config.schema.orders.external_ref == "payment_reference"
    assert len(config.drill.scenarios) == 5
