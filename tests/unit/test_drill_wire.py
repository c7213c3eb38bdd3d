"""The drill's wire: a wave's requests are held back by their last byte until all are
staged, then released together; responses come back in request order."""

from __future__ import annotations

import asyncio
import json
import time

from stocksentry.exporter.drill.wire import Request, send_wave


async def test_no_request_is_complete_before_the_release() -> None:
    arrivals: list[float] = []
    staged: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        staged.append(1)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        body = await reader.readexactly(length)
        arrivals.append(time.perf_counter())
        n = json.loads(body)["n"]
        payload = json.dumps({"ok": True, "n": n}).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    requests = [
        Request(
            "POST",
            f"http://127.0.0.1:{port}/checkout",
            [("Content-Type", "application/json")],
            json.dumps({"n": n}).encode(),
        )
        for n in range(20)
    ]
    async with server:
        wave = await send_wave(requests, wait_s=10)
    assert [r.status for r in wave.responses] == [200] * 20
    # In request order, whatever order the connections opened in.
    assert [r.json()["n"] for r in wave.responses] == list(range(20))
    released = min(r.sent_at for r in wave.responses)
    # Every request's last byte went out in the release: none was whole before it.
    assert len(arrivals) == 20
    assert min(arrivals) >= released
    assert wave.spread == max(r.sent_at for r in wave.responses) - released
    assert all(r.latency >= 0 for r in wave.responses)


async def test_refused_connection_is_an_error_not_an_exception() -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    wave = await send_wave([Request("GET", f"http://127.0.0.1:{port}/")], wait_s=2)
    assert wave.responses[0].status == 0
    assert wave.responses[0].error
