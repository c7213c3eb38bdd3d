"""The drill's untested edges without a service: bad files and arguments (one line naming
file, line and key, exit 2, before anything is sent), the wire's odd answers (chunked, not
HTTP, none within the timeout), what counts as a sale, and reports of scenarios that could
not be judged."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from stocksentry.exporter.cli import main
from stocksentry.exporter.drill.report import format_json, format_text
from stocksentry.exporter.drill.report_html import format_html
from stocksentry.exporter.drill.scenarios import ScenarioResult, success_of
from stocksentry.exporter.drill.wire import Request, send_one

GOOD = """\
target:
  checkout:
    url: http://127.0.0.1:8080/checkout/atomic
    headers:
      Idempotency-Key: "{idempotency_key}"
    body: |
      {"sku": "{sku}", "qty": {qty}}
  success:
    status: [200, 201]
database:
  url: postgresql://shop@127.0.0.1/shop
drill:
  sku: EGG-01
"""


def run(tmp_path: Path, text: str, *extra: str) -> int:
    path = tmp_path / "drill.yaml"
    path.write_text(text, encoding="utf-8")
    return main(["drill", "--config", str(path), "--yes", *extra])


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    return captured.err.rstrip("\n")


@pytest.mark.parametrize(
    ("old", "new", "line", "message"),
    [
        # The URL reader raised ValueError here: a traceback instead of this line.
        (
            "http://127.0.0.1:8080/checkout/atomic",
            "http://[::1/checkout",
            3,
            "target.checkout.url: expected an http:// or https:// URL",
        ),
        # Accepted, then the connection's IDNA encoding raised mid-drill (a traceback).
        (
            "http://127.0.0.1:8080/checkout/atomic",
            "http://shop..example/checkout",
            3,
            "target.checkout.url: not a valid host name",
        ),
        (
            "http://127.0.0.1:8080/checkout/atomic",
            "http://127.0.0.1:99999/checkout",
            3,
            "target.checkout.url: not a valid port",
        ),
        (
            "http://127.0.0.1:8080/checkout/atomic",
            "http://127.0.0.1:8080/checkout/{nope}",
            3,
            "target.checkout.url: unknown placeholder {nope}",
        ),
        (
            '      Idempotency-Key: "{idempotency_key}"',
            "      - Idempotency-Key",
            5,
            "target.checkout.headers: expected a mapping of header names to values",
        ),
        (
            '      Idempotency-Key: "{idempotency_key}"',
            '      "Idempotency Key": x',
            5,
            "target.checkout.headers: not an HTTP header name",
        ),
        (
            '      Idempotency-Key: "{idempotency_key}"',
            "      Host: shop.example",
            5,
            "target.checkout.headers.Host: is set by the drill itself",
        ),
        # A header value carrying a second header (or a second request): refused.
        (
            '      Idempotency-Key: "{idempotency_key}"',
            '      X-Note: "a\\r\\nX-Admin: 1"',
            5,
            "target.checkout.headers.X-Note: must be one line",
        ),
        (
            '    body: |\n      {"sku": "{sku}", "qty": {qty}}',
            "    body:\n      sku: EGG-01",
            7,
            "target.checkout.body: write the body as JSON text",
        ),
        (
            "    status: [200, 201]",
            "    status: 200",
            9,
            "target.success.status: expected a list of status codes",
        ),
        (
            "    status: [200, 201]",
            "    status: [{code: 200}]",
            9,
            "target.success.status[0]: expected a status code",
        ),
        (
            "  sku: EGG-01",
            "  sku: EGG-01\n  scenarios: [stale_availability]",
            14,
            "drill.scenarios: stale_availability needs target.availability",
        ),
        (
            "  sku: EGG-01",
            "  sku: EGG-01\n  scenarios: [burst, observability]",
            14,
            "drill.scenarios: observability needs observability.metrics_url or prometheus_url",
        ),
    ],
)
def test_bad_file_is_one_line_naming_file_line_and_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    old: str,
    new: str,
    line: int,
    message: str,
) -> None:
    assert old in GOOD
    assert run(tmp_path, GOOD.replace(old, new, 1)) == 2
    err = one_error_line(capsys)
    assert err.startswith(f"stocksentry drill: error: {tmp_path / 'drill.yaml'}:{line}: {message}")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://[::1/checkout", "--checkout-url: expected an http:// or https:// URL"),
        ("http://shop..example/checkout", "--checkout-url: not a valid host name"),
        ("http://127.0.0.1:0x50/checkout", "--checkout-url: not a valid port"),
    ],
)
def test_bad_checkout_url_argument_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, message: str
) -> None:
    assert run(tmp_path, GOOD, "--checkout-url", url) == 2
    assert message in one_error_line(capsys)


def test_a_scenario_the_file_cannot_run_is_refused_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(tmp_path, GOOD, "--scenario", "burst", "--scenario", "duplicate_callback") == 2
    err = one_error_line(capsys)
    assert err == "stocksentry drill: error: --scenario: duplicate_callback needs target.callback"


def test_a_database_url_the_driver_cannot_take_is_one_line_without_the_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port that is not a number passes the URL keys' check; the engine refuses it: a
    line, exit 2, nothing sent and no password shown."""
    monkeypatch.setenv("SHOP_DB", "postgresql://shop:hunter2@127.0.0.1:notaport/shop")
    text = GOOD.replace("url: postgresql://shop@127.0.0.1/shop", "url_env: SHOP_DB")
    assert run(tmp_path, text) == 2
    err = one_error_line(capsys)
    assert "database: cannot use" in err
    assert "hunter2" not in err


