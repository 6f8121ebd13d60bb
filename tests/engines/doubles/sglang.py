"""Doubles of SGLang's profiling entry points: before 0.5.15 (mirrors 0.5.12) and from 0.5.15 (mirrors 0.5.23).

Mirrors ``reference/engine-apis.md``:
- ``TokenizerManager.start_profile`` keywords (0.5.12) vs one ``ProfileReq`` (0.5.15+), and
  ``Engine.start_profile(**kwargs)`` / ``Engine.start_profile(self)`` (0.4.9): §2.1, §2.3, §6.5;
- ``ProfileReq`` as a kw-only msgspec struct: unknown keywords raise ``TypeError``, values
  are not type-checked: §2.2;
- tokenizer defaults: ``with_stack``/``record_shapes`` on unless ``False`` is sent: §2.3, §6.8;
- the v1 scheduler state machine: immediate vs deferred start, ``num_steps`` auto-stop at
  the start of the next batch (N batches from 0.5.16, N-1 before), absolute ``start_step``,
  a second immediate start silently replacing the first, by-stage without ``num_steps``
  crashing the scheduler, "Profiling is not in progress" after an auto-stop: §2.4, §2.5, §6.6, §6.7;
- ``activities`` strings and silently dropped unknown ones: §2.7;
- file names, ``profile_prefix`` and ``merge_profiles`` (the merger's glob misses prefixed
  files): §2.6, §2.8.

The stage split of by-stage profiling is reduced to its two file names. Batches are driven
by the test with :meth:`Scheduler.run_batch`.
"""

from __future__ import annotations

import asyncio
import enum
import glob
import gzip
import json
import os
import time
from typing import Any, ClassVar, Optional

NOT_IN_PROGRESS = "Profiling is not in progress. Call /start_profile first."
ALREADY = "Profiling is already in progress. Call /stop_profile first."


class ProfileReqType(enum.IntEnum):
    START_PROFILE = 1
    STOP_PROFILE = 2


class ProfileReq:
    """``sglang.srt.managers.io_struct.ProfileReq`` of 0.5.23: kw-only, no type validation (§2.2)."""

    __struct_fields__: ClassVar[tuple[str, ...]] = (
        "rid", "http_worker_ipc", "req_type", "output_dir", "start_step", "num_steps", "activities",
        "profile_by_stage", "with_stack", "record_shapes", "profile_id", "merge_profiles", "profile_prefix",
        "profile_stages", "detailed_annotations",
    )
    _defaults: ClassVar[dict[str, Any]] = {"req_type": ProfileReqType.START_PROFILE, "profile_by_stage": False,
                                           "merge_profiles": False, "detailed_annotations": False}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args:
            raise TypeError("Extra positional arguments provided")
        for key in kwargs:
            if key not in self.__struct_fields__:
                raise TypeError(f"Unexpected keyword argument '{key}'")
        for name in self.__struct_fields__:
            setattr(self, name, kwargs.get(name, self._defaults.get(name)))


class Scheduler:
    """The v1 ``SchedulerProfilerManager`` behaviour, one TP rank (§2.4)."""

    def __init__(self, version: tuple[int, int, int]) -> None:
        self.version = version
        self.forward_ct = 0
        self.in_progress = False
        self.pending_start: int | None = None
        self.by_stage = False
        self.target: int | None = None
        self.req: ProfileReq | None = None
        self.batches = 0
        self.files: list[str] = []
        self.violations: list[str] = []
        self.crashed: str | None = None
        self.starts = 0

    def start(self, req: ProfileReq) -> tuple[bool, str]:
        self.starts += 1
        deferred = bool(req.start_step) or bool(req.profile_by_stage)
        if self.in_progress:
            return False, ALREADY
        if deferred:
            # A pending deferred start is overwritten, not refused (every release 0.4.10-0.5.23).
            self.req = req
            self.by_stage = bool(req.profile_by_stage)
            if self.by_stage:
                self.pending_start = self.forward_ct + 1
                if req.num_steps is None:
                    self.crashed = "TypeError: unsupported operand type(s) for +=: 'NoneType' and 'int'"
            else:
                self.pending_start = max(int(req.start_step), self.forward_ct + 1)
            return True, "Succeeded"
        self.req = req  # an immediate start leaves a pending start step armed; only a stop clears it
        self._begin()
        if req.num_steps:
            extra = 1 if self.version >= (0, 5, 16) else 0
            self.target = self.forward_ct + req.num_steps + extra
        return True, "Succeeded"

    def _begin(self) -> None:
        req = self.req
        assert req is not None
        valid = [a for a in (req.activities or ["CPU", "GPU"]) if a in ("CPU", "GPU", "MEM", "CUDA_PROFILER")]
        self.in_progress = bool(valid)
        self.batches = 0

    def run_batch(self, n: int = 1) -> None:
        """Run ``n`` forward batches (``forward_ct += 1``, then the profile predicate)."""
        for _ in range(n):
            self.forward_ct += 1
            if self.crashed is not None and self.pending_start is not None:
                raise TypeError(self.crashed)
            if self.pending_start is not None and self.forward_ct >= self.pending_start:
                self.pending_start = None
                self._begin()
                if self.req is not None and self.req.num_steps:
                    self.target = self.forward_ct + self.req.num_steps
            if self.in_progress and self.target is not None and self.target <= self.forward_ct:
                self._export()
            if self.in_progress:
                self.batches += 1

    def stop(self) -> tuple[bool, str]:
        if not self.in_progress:
            return False, NOT_IN_PROGRESS
        self._export()
        self.pending_start = None
        return True, "Succeeded"

    def _export(self) -> None:
        req = self.req
        assert req is not None
        out = req.output_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        os.makedirs(out, exist_ok=True)
        head = f"{req.profile_prefix}-{req.profile_id}" if req.profile_prefix else str(req.profile_id)
        stages = ["-EXTEND", "-DECODE"] if self.by_stage else [""]
        payload = {"batches": self.batches, "with_stack": req.with_stack, "record_shapes": req.record_shapes,
                   "activities": req.activities}
        for stage in stages:
            path = os.path.join(out, f"{head}-TP-0{stage}.trace.json.gz")
            with gzip.open(path, "wt") as fh:
                json.dump({"traceEvents": [], **payload}, fh)
            self.files.append(path)
        if req.merge_profiles:
            found = glob.glob(os.path.join(out, f"{req.profile_id}*.trace.json.gz"))
            if found:
                merged = os.path.join(out, f"merged-{req.profile_id}.trace.json.gz")
                with gzip.open(merged, "wt") as fh:
                    json.dump({"traceEvents": [], "merged": len(found)}, fh)
                self.files.append(merged)
        self.in_progress = False
        self.target = None
        self.by_stage = False


