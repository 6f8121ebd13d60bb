"""Real HTTP servers on 127.0.0.1 implementing the engines' documented profiling endpoints.

vLLM (``reference/engine-apis.md`` §1.6): ``POST /start_profile`` and ``/stop_profile`` exist
only when the server was launched with a profiler (404 otherwise); a JSON body from 0.32
(strict ints, extra keys ignored; 400 on bad values); 409 with vLLM's JSON error on a second
start from 0.32; 200 with an empty body on success; ``GET /version``.

SGLang (§2.3): the routes always exist, take an optional JSON body (ints coerced leniently,
unknown keys ignored), answer ``Start profiling.`` / ``Stop profiling. ...`` as text, a
scheduler failure is a bare 500 ``Internal Server Error``, and with an API key the caller
needs ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import sglang as sg
from . import vllm as vd


class _Server:
    def __init__(self) -> None:
        self.paths: list[tuple[str, str, Any, dict[str, str]]] = []
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def handle(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, str]:
        raise NotImplementedError

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.paths.append((method, self.path, body, headers))
                status, ctype, text = server.handle(method, self.path, body, headers)
                data = text.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (a timeout under test)
                    pass

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        return Handler


class VLLMServer(_Server):
    """A vLLM OpenAI server of ``version`` (``"0.10"``, ``"0.17"``, ``"0.32"``, ``"0.33"``).

    ``enabled``: launched with a profiler. ``stop_delay``: seconds a stop takes (flushing).
    """

    def __init__(self, version: str, trace_dir: str | None, *, enabled: bool = True, stop_delay: float = 0.0,
                 start_delay: float = 0.0) -> None:
        self.engine = vd.SYNC[version](trace_dir if enabled else None)
        self.engine.stop_delay = stop_delay
        self.engine.start_delay = start_delay
        self.enabled = enabled
        self.body_since_032 = vd._v(self.engine.version) >= (0, 32)
        super().__init__()

    def handle(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, str]:
        if path == "/version" and method == "GET":
            return 200, "application/json", json.dumps({"version": self.engine.version})
        if not self.enabled or path not in ("/start_profile", "/stop_profile") or method != "POST":
            return 404, "application/json", json.dumps({"detail": "Not Found"})
        try:
            if path == "/stop_profile":
                self.engine.stop_profile()
                return 200, "text/plain", ""
            if not self.body_since_032:
                self.engine.start_profile()  # type: ignore[call-arg]
                return 200, "text/plain", ""
            data = json.loads(body) if body else {}
            kwargs: dict[str, Any] = {}
            for key in ("profile_prefix", "delay_iterations", "max_iterations", "profiler_kwargs"):
                value = data.get(key)
                if value is None:
                    continue
                if key.endswith("iterations") and (isinstance(value, bool) or not isinstance(value, int)):
                    return 400, "application/json", json.dumps({"error": {"message": f"{key}: must be int"}})
                if key == "profiler_kwargs" and vd._v(self.engine.version) < (0, 33):
                    continue  # not a field of 0.32's StartProfileRequest: extra="ignore"
                kwargs[key] = value
            prefix = kwargs.pop("profile_prefix", None)
            self.engine.start_profile(prefix, **kwargs)  # type: ignore[call-arg]
            return 200, "text/plain", ""
        except vd.ProfilerAlreadyActiveError as exc:
            return 409, "application/json", json.dumps(
                {"error": {"message": str(exc), "type": "Conflict", "code": 409}})
        except ValueError as exc:
            return 400, "application/json", json.dumps({"error": {"message": str(exc)}})
        except Exception:
            return 500, "text/plain", "Internal Server Error"


class HangingServer(_Server):
    """Accepts ``/start_profile``, answers ``/stop_profile`` only when closed (``answered`` counts the answers)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.answered = 0
        super().__init__()

    def handle(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, str]:
        if path == "/stop_profile":
            self.release.wait(600)  # closing releases it: the wait only has to outlast any test
            self.answered += 1
        return 200, "text/plain", ""

    def close(self) -> None:
        self.release.set()
        super().close()


class SGLangServer(_Server):
    """An SGLang HTTP server of 0.5.23 or 0.5.12 (``version``), backed by the scheduler double."""

    def __init__(self, version: str = "0.5.23", *, api_key: str | None = None) -> None:
        self.manager: sg._TokenizerBase = (sg.TokenizerManager_0_5_23() if version == "0.5.23"
                                           else sg.TokenizerManager_0_5_12())
        self.api_key = api_key
        self.version = version
        self.fields = set(sg.ProfileReq.__struct_fields__) - {"rid", "http_worker_ipc", "req_type"}
        if version != "0.5.23":
            self.fields -= {"profile_id", "detailed_annotations"}
        super().__init__()

    @property
    def scheduler(self) -> sg.Scheduler:
        return self.manager.scheduler

    def handle(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, str]:
        if path == "/get_server_info" and method == "GET":  # every SGLang answers it, with its version
            return 200, "application/json", json.dumps({"version": self.version, "tp_size": 1})
        if path not in ("/start_profile", "/stop_profile"):
            return 404, "application/json", json.dumps({"detail": "Not Found"})
        if self.api_key and headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, "application/json", json.dumps({"error": "Unauthorized"})
        try:
            if path == "/stop_profile":
                asyncio.run(self.manager.stop_profile())
                return 200, "text/plain", "Stop profiling. This will take some time.\n"
            data = json.loads(body) if body else {}
            fields = {k: v for k, v in data.items() if k in self.fields}
            for key in ("num_steps", "start_step"):  # pydantic lax mode: "5" -> 5
                if isinstance(fields.get(key), str):
                    fields[key] = int(fields[key])
            if isinstance(self.manager, sg.TokenizerManager_0_5_23):
                asyncio.run(self.manager.start_profile(sg.ProfileReq(**fields)))
            else:
                asyncio.run(self.manager.start_profile(**fields))
            return 200, "text/plain", "Start profiling.\n"
        except RuntimeError:
            return 500, "text/plain", "Internal Server Error"


def wait_until(predicate: Any, timeout: float = 5.0) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def gated(gate: threading.Event, call: Any) -> Any:
    """Return ``call``, made to run only once ``gate`` is set (a test's release, in place of a sleep)."""
    def when_released(*args: Any, **kwargs: Any) -> Any:
        gate.wait(600)
        return call(*args, **kwargs)

    return when_released
