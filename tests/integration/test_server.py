"""The exporter's HTTP server, through aiohttp's test client and over real sockets.

Real worker processes write the multiprocess directory, real TLS handshakes run against
trustme certificates, real bcrypt hashes guard basic auth, and ``run_server`` runs in a
subprocess that receives a real SIGTERM.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import os
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import bcrypt
import pytest
import trustme
from aiohttp import web
from polling import async_wait_until
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families as parse_text
from pytest_aiohttp import AiohttpClient
from scraped import value as sample
from stocksentry.exporter.server import (
    BASIC_AUTH,
    LIFECYCLE,
    RENDERER,
    ServerSettings,
    create_app,
    serving,
)
from stocksentry.exporter.server.app import (
    CONTENT_TYPE_OPENMETRICS,
    CONTENT_TYPE_TEXT,
    wants_gzip,
    wants_openmetrics,
)
from stocksentry.exporter.webconfig import (
    WebConfig,
    WebConfigError,
    load_web_config,
    parse_web_config,
)

# The OpenMetrics parser is untyped in prometheus_client; this gives it a type once.
parse_openmetrics: Callable[[str], Iterable[Metric]] = (
    openmetrics_parser.text_string_to_metric_families
)

pytestmark = pytest.mark.integration
OPENMETRICS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"

APP_WORKER = textwrap.dedent(
    """
    import sys
    from prometheus_client import Counter

    orders = Counter("shop_orders_paid", "Paid orders.", ["sku"])
    orders.labels("SKU-1").inc(int(sys.argv[1]))
    """
)


@pytest.fixture
def multiproc_dir(tmp_path: Path) -> Path:
    """Two exited app workers that paid 2 and 3 orders of SKU-1."""
    directory = tmp_path / "prom"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    procs = [subprocess.Popen([sys.executable, "-c", APP_WORKER, n], env=env) for n in "23"]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    return directory


@pytest.fixture
def probes() -> CollectorRegistry:
    """Stands in for the probes' collector: a registry with a histogram and an exemplar."""
    registry = CollectorRegistry()
    latency = Histogram(
        "probe_query_seconds", "Probe query time.", buckets=(0.1, 0.5, 1.0), registry=registry
    )
    latency.observe(0.3, exemplar={"trace_id": TRACE_ID})
    Counter("probe_runs", "Probe runs.", registry=registry).inc(4)
    return registry


def settings(**overrides: object) -> ServerSettings:
    values: dict[str, object] = {"listen_address": "127.0.0.1", "port": 0}
    values.update(overrides)
    return ServerSettings(**values)  # type: ignore[arg-type]


def by_name(families: list[Metric]) -> dict[str, Metric]:
    names = [family.name for family in families]
    assert len(names) == len(set(names)), names
    return {family.name: family for family in families}


# --- /metrics --------------------------------------------------------------------------------


async def test_metrics_text_merges_multiprocess_collectors_and_process(
    aiohttp_client: AiohttpClient, multiproc_dir: Path, probes: CollectorRegistry
) -> None:
    app = create_app(settings(multiprocess_dir=multiproc_dir), collectors=[probes])
    client = await aiohttp_client(app)

    response = await client.get("/metrics", headers={"Accept": "text/plain"})

    assert response.status == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE_TEXT
    text = await response.text()
    families = list(parse_text(text))
    names = by_name(families)
    assert sample(families, "shop_orders_paid_total", sku="SKU-1") == 5
    assert sample(families, "probe_runs_total") == 4
    assert sample(families, "probe_query_seconds_bucket", le="0.5") == 1
    assert sample(families, "stocksentry_multiprocess_files") == 2
    assert "process_cpu_seconds" in names
    assert "python_info" in names
    errors = {"multiprocess": 0, "CollectorRegistry": 0, "process": 0}
    for collector, count in errors.items():
        assert sample(families, "stocksentry_collector_errors_total", collector=collector) == count
    # The text format has no exemplars and no EOF marker.
    assert TRACE_ID not in text
    assert "# EOF" not in text
    # Our own counter comes last.
    assert families[-1].name == "stocksentry_collector_errors"


