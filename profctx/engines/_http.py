"""A minimal asyncio HTTP/1.1 client for engine control endpoints (no third-party dependency).

Cancellable (timeouts cancel the request instead of leaving a blocked thread behind), one
connection per request, JSON bodies in and text bodies out. Enough for ``/start_profile``
and ``/stop_profile``; not a general client.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class Unreachable(ConnectionError):  # noqa: N818 - reads as a state: the server is unreachable
    """Raise when the server cannot be connected to (refused, unknown host, network down)."""


@dataclass(frozen=True)
class Response:
    """An HTTP response: status code and decoded body text."""

    status: int
    text: str

    def json(self) -> Any:
        """Return the body parsed as JSON, or ``None`` when it is not JSON."""
        try:
            return json.loads(self.text)
        except ValueError:
            return None


def normalise(url: str) -> str:
    """Return ``url`` with a scheme and without a trailing ``/``; raise ``ValueError`` if unusable."""
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url: {url!r} is not valid; an http:// or https:// address such as http://host:8000")
    return url.rstrip("/")


async def request(
    method: str,
    url: str,
    *,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float | None = None,
) -> Response:
    """Send one request and return the response; JSON-encode ``body`` when it is not ``None``.

    Raise :class:`Unreachable` when connecting fails and ``TimeoutError`` after ``timeout``
    seconds in total.
    """
    return await asyncio.wait_for(_request(method, url, body, headers or {}), timeout)


async def _request(method: str, url: str, body: Any, headers: dict[str, str]) -> Response:
    parts = urlsplit(url)
    https = parts.scheme == "https"
    host = parts.hostname or "localhost"
    port = parts.port or (443 if https else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
    try:
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl.create_default_context() if https else None)
    except OSError as exc:
        raise Unreachable(f"cannot connect to {parts.scheme}://{host}:{port}: {exc}") from exc
    try:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close",
                 "Accept: application/json, text/plain, */*", f"Content-Length: {len(payload)}"]
        if body is not None:
            lines.append("Content-Type: application/json")
        lines += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        fields = status_line.split(" ", 2)
        if len(fields) < 2 or not fields[1].isdigit():
            raise ConnectionError(f"not an HTTP response from {url}: {status_line!r}")
        status = int(fields[1])
        info = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
        if info.get("transfer-encoding", "").lower() == "chunked":
            data = await _chunked(reader)
        elif "content-length" in info:
            data = await reader.readexactly(int(info["content-length"]))
        else:
            data = await reader.read()
    except asyncio.IncompleteReadError as exc:
        raise ConnectionError(f"{url} closed the connection before answering") from exc
    finally:
        writer.close()
    return Response(status, data.decode("utf-8", errors="replace"))


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readline()
