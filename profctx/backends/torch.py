"""The ``torch`` backend: ``torch.profiler`` with CPU and, where present and asked for, CUDA activity."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..core._plan import RANGES_KEY, STEP_MARKER_PREFIX, step_range
from ..util._errors import ConfigError
from ..util._files import sweep, working_folder
from ..util._fs import Folder
from ..util._log import warn_once
from ._base import CaptureSpec, Finish, installed, named_unselected

if TYPE_CHECKING:
    from ..core._config import ProfilerConfig

#: ``contents`` entry -> ``torch.profiler.profile`` keyword.
FLAGS = {
    "shapes": "record_shapes",
    "stack": "with_stack",
    "memory": "profile_memory",
    "flops": "with_flops",
    "modules": "with_modules",
}
#: Levels ``compress_level`` may take (gzip); torch's own handler uses 9, about 20x slower than 1.
COMPRESS_LEVELS = range(1, 10)
#: Free bytes under which a failed trace write is taken for a full disk.
FULL_BELOW = 256 * 1024
#: Options this backend reads from ``tool_options``.
OPTIONS = ("compress_level", "all_threads")
#: Seconds a capture's start waits at most for the previous capture's CUDA trace to be exported.
EXPORT_WAIT_S = 120.0
#: A wait at a capture's start longer than this (seconds) is noted in its manifest record.
NOTED_WAIT_S = 0.001


class SessionLostError(RuntimeError):
    """Raise when another torch profiler took the process's single session during a capture."""