async def test_openmetrics_carries_the_exemplar(
    aiohttp_client: AiohttpClient, probes: CollectorRegistry
) -> None:
    client = await aiohttp_client(create_app(settings(), collectors=[probes]))

    response = await client.get("/metrics", headers={"Accept": OPENMETRICS_ACCEPT})

    assert response.status == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE_OPENMETRICS
    text = await response.text()
    assert text.endswith("\n# EOF\n")
    assert text.count("# EOF") == 1
    families = list(parse_openmetrics(text))
    (bucket,) = [
        s
        for s in by_name(families)["probe_query_seconds"].samples
        if s.name == "probe_query_seconds_bucket" and s.labels == {"le": "0.5"}
    ]
    assert bucket.value == 1
    assert bucket.exemplar is not None
    assert bucket.exemplar.labels == {"trace_id": TRACE_ID}
    assert bucket.exemplar.value == 0.3
    assert sample(families, "stocksentry_collector_errors_total", collector="process") == 0


def test_content_negotiation() -> None:
    assert wants_openmetrics(OPENMETRICS_ACCEPT)
    assert wants_openmetrics("application/openmetrics-text")
    assert not wants_openmetrics("")
    assert not wants_openmetrics("*/*")
    assert not wants_openmetrics("text/plain;version=0.0.4")
    assert not wants_openmetrics("application/openmetrics-text;version=2.0.0")
    assert not wants_openmetrics("application/openmetrics-text;q=0.1,text/plain;q=0.9")
    assert wants_gzip("gzip")
    assert wants_gzip("deflate, gzip;q=0.5")
    assert wants_gzip("*")
    assert not wants_gzip("identity")
    assert not wants_gzip("gzip;q=0")


async def test_gzip_when_accepted(
    aiohttp_client: AiohttpClient, probes: CollectorRegistry
) -> None:
    client = await aiohttp_client(
        create_app(settings(), collectors=[probes]), auto_decompress=False
    )

    zipped = await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})

    assert zipped.status == 200
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert zipped.headers["Vary"] == "Accept, Accept-Encoding"
    unzipped = gzip.decompress(await zipped.read()).decode()
    assert sample(list(parse_text(unzipped)), "probe_runs_total") == 4
    assert "Content-Encoding" not in plain.headers
    assert sample(list(parse_text(await plain.text())), "probe_runs_total") == 4


class Exploding:
    """A collector whose snapshot is broken."""

    name = "exploding"

    def collect(self) -> list[Metric]:
        raise RuntimeError("probe snapshot is broken")


class Repeating:
    """A collector that exposes a family another collector already exposed."""

    def collect(self) -> list[Metric]:
        return [GaugeMetricFamily("probe_runs", "Clash.", value=1)]


async def test_failing_collectors_are_skipped_and_counted(
    aiohttp_client: AiohttpClient, probes: CollectorRegistry
) -> None:
    app = create_app(settings(), collectors=[Exploding(), probes, Repeating()])
    client = await aiohttp_client(app)

    for scrape in (1, 2):
        response = await client.get("/metrics")
        assert response.status == 200
        families = list(parse_text(await response.text()))
        assert sample(families, "probe_runs_total") == 4
        assert sample(families, "stocksentry_collector_errors_total", collector="exploding") == (
            scrape
        )
        assert sample(families, "stocksentry_collector_errors_total", collector="Repeating") == (
            scrape
        )
        assert (
            sample(families, "stocksentry_collector_errors_total", collector="CollectorRegistry")
            == 0
        )
    assert app[RENDERER].errors() == {
        "exploding": 2,
        "CollectorRegistry": 0,
        "Repeating": 2,
        "process": 0,
    }


# --- health, readiness, landing page ---------------------------------------------------------