def _tokenizer_defaults(req: ProfileReq) -> ProfileReq:
    """What ``TokenizerControlMixin.start_profile`` does to a request (§2.3), env at defaults."""
    req.req_type = ProfileReqType.START_PROFILE
    req.with_stack = req.with_stack is not False
    req.record_shapes = req.record_shapes is not False
    req.profile_id = req.profile_id or str(time.time())
    return req


class _TokenizerBase:
    version: tuple[int, int, int] = (0, 0, 0)

    def __init__(self, scheduler: Scheduler | None = None) -> None:
        self.scheduler = scheduler or Scheduler(self.version)
        self.requests: list[ProfileReq] = []
        self.stop_calls = 0

    async def _execute(self, req: ProfileReq | None) -> None:
        await asyncio.sleep(0)
        if req is None:
            self.stop_calls += 1
            ok, message = self.scheduler.stop()
        else:
            self.requests.append(req)
            ok, message = self.scheduler.start(req)
        if not ok:
            raise RuntimeError(message)

    async def stop_profile(self) -> None:
        await self._execute(None)


class TokenizerManager_0_5_23(_TokenizerBase):  # noqa: N801 - version in the name
    """``TokenizerManager`` of SGLang 0.5.23 (request object; §2.1, §2.3)."""

    version = (0, 5, 23)

    async def start_profile(self, req: Optional[ProfileReq] = None) -> None:  # noqa: UP045 - mirrors upstream
        await self._execute(_tokenizer_defaults(req if req is not None else ProfileReq()))


class TokenizerManager_0_5_12(_TokenizerBase):  # noqa: N801
    """``TokenizerManager`` of SGLang 0.5.12 (keywords; §2.1). No ``profile_id`` before 0.5.15."""

    version = (0, 5, 12)

    async def start_profile(self, output_dir: Optional[str] = None, start_step: Optional[int] = None,  # noqa: UP045
                            num_steps: Optional[int] = None, activities: Optional[list[str]] = None,  # noqa: UP045
                            with_stack: Optional[bool] = None, record_shapes: Optional[bool] = None,  # noqa: UP045
                            profile_by_stage: bool = False, merge_profiles: bool = False,
                            profile_prefix: Optional[str] = None,  # noqa: UP045
                            profile_stages: Optional[list[str]] = None) -> None:  # noqa: UP045
        req = ProfileReq(output_dir=output_dir, start_step=start_step, num_steps=num_steps, activities=activities,
                         with_stack=with_stack, record_shapes=record_shapes, profile_by_stage=profile_by_stage,
                         merge_profiles=merge_profiles, profile_prefix=profile_prefix, profile_stages=profile_stages)
        await self._execute(_tokenizer_defaults(req))


class Engine_0_5_23:  # noqa: N801
    """``sglang.Engine`` of 0.5.23: blocking ``start_profile(**kwargs)`` building a ``ProfileReq`` (§2.3)."""

    version = (0, 5, 23)

    def __init__(self) -> None:
        self.tokenizer_manager = TokenizerManager_0_5_23()
        self.loop = asyncio.new_event_loop()

    def start_profile(self, **kwargs: Any) -> None:
        req = ProfileReq(req_type=ProfileReqType.START_PROFILE, **kwargs)
        self.loop.run_until_complete(self.tokenizer_manager.start_profile(req))

    def stop_profile(self) -> None:
        self.loop.run_until_complete(self.tokenizer_manager.stop_profile())

    @property
    def scheduler(self) -> Scheduler:
        return self.tokenizer_manager.scheduler


class Engine_0_4_9:  # noqa: N801
    """``sglang.Engine`` of 0.4.9: ``start_profile(self)`` takes no arguments (§2.1)."""

    version = (0, 4, 9)

    def __init__(self) -> None:
        self.scheduler = Scheduler(self.version)

    # As 0.4.9-0.5.3 do: the call runs on asyncio.get_event_loop(), which a thread without a loop lacks.
    def start_profile(self) -> None:
        loop = asyncio.get_event_loop()
        loop.run_until_complete(self._start())

    def stop_profile(self) -> None:
        loop = asyncio.get_event_loop()
        loop.run_until_complete(self._stop())

    async def _start(self) -> None:
        ok, message = self.scheduler.start(_tokenizer_defaults(ProfileReq()))
        if not ok:
            raise RuntimeError(message)

    async def _stop(self) -> None:
        ok, message = self.scheduler.stop()
        if not ok:
            raise RuntimeError(message)
