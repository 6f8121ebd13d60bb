"""The engines' HTTP client against raw loopback servers: size cap, per-read timeout, refused connections."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from profctx import profile_step
from profctx.engines import VLLMHttpAdapter, attach
from profctx.engines._http import ResponseTooLarge, Unreachable, request

from .conftest import configure, engine_records

CHUNK = b"x" * 65536


class RawServer:
    """A one-connection-at-a-time TCP server answering with a head and then ``body`` behaviour.

    ``mode``: ``"endless"`` streams chunks without Content-Length (until the client hangs up,
    at most 256 MiB); ``"stall"`` sends a few body bytes and then nothing.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sent = 0
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
                    if self.mode == "stall":
                        conn.sendall(b"partial")
                        self.stop.wait(10)
                        continue
                    while self.sent < 256 << 20 and not self.stop.is_set():
                        conn.sendall(CHUNK)
                        self.sent += len(CHUNK)
                except OSError:  # the client hung up: what the cap must make it do
                    continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def endless() -> Iterator[RawServer]:
    server = RawServer("endless")
    yield server
    server.close()


def test_an_endless_body_without_length_is_cut_at_the_cap(endless: RawServer) -> None:
    with pytest.raises(ResponseTooLarge, match="more than 1048576 bytes"):
        asyncio.run(request("POST", endless.url + "/start_profile", timeout=20))
    # The client hung up soon after the cap: the server could not push much more than socket buffers hold.
    assert endless.sent < 64 << 20


def test_a_smaller_cap_is_honoured(endless: RawServer) -> None:
    with pytest.raises(ResponseTooLarge, match="more than 1000 bytes"):
        asyncio.run(request("GET", endless.url, timeout=20, limit=1000))


def test_a_body_that_stops_coming_hits_the_read_timeout() -> None:
    server = RawServer("stall")
    try:
        with pytest.raises(TimeoutError, match=r"no body bytes for 0\.3 s"):
            asyncio.run(request("GET", server.url, timeout=20, read_timeout=0.3))
    finally:
        server.close()


def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Unreachable, match=f"127\\.0\\.0\\.1:{port}"):
        asyncio.run(request("GET", f"http://127.0.0.1:{port}/version", timeout=5))


def test_an_oversized_answer_is_a_recorded_failure_and_training_continues(tmp_path: Path, endless: RawServer) -> None:
    configure(tmp_path)
    attach(VLLMHttpAdapter(endless.url, version="0.33.0"))
    ran = False
    with profile_step(1), profile_step(role="rollout"):
        ran = True
    assert ran
    [record] = engine_records(tmp_path)
    assert record["status"] == "failed" and "ResponseTooLarge" in record["error"]