async def test_health_readiness_and_landing_page(aiohttp_client: AiohttpClient) -> None:
    app = create_app(settings(metrics_path="/stock-metrics"))
    client = await aiohttp_client(app)

    health = await client.get("/healthz")
    assert (health.status, await health.text()) == (200, "ok\n")
    ready = await client.get("/readyz")
    assert (ready.status, await ready.text()) == (200, "ready\n")
    landing = await client.get("/")
    assert landing.status == 200
    assert landing.headers["Content-Type"] == "text/html; charset=utf-8"
    page = await landing.text()
    for link in ('href="/stock-metrics"', 'href="/healthz"', 'href="/readyz"'):
        assert link in page
    assert (await client.get("/stock-metrics")).status == 200
    assert (await client.get("/metrics")).status == 404


async def test_readiness_waits_for_background_startup_and_ends_at_shutdown(
    aiohttp_client: AiohttpClient,
) -> None:
    seen: list[tuple[str, bool]] = []
    gate = asyncio.Event()

    async def probe_runner(app: web.Application) -> AsyncIterator[None]:
        seen.append(("startup", app[LIFECYCLE].ready))
        task = asyncio.create_task(gate.wait())
        yield
        seen.append(("cleanup", app[LIFECYCLE].ready))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app = create_app(settings(), background=[probe_runner])
    assert not app[LIFECYCLE].ready

    client = await aiohttp_client(app)
    ready = await client.get("/readyz")
    assert (ready.status, await ready.text()) == (200, "ready\n")
    await client.close()

    assert seen == [("startup", False), ("cleanup", False)]
    assert app[LIFECYCLE].stopping


async def test_readyz_answers_503_while_starting() -> None:
    # aiohttp opens the listener only after start-up, so "starting" cannot be reached
    # over HTTP by waiting; the state is set back by hand to see how /readyz answers it.
    app = create_app(settings())
    async with serving_app(app) as url, aiohttp.ClientSession() as session:
        app[LIFECYCLE].started = False
        async with session.get(url + "readyz") as response:
            assert (response.status, await response.text()) == (503, "not ready: starting\n")


@contextlib.asynccontextmanager
async def serving_app(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/"
    finally:
        await runner.cleanup()


# --- TLS -------------------------------------------------------------------------------------


@dataclass
class Certs:
    ca: trustme.CA
    dir: Path
    client: trustme.LeafCert

    def client_context(
        self, *, maximum: ssl.TLSVersion | None = None, with_cert: bool = False
    ) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.ca.configure_trust(context)
        if maximum is not None:
            with warnings.catch_warnings():
                # TLS 1.0/1.1 are deprecated in Python; this client is the attacker.
                warnings.simplefilter("ignore", DeprecationWarning)
                context.minimum_version = ssl.TLSVersion.TLSv1
                context.maximum_version = maximum
            # Let OpenSSL offer old protocols at all, so that the *server* refuses them.
            context.set_ciphers("DEFAULT:@SECLEVEL=0")
        if with_cert:
            self.client.configure_cert(context)
        return context


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(directory / "server.crt")
    server.private_key_pem.write_to_path(directory / "server.key")
    ca.cert_pem.write_to_path(directory / "ca.crt")
    return Certs(ca, directory, ca.issue_cert("prometheus@example.com"))


def tls_config(certs: Certs, extra: str = "") -> WebConfig:
    path = certs.dir / "web.yml"
    path.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n" + extra
    )
    return load_web_config(path)


def handshake(port: int, context: ssl.SSLContext) -> str:
    """A bare TLS handshake; returns the negotiated version."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        return str(tls.version())


def old_protocol_server(certs: Certs) -> tuple[int, threading.Thread, list[str]]:
    """A one-shot stdlib TLS server that allows TLS 1.1: proves the client offers it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.load_cert_chain(certs.dir / "server.crt", certs.dir / "server.key")
    listener = socket.create_server(("127.0.0.1", 0))
    versions: list[str] = []

    def accept() -> None:
        with (
            listener,
            listener.accept()[0] as raw,
            context.wrap_socket(raw, server_side=True) as tls,
        ):
            versions.append(str(tls.version()))

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread, versions