class TorchBackend:
    """Drive ``torch.profiler.profile``; export a Chrome trace per capture.

    Empty ``contents`` means CPU plus CUDA when CUDA is available. CPU activity is always on:
    role ranges are CPU events. Files: ``{stem}.pt.trace.json`` or ``.pt.trace.json.gz``.

    Every capture names its step as torch's schedule does (``ProfilerStep#N``): step captures
    get it from the plan's marker, a role capture from this backend, around the role. Just
    before the session stops, the names of the role ranges and step markers drawn are written
    as the trace metadata ``profctxRanges`` (torch writes no ``record_function`` arguments into
    the Chrome trace, so the names are listed once per trace), so the analysis tells profctx's ranges from the
    user's and torch's own ``record_function`` ranges without guessing.
    """

    name: ClassVar[str] = "torch"

    def __init__(self) -> None:
        self._prof: Any = None
        self._spec: CaptureSpec | None = None
        self._record_function: Any = None
        self._roles: set[str] = set()
        self._steps: set[str] = set()
        self._step_range: Any = None
        #: Set once the last capture that recorded CUDA activity has been exported (None: nothing pending).
        self._exported: threading.Event | None = None
        self._cuda = False

    @classmethod
    def check_config(cls, config: ProfilerConfig) -> None:
        """Refuse a config this backend cannot run: no torch, or contents it does not know."""
        # Found, not imported: a process that cannot capture (an unselected rank or group member, a
        # driver that does not profile) never pays torch's import; one that can imports it in prepare().
        if not named_unselected(config) and not installed("torch"):
            raise ConfigError(
                "tool", config.tool, "the torch backend needs torch: pip install 'profctx[torch]'"
            )
        if "npu" in config.contents:
            raise ConfigError("contents", "npu", "the torch backend records cpu and cuda; use tool='npu' for NPUs")
        for key in config.tool_options:
            if key not in OPTIONS:
                raise ConfigError(
                    f"tool_options.{key}", config.tool_options[key], f"torch options: {', '.join(OPTIONS)}"
                )
        level = config.tool_options.get("compress_level", 3)
        if isinstance(level, bool) or level not in COMPRESS_LEVELS:
            raise ConfigError("tool_options.compress_level", level, "an integer from 1 (fast) to 9 (small)")
        all_threads = config.tool_options.get("all_threads", False)
        if not isinstance(all_threads, bool):
            raise ConfigError("tool_options.all_threads", all_threads, "true or false")

    def prepare(self) -> None:
        """Import what torch's first ``profile.start()`` would import (about a second), now."""
        import torch.profiler

        with contextlib.suppress(Exception):
            import torch._dynamo  # noqa: F401

    def start(self, spec: CaptureSpec) -> None:
        """Start a ``torch.profiler.profile`` session with identity metadata."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        # The C flag misses sessions started with profile_all_threads; the Python flag covers them.
        if torch.autograd._profiler_enabled() or getattr(torch.autograd.profiler, "_is_profiler_enabled", False):
            raise SessionLostError("a torch profiler not started by profctx is already running in this process")
        activities = [ProfilerActivity.CPU]
        wants_cuda = "cuda" in spec.contents or not spec.contents
        self._wait_for_export(spec)
        if wants_cuda and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        elif "cuda" in spec.contents:
            note = "cuda was asked for but CUDA is not available; captured CPU activity only"
            spec.notes.append(note)
            warn_once("torch:no-cuda", "profctx: %s", note)
        flags = {keyword: (content in spec.contents) for content, keyword in FLAGS.items()}
        all_threads = bool(spec.options.get("all_threads", False))
        prof = profile(activities=activities, experimental_config=_experimental_config(all_threads), **flags)
        self._cuda = exported_before_next_start(activities)
        self._prof = prof  # before start(): an interrupt inside it still leaves something to abort
        self._spec = spec
        self._roles, self._steps, self._step_range = set(), set(), None
        prof.start()
        prof.add_metadata_json("profctx", json.dumps(spec.metadata, default=str))
        if not _distributed_initialized():
            info = {"backend": "none", "rank": spec.identity.rank, "world_size": spec.identity.world_size}
            prof.add_metadata_json("distributedInfo", json.dumps(info))
        if spec.roles and len(spec.steps) == 1:
            # A role capture names its step too (the plan's step marker exists only in step captures).
            self._step_range = self.marker(step_range(spec.steps[0]))
            self._step_range.__enter__()

    def stop(self) -> Finish:
        """Stop the session on this thread; return the exporter (run off the training thread)."""
        prof, spec = self._prof, self._spec
        if prof is None or spec is None:
            raise RuntimeError("stop() without a live capture")
        self._close_step_range()
        try:
            drawn = {"version": 1, "roles": sorted(self._roles), "steps": sorted(self._steps)}
            prof.add_metadata_json(RANGES_KEY, json.dumps(drawn))
        except Exception as exc:  # noqa: BLE001 - the trace is still worth writing; the analysis falls back
            spec.notes.append(f"could not name profctx's ranges in the trace: {exc}")
        prof.stop()
        self._prof = self._spec = None
        results = getattr(prof.profiler, "kineto_results", None)
        if results is None or results.trace_start_ns() == 0:
            # Exporting a profiler whose session was taken by another one crashes the process.
            raise SessionLostError("another torch profiler took this process's profiling session during the capture")
        level = int(spec.options.get("compress_level", 3))
        exported = None
        if self._cuda:
            # torch reads a CUDA trace's GPU times when it exports it: once the next session has started,
            # every kernel, copy and CUDA call exports with ts 0 and dur 0 (seen with torch 2.11 on an H200,
            # docs/performance.md). The next start() waits for this export, not for its compression.
            exported = self._exported = threading.Event()

        def finish() -> Sequence[Path]:
            return _export(prof, spec, level, exported)

        if exported is not None:  # a job dropped unrun (an interrupt before it was queued) must not hold the next start
            weakref.finalize(finish, exported.set)
        return finish

    def _wait_for_export(self, spec: CaptureSpec) -> None:
        """Wait until the previous CUDA capture's trace is exported (see :meth:`stop`); note a wait felt."""
        exported, self._exported = self._exported, None
        if exported is None or exported.is_set():
            return
        began = time.perf_counter()
        done = exported.wait(EXPORT_WAIT_S)
        waited = time.perf_counter() - began
        if not done:
            note = (f"the previous capture's CUDA trace was still being exported after {waited:.0f} s; "
                    "started anyway: that trace's GPU times may read 0")
            spec.notes.append(note)
            warn_once("torch:export-wait", "profctx: %s", note)
        elif waited > NOTED_WAIT_S:
            spec.notes.append(f"waited {waited * 1e3:.1f} ms for the previous capture's CUDA trace to be exported "
                              "(torch loses its GPU times once a new session starts)")

    def abort(self) -> None:
        """Stop a session whose start or stop was cut short (an interrupt); drop its data."""
        prof, self._prof, self._spec = self._prof, None, None
        if prof is None:
            return
        with contextlib.suppress(Exception):
            self._close_step_range()
        import torch

        if torch.autograd._profiler_enabled():
            prof.stop()

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Return ``torch.profiler.record_function(name)``, a role range listed in the trace's metadata."""
        if self._record_function is None:  # the import statement costs about 0.4 us a range: look it up once
            from torch.profiler import record_function

            self._record_function = record_function
        self._roles.add(name)
        cm: contextlib.AbstractContextManager[Any] = self._record_function(name)
        return cm

    def marker(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Return the range of a step (``ProfilerStep#N``) or of a role capture's own role, listed as such."""
        if not name.startswith(STEP_MARKER_PREFIX):
            return self.range(name)
        from torch.profiler import record_function

        self._steps.add(name)
        cm: contextlib.AbstractContextManager[Any] = record_function(name)
        return cm

    def _close_step_range(self) -> None:
        step, self._step_range = self._step_range, None
        if step is not None:
            step.__exit__(None, None, None)

    def step(self) -> None:
        """Do nothing: captures are whole steps or roles, not torch schedules."""


def exported_before_next_start(activities: Sequence[Any]) -> bool:
    """Whether a capture of ``activities`` must be exported before the next session starts: any device activity."""
    return len(activities) > 1  # CPU is always first; CUDA is the only other activity this backend asks for


def _export(prof: Any, spec: CaptureSpec, level: int, exported: threading.Event | None = None) -> Sequence[Path]:
    final = spec.folder / f"{spec.stem}.pt.trace.json"
    try:
        return _write(prof, spec, final, level, exported)
    except Exception as exc:
        if disk_full(spec.folder, exc):
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} while writing {final.name}",
                          str(spec.folder)) from exc
        raise
    finally:
        if exported is not None:
            exported.set()  # also when the export failed before torch was called: nothing is left to wait for


