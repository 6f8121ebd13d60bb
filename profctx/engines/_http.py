"""The HTTP calls of the engine adapters, made with httpx (the ``engines`` extra).

One short-lived client per call (control calls are rare: two per capture), JSON bodies in and
text bodies out, bounded three ways: the whole call by the caller's timeout, each read of the
body by :data:`READ_TIMEOUT`, and the body's size by :data:`MAX_BODY` (a control endpoint
answers a few bytes; a server streaming without end must not fill the trainer's memory).
TLS certificates are verified with the system's trust store; the bearer token is a header.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..util._errors import ConfigError

#: The most body bytes read from one answer; more is an error, not a truncation.
MAX_BODY = 1 << 20
#: Seconds one read of an answer's body may wait for the next bytes.
READ_TIMEOUT = 30.0
#: Seconds connecting (TCP and TLS) may take, at most.
CONNECT_TIMEOUT = 10.0


class Unreachable(ConnectionError):  # noqa: N818 - reads as a state: the server is unreachable
    """Raise when the server cannot be connected to (refused, unknown host, network down, TLS refused)."""


class ResponseTooLarge(ConnectionError):  # noqa: N818 - reads as a state
    """Raise when an answer's body passes the size limit."""


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


def require_client() -> None:
    """Raise :class:`ConfigError` when the HTTP client (httpx) is not installed."""
    try:
        import httpx  # noqa: F401
    except ImportError:
        raise ConfigError("engines (HTTP adapter)", "httpx not installed",
                          "install the engines extra: pip install 'profctx[engines]'") from None


async def request(
    method: str,
    url: str,
    *,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float | None = None,
    limit: int = MAX_BODY,
    read_timeout: float = READ_TIMEOUT,
) -> Response:
    """Send one request and return the response; JSON-encode ``body`` when it is not ``None``.

    Raise :class:`Unreachable` when connecting fails, :class:`ResponseTooLarge` when the body
    passes ``limit`` bytes, ``TimeoutError`` after ``timeout`` seconds in total or when one
    read of the body waits more than ``read_timeout`` seconds, and ``ConnectionError`` for a
    broken answer. Cancelling the awaiting task closes the connection.
    """
    return await asyncio.wait_for(_request(method, url, body, headers or {}, timeout, limit, read_timeout), timeout)


async def _request(method: str, url: str, body: Any, headers: dict[str, str], timeout: float | None,
                   limit: int, read_timeout: float) -> Response:
    import httpx

    # The head may take as long as the call (a stop answers once the trace is flushed); the body's
    # reads are bounded separately below.
    # A little over the call's own limit, so that the caller's timeout is the one that fires.
    head = None if timeout is None else timeout + 5.0
    limits = httpx.Timeout(head, connect=min(CONNECT_TIMEOUT, timeout) if timeout else CONNECT_TIMEOUT)
    payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    sent = {"Accept": "application/json, text/plain, */*", **headers}
    if payload is not None:
        sent["Content-Type"] = "application/json"
    try:
        # The system trust store (as Python's ssl module loads it), not a bundled one; no proxy from the env.
        async with httpx.AsyncClient(timeout=limits, follow_redirects=False, trust_env=False,
                                     verify=ssl.create_default_context()) as client, \
                client.stream(method, url, content=payload, headers=sent) as response:
            data = await _read(response.aiter_bytes(), limit, read_timeout, url)
            status, encoding = response.status_code, response.encoding or "utf-8"
    except httpx.ConnectError as exc:
        raise Unreachable(f"cannot connect to {_origin(url)}: {exc}") from exc
    except httpx.TimeoutException as exc:
        raise TimeoutError(f"{url}: {type(exc).__name__}") from exc
    except httpx.HTTPError as exc:
        raise ConnectionError(f"{url}: {type(exc).__name__}: {exc}") from exc
    return Response(status, data.decode(encoding, errors="replace"))


async def _read(chunks: Any, limit: int, read_timeout: float, url: str) -> bytes:
    out = bytearray()
    iterator = chunks.__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(iterator.__anext__(), read_timeout)
        except StopAsyncIteration:
            return bytes(out)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{url}: no body bytes for {read_timeout:g} s") from None
        out += chunk
        if len(out) > limit:
            raise ResponseTooLarge(f"{url} answered more than {limit} bytes; a profiling endpoint answers a few")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