async def test_tls_accepts_12_and_refuses_11(certs: Certs) -> None:
    tls11 = certs.client_context(maximum=ssl.TLSVersion.TLSv1_1)
    # Control: this client really speaks TLS 1.1 when a server lets it.
    port, thread, versions = old_protocol_server(certs)
    assert await asyncio.to_thread(handshake, port, tls11) == "TLSv1.1"
    thread.join(5)
    assert versions == ["TLSv1.1"]

    async with serving(settings(web_config=tls_config(certs))) as server:
        assert server.url.startswith("https://127.0.0.1:")
        tls12 = certs.client_context(maximum=ssl.TLSVersion.TLSv1_2)
        assert await asyncio.to_thread(handshake, server.port, tls12) == "TLSv1.2"
        async with aiohttp.ClientSession() as session:
            async with session.get(server.url + "metrics", ssl=tls12) as response:
                assert response.status == 200
            async with session.get(server.url + "metrics", ssl=certs.client_context()) as r13:
                assert r13.status == 200
        # asyncio's TLS server drops the connection instead of sending the alert.
        with pytest.raises(ssl.SSLError, match=r"UNEXPECTED_EOF|TLSV1_ALERT_PROTOCOL_VERSION"):
            await asyncio.to_thread(handshake, server.port, tls11)


async def test_tls13_minimum_refuses_12(certs: Certs) -> None:
    config = tls_config(certs, "  min_version: TLS13\n")
    async with serving(settings(web_config=config)) as server:
        assert await asyncio.to_thread(handshake, server.port, certs.client_context()) == (
            "TLSv1.3"
        )
        tls12 = certs.client_context(maximum=ssl.TLSVersion.TLSv1_2)
        with pytest.raises(ssl.SSLError, match=r"UNEXPECTED_EOF|TLSV1_ALERT_PROTOCOL_VERSION"):
            await asyncio.to_thread(handshake, server.port, tls12)


async def test_client_certificates_required_and_verified(certs: Certs) -> None:
    config = tls_config(
        certs, "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
    )
    async with serving(settings(web_config=config)) as server, aiohttp.ClientSession() as session:
        url = server.url + "metrics"
        async with session.get(url, ssl=certs.client_context(with_cert=True)) as response:
            assert response.status == 200
        with pytest.raises(aiohttp.ClientError):
            async with session.get(url, ssl=certs.client_context()) as response:
                await response.read()
        stranger = trustme.CA().issue_cert("intruder@example.com")
        context = certs.client_context()
        stranger.configure_cert(context)
        with pytest.raises(aiohttp.ClientError):
            async with session.get(url, ssl=context) as response:
                await response.read()


# --- basic auth ------------------------------------------------------------------------------


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.fixture(scope="module")
def auth_config() -> WebConfig:
    hashed = bcrypt.hashpw(b"s3cret!", bcrypt.gensalt(rounds=4)).decode()
    # $2y$ is what htpasswd writes; the config accepts it like $2b$.
    return parse_web_config(
        "basic_auth_users:\n"
        f"  prometheus: '{hashed.replace('$2b$', '$2y$', 1)}'\n"
        "http_server_config:\n"
        "  headers:\n"
        "    X-Content-Type-Options: nosniff\n"
        "    X-Frame-Options: deny\n"
    )