# --- the wire -----------------------------------------------------------------------------


async def answer_with(raw: bytes | None, request: Request | None = None) -> tuple[int, bytes, str]:
    """Send one request to a server that answers ``raw`` (``None``: never answers);
    ``(status, body, error)`` of the response."""
    hold = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if raw is None:
            await hold.wait()  # never answers: the drill's timeout must end the wait
        else:
            writer.write(raw)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        sent = request or Request("GET", f"http://127.0.0.1:{port}/availability")
        # A generous bound on the whole exchange: the drill's own limit is what is tested.
        response = await asyncio.wait_for(send_one(sent, wait_s=0.5), 30)
        hold.set()
    return response.status, response.body, response.error or ""


async def test_a_chunked_answer_is_read_whole() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: Chunked\r\n"
        b'\r\n5\r\n{"ok"\r\n8;note=x\r\n: true}\n\r\n0\r\n\r\n'
    )
    assert await answer_with(raw) == (200, b'{"ok": true}\n', "")


async def test_an_answer_that_is_not_http_is_an_error_not_a_sale() -> None:
    status, _, error = await answer_with(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    assert (status, error) == (0, "not an HTTP response")


async def test_a_server_that_never_answers_times_out() -> None:
    status, body, error = await answer_with(None)
    assert (status, body, error) == (0, b"", "timed out")


# --- what counts as a sale ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "field", "sale"),
    [
        (201, b"", None, True),  # the status alone decides
        (409, b'{"ok": true}', None, False),
        (200, b"<html>ok</html>", "ok", False),  # not JSON: not a sale
        (200, b'{"order": {"id": 7}}', "order.id", True),
        (200, b'{"order": {"id": 0}}', "order.id", False),
        (200, b'{"order": null}', "order.id", False),
        (200, b'{"order": []}', "order", False),
        (200, b'{"order": {"lines": ["x"]}}', "order.lines", True),
    ],
)
def test_what_counts_as_a_sale(status: int, body: bytes, field: str | None, sale: bool) -> None:
    assert success_of(status, body, (200, 201), field) is sale


# --- reports of scenarios that could not be judged ----------------------------------------

TARGET = {"checkout": "POST http://shop/checkout", "database": "postgresql://db/shop", "sku": "X"}


def test_reports_of_unjudged_scenarios_never_read_as_a_pass() -> None:
    results = [
        ScenarioResult("burst", unverified="database postgresql://db/shop: gone"),
        ScenarioResult("retry", unverified="database postgresql://db/shop: gone"),
    ]
    text = format_text(results, target=TARGET, restored="nothing was sent or written")
    assert "burst               UNVERIFIED" in text
    assert "not verified: database postgresql://db/shop: gone" in text
    assert "retry: not verified" in text
    assert text.rstrip().endswith(
        "verdict: UNVERIFIED (2 of 2 scenarios could not be judged: not a pass)"
    )
    assert max(len(line) for line in text.splitlines()) <= 80
    assert '"verdict": "unverified"' in format_json(results, target=TARGET, restored=None)

    page = format_html(results, target=TARGET, restored=None, command="stocksentry drill")
    assert "No scenario sold anything." in page
    assert "No response was read." in page
    assert "The burst did not run." in page
    assert "<span class=verdict-unverified>UNVERIFIED</span>" in page
    assert "class=verdict-pass" not in page


def test_figures_the_summary_does_not_know_are_listed_as_they_are() -> None:
    # A burst stopped half way: the summary's template lacks its figures; all are shown.
    result = ScenarioResult("burst", figures={"stock": 10, "requests": 50}, unverified="x")
    text = format_text([result], target=TARGET, restored=None)
    assert "UNVERIFIED stock 10, requests 50" in text