def _write(prof: Any, spec: CaptureSpec, final: Path, level: int,
           exported: threading.Event | None = None) -> Sequence[Path]:
    """Export and compress in a private working folder, then rename the result into ``spec.folder``.

    torch writes through temporaries of its own named from the path it is given: inside a fresh
    ``0o700`` folder reached through its descriptor, no link planted beforehand can redirect them.
    Every file object is closed on every path (a failed write holds no disk space once it returns),
    and the working folder is removed whatever happens.
    """
    from ..util import _codec  # gzip, zlib and isal: imported by the first trace written, not by configure()

    held = spec.at if spec.at is not None else spec.folder  # the held folder: never reopened by path
    sweep(held)  # what writers killed mid-write left here
    with working_folder(held) as (folder_fd, work_fd, work_path):
        try:
            prof.export_chrome_trace(os.path.join(work_path, "trace"))
        finally:
            if exported is not None:
                exported.set()  # the next capture may start: what is left reads only the file
        if not spec.compress:
            os.replace("trace", final.name, src_dir_fd=work_fd, dst_dir_fd=folder_fd)
            return (final,)
        packed = final.with_name(final.name + ".gz")
        work = Folder(work_fd, Path(work_path), owned=False)  # working_folder closes it
        with os.fdopen(work.open_read("trace"), "rb") as src, os.fdopen(work.create("packed"), "wb") as out, \
                _codec.gzip_writer(out, level) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace("packed", packed.name, src_dir_fd=work_fd, dst_dir_fd=folder_fd)
        return (packed,)


def disk_full(folder: Path, exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk, or ``folder``'s file system has no room left.

    torch reports a failed trace write with errors that do not say why (a missing ``.tmp``
    file); the free space says it.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        stats = os.statvfs(folder)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < FULL_BELOW


def _experimental_config(all_threads: bool) -> Any:
    from torch._C._profiler import _ExperimentalConfig

    # trace_only: skip building Python event objects at stop; only the export is needed.
    # profile_all_threads records ops of threads that did not start the capture; off by default:
    # in torch 2.13 a stop racing with ops on another thread can crash in finalizeTrace.
    wanted: dict[str, Any] = {"trace_only": True}
    if all_threads:
        wanted["profile_all_threads"] = True
    attempts: tuple[dict[str, Any], ...] = (wanted, {k: v for k, v in wanted.items() if k != "trace_only"}, {})
    for kwargs in attempts:
        try:
            return _ExperimentalConfig(**kwargs)
        except TypeError:
            continue
    return None


def _distributed_initialized() -> bool:
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001
        return False