async def test_basic_auth(aiohttp_client: AiohttpClient, auth_config: WebConfig) -> None:
    app = create_app(settings(web_config=auth_config))
    client = await aiohttp_client(app)
    challenge = 'Basic realm="stocksentry"'

    for headers in (
        {},
        basic("prometheus", "wrong"),
        basic("mallory", "s3cret!"),
        {"Authorization": "Basic !!!not-base64"},
        {"Authorization": "Bearer s3cret!"},
    ):
        refused = await client.get("/metrics", headers=headers)
        assert refused.status == 401, headers
        assert refused.headers["WWW-Authenticate"] == challenge
    assert (await client.get("/")).status == 401
    checks_before = app[BASIC_AUTH].bcrypt_checks

    for _ in range(3):
        allowed = await client.get("/metrics", headers=basic("prometheus", "s3cret!"))
        assert allowed.status == 200
        assert allowed.headers["X-Content-Type-Options"] == "nosniff"
        assert allowed.headers["X-Frame-Options"] == "deny"
    # bcrypt ran once for the three scrapes: the success is cached.
    assert app[BASIC_AUTH].bcrypt_checks == checks_before + 1
    # A wrong password after a cached success still pays bcrypt and still fails.
    assert (await client.get("/metrics", headers=basic("prometheus", "s3cret"))).status == 401
    assert app[BASIC_AUTH].bcrypt_checks == checks_before + 2

    # Probes stay open: kubelet has no credentials.
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200


async def test_tls_and_basic_auth_together(certs: Certs) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    config = tls_config(certs, f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    async with serving(settings(web_config=config)) as server, aiohttp.ClientSession() as session:
        context = certs.client_context()
        async with session.get(server.url + "metrics", ssl=context) as response:
            assert response.status == 401
        headers = basic("prometheus", "pw")
        async with session.get(server.url + "metrics", ssl=context, headers=headers) as response:
            assert response.status == 200


# --- web config errors -----------------------------------------------------------------------

_HASH = "$2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\ntls_sever_config: {}\n",
            "web.yml:4: tls_sever_config: unknown key (known: tls_server_config, "
            "http_server_config, basic_auth_users)",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  min_version: TLS11\n",
            "web.yml:4: tls_server_config.min_version: must be one of TLS12, TLS13 "
            "(TLS 1.0 and 1.1 are not supported), got 'TLS11'",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n",
            "web.yml:2: tls_server_config.key_file: missing: required with cert_file",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n"
            "  client_auth_type: RequireAnyClientCert\n",
            "web.yml:4: tls_server_config.client_auth_type: RequireAnyClientCert accepts "
            "unverified certificates and is not supported; use RequireAndVerifyClientCert",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n"
            "  client_auth_type: RequireAndVerifyClientCert\n",
            "web.yml:4: tls_server_config.client_ca_file: required when client_auth_type is "
            "RequireAndVerifyClientCert",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n"
            "  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n",
            "web.yml:4: tls_server_config.cipher_suites: unknown or insecure cipher suite "
            "'TLS_RSA_WITH_RC4_128_SHA' (supported: "
            + ", ".join(
                [
                    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
                    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
                    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
                    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
                    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
                    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
                    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
                    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
                    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
                    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
                    "TLS_RSA_WITH_AES_128_GCM_SHA256",
                    "TLS_RSA_WITH_AES_256_GCM_SHA384",
                    "TLS_RSA_WITH_AES_128_CBC_SHA256",
                    "TLS_RSA_WITH_AES_128_CBC_SHA",
                    "TLS_RSA_WITH_AES_256_CBC_SHA",
                ]
            )
            + ")",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n"
            "  prefer_server_cipher_suites: 'yes please'\n",
            "web.yml:4: tls_server_config.prefer_server_cipher_suites: must be true or false, "
            "got str 'yes please'",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  key: inline\n",
            "web.yml:4: tls_server_config.key: inline keys are not supported (secrets come "
            "from files); use key_file",
        ),
        (
            "basic_auth_users:\n  alice: hunter2\n",
            "web.yml:2: basic_auth_users.alice: must be a bcrypt hash ($2a$, $2b$ or $2y$, "
            "cost 04-31, 60 characters), e.g. from `htpasswd -nBC 10 '' | tr -d ':\\n'`",
        ),
        (
            "basic_auth_users:\n  - alice\n",
            "web.yml:2: basic_auth_users: must be a mapping, got a list",
        ),
        (
            f"basic_auth_users:\n  alice: '{_HASH}'\n  alice: '{_HASH}'\n",
            "web.yml:3: basic_auth_users.alice: duplicate key",
        ),
        (
            "http_server_config:\n  headers:\n    X-Frame-Options: allow-all\n",
            "web.yml:3: http_server_config.headers.X-Frame-Options: must be one of deny, "
            "sameorigin",
        ),
        (
            "rate_limit:\n  interval: 1s\n",
            "web.yml:1: rate_limit: not supported by stocksentry",
        ),
        (
            "tls_server_config:\n  cert_file: [a.crt\n",
            "web.yml:3: (yaml): expected ',' or ']', but got '<stream end>'",
        ),
        (
            "- just\n- a list\n",
            "web.yml:1: (top level): must be a mapping, got a list",
        ),
        (
            "[" * 10_000 + "]" * 10_000,
            "web.yml: (yaml): nested too deeply",
        ),
        (
            "http_server_config:\n  http2: !!bool maybe\n",
            "web.yml:2: http_server_config.http2: must be true or false, got bool 'maybe'",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n"
            "  client_ca_file: ca.crt\n",
            "web.yml:4: tls_server_config.client_ca_file: set without client_auth_type: set "
            "client_auth_type to RequireAndVerifyClientCert (or remove client_ca_file)",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n"
            "  min_version: TLS13\n  max_version: TLS12\n",
            "web.yml:5: tls_server_config.max_version: is lower than min_version",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n"
            "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            "web.yml:4: tls_server_config.cipher_suites: TLS_AES_128_GCM_SHA256 is a TLS 1.3 "
            "suite; TLS 1.3 suites are not configurable",
        ),
        (
            "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n"
            "  min_version: TLS13\n  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n",
            "web.yml:5: tls_server_config.cipher_suites: has no effect with min_version TLS13 "
            "(TLS 1.3 suites are fixed)",
        ),
        (
            "tls_server_config:\n  cert_file: ''\n",
            "web.yml:2: tls_server_config.cert_file: must not be empty",
        ),
        (
            "tls_server_config:\n  client_auth_type: NoClientCert\n",
            "web.yml:2: tls_server_config.client_auth_type: needs cert_file and key_file "
            "(without them TLS is off)",
        ),
        (
            'http_server_config:\n  headers:\n    Content-Security-Policy: "a\\nb"\n',
            "web.yml:3: http_server_config.headers.Content-Security-Policy: must be one line",
        ),
        (
            "basic_auth_users:\n  'a:b': x\n",
            "web.yml:2: basic_auth_users.a:b: a user name must be non-empty and contain no ':'",
        ),
    ],
)
def test_malformed_web_configs_give_one_line_errors(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError) as caught:
        load_web_config(path)
    assert str(caught.value) == f"{tmp_path}/{message}"
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("value", "secret", "kind"),
    [
        ("123456", "123456", "int value"),
        ("12.5", "12.5", "float value"),
        ("!!binary aHVudGVyMg==", "aHVudGVyMg==", "binary value"),
        # A password starting with "!" is read as a local tag on an empty value.
        ("!hunter2", "hunter2", "a tagged value"),
    ],
)
def test_a_basic_auth_value_of_the_wrong_type_is_not_echoed(
    value: str, secret: str, kind: str
) -> None:
    with pytest.raises(WebConfigError) as caught:
        parse_web_config(f"basic_auth_users:\n  prometheus: {value}\n", source="web.yml")
    assert str(caught.value) == (
        f"web.yml:2: basic_auth_users.prometheus: must be a string, got {kind} (not shown)"
    )
    assert secret not in str(caught.value)


def test_unloadable_certificate_names_its_key_and_line(tmp_path: Path) -> None:
    (tmp_path / "server.crt").write_text("not a certificate\n")
    (tmp_path / "server.key").write_text("not a key\n")
    path = tmp_path / "web.yml"
    path.write_text("# TLS\ntls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")

    with pytest.raises(WebConfigError) as caught:
        load_web_config(path)

    error = caught.value
    assert (error.line, error.key) == (3, "tls_server_config.cert_file")
    assert str(error).startswith(
        f"{path}:3: tls_server_config.cert_file: cannot load certificate "
        f"{tmp_path}/server.crt with key {tmp_path}/server.key: "
    )
    assert "\n" not in str(error)


def test_valid_web_config_is_a_typed_model(certs: Certs) -> None:
    config = tls_config(
        certs,
        "  client_auth_type: VerifyClientCertIfGiven\n"
        "  client_ca_file: ca.crt\n"
        "  max_version: TLS13\n"
        "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"
        "  prefer_server_cipher_suites: false\n"
        f"basic_auth_users:\n  alice: '{_HASH}'\n"
        "http_server_config:\n  http2: false\n  headers:\n    X-XSS-Protection: ''\n",
    )
    assert config.tls is not None
    assert config.tls.cert_file == certs.dir / "server.crt"
    assert config.tls.client_ca_file == certs.dir / "ca.crt"
    assert config.tls.client_auth_type == "VerifyClientCertIfGiven"
    assert (config.tls.min_version, config.tls.max_version) == ("TLS12", "TLS13")
    assert config.tls.cipher_suites == ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",)
    assert config.tls.prefer_server_cipher_suites is False
    assert dict(config.basic_auth_users) == {"alice": _HASH.encode()}
    assert config.http.http2 is False
    assert dict(config.http.headers) == {}
    context = config.ssl_context()
    assert context is not None
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_OPTIONAL
    assert parse_web_config("") == WebConfig(source="<web config>")


# --- run_server under SIGTERM ----------------------------------------------------------------

SERVER_SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, sys
    from pathlib import Path
    from stocksentry.exporter.server import ServerSettings, run_server

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    marker = Path(sys.argv[1])

    async def probe_runner(app):
        marker.write_text("started\\n")
        task = asyncio.create_task(asyncio.sleep(3600))
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        with marker.open("a") as f:
            f.write("cleaned up\\n")

    run_server(
        ServerSettings(listen_address="127.0.0.1", port=0, drain_seconds=2.0),
        background=[probe_runner],
    )
    print("run_server returned", file=sys.stderr, flush=True)
    """
)


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT, str(marker)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc, marker
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_sigterm_drains_cleans_up_and_exits_0(
    server_process: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, marker = server_process
    assert proc.stderr is not None
    lines: list[str] = []
    # The start-up lines: what it serves, then the warning that nothing authenticates.
    while not any("no authentication on the metrics" in line for line in lines):
        line = await asyncio.to_thread(proc.stderr.readline)
        assert line, f"server ended early: {lines}"
        lines.append(line)
    (listening,) = [line for line in lines if "listening on" in line]
    url = listening.split("listening on ")[1].split(" ")[0]
    assert url.startswith("http://127.0.0.1:")
    plain_http_warnings = [line for line in lines if "no authentication on the metrics" in line]
    assert len(plain_http_warnings) == 1

    async with aiohttp.ClientSession() as session:
        async with session.get(url + "readyz") as response:
            assert response.status == 200
        assert marker.read_text() == "started\n"

        proc.send_signal(signal.SIGTERM)
        # Draining (2 s): still serving, but no longer ready.
        answers: list[tuple[int, str]] = []

        async def readyz() -> int:
            async with session.get(url + "readyz") as response:
                answers.append((response.status, await response.text()))
                return response.status

        await async_wait_until(readyz, accept=lambda status: status != 200, timeout=30)
        assert answers[-1] == (503, "not ready: shutting down\n")
        assert set(answers[:-1]) <= {(200, "ready\n")}
        async with session.get(url + "healthz") as response:
            assert response.status == 200

    assert await asyncio.to_thread(proc.wait, 15) == 0
    rest = await asyncio.to_thread(proc.stderr.read)
    assert "received SIGTERM: shutting down" in rest
    assert "run_server returned" in rest
    assert marker.read_text() == "started\ncleaned up\n"
