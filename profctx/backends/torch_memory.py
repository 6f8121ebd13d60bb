"""The ``torch_memory`` backend: CUDA memory history over a capture, saved as a snapshot file.

Open the file at https://pytorch.org/memory_viz (drag and drop) or with
``python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from ..util._errors import ConfigError, one_of
from ..util._files import replacing
from ..util._fs import walk
from ..util._resets import on_reset
from ._base import CaptureSpec, Finish, named_unselected, torch_cuda_built, torch_version

if TYPE_CHECKING:
    from ..core._config import ProfilerConfig

#: ``contents`` this backend understands: memory history is CUDA's; ``stack`` adds C++ frames.
CONTENTS: Final = ("cuda", "memory", "stack")
#: Options this backend reads from ``tool_options``, with their defaults.
DEFAULTS: Final[Mapping[str, Any]] = {"max_entries": 100_000, "stack_depth": 32, "context": "all"}
#: ``tool_options["context"]``: which events keep a stack trace (torch's ``context`` argument).
CONTEXTS: Final = ("state", "alloc", "all")
#: File suffix of the snapshot.
SUFFIX: Final = ".memory_snapshot.pickle"


class TorchMemoryBackend:
    """Record CUDA allocator history during a capture; dump it as ``{stem}.memory_snapshot.pickle``.

    Empty ``contents`` means CUDA memory with Python frames; ``stack`` adds C++ frames.
    ``tool_options``: ``max_entries`` (history ring size, default 100000), ``stack_depth``
    (frames kept per event in the file, default 32), ``context`` (state, alloc, all).
    Role ranges are ``record_function`` annotations, stored in the snapshot.
    """

    name: ClassVar[str] = "torch_memory"

    def __init__(self) -> None:
        self._spec: CaptureSpec | None = None
        self._depth = int(DEFAULTS["stack_depth"])

    @classmethod
    def check_config(cls, config: ProfilerConfig) -> None:
        """Refuse a config this backend cannot run: a CPU-only torch build, bad contents or options.

        torch is not imported here (a process that cannot capture never pays for it).
        """
        built = True if named_unselected(config) else torch_cuda_built()
        if built is None:
            raise ConfigError("tool", config.tool, "the torch_memory backend needs torch with CUDA")
        if not built:
            raise ConfigError(
                "tool", config.tool,
                f"torch {torch_version()} is a CPU-only build, which records no CUDA memory history; "
                "install a CUDA build of torch",
            )
        for item in config.contents:
            if item not in CONTENTS:
                raise ConfigError("contents", item, f"the torch_memory backend records {one_of(CONTENTS)}")
        settings(config.tool_options)

    def prepare(self) -> None:
        """Import ``torch.cuda.memory`` now."""
        import torch.cuda.memory  # noqa: F401

    def start(self, spec: CaptureSpec) -> None:
        """Clear and start CUDA memory-history recording."""
        import torch

        opts = settings(spec.options)
        kwargs: dict[str, Any] = {
            "enabled": "all",
            "context": opts["context"],
            "stacks": "all" if "stack" in spec.contents else "python",
            "max_entries": opts["max_entries"],
            "clear_history": True,
            "global_record_annotations": True,
        }
        try:
            torch.cuda.memory._record_memory_history(**kwargs)
        except TypeError:  # a torch without annotation recording
            del kwargs["global_record_annotations"]
            torch.cuda.memory._record_memory_history(**kwargs)
        self._spec = spec
        self._depth = opts["stack_depth"]

    def stop(self) -> Finish:
        """Take the snapshot, stop recording; return the writer of the snapshot file."""
        import torch

        spec, self._spec = self._spec, None
        if spec is None:
            raise RuntimeError("stop() without a live capture")
        try:
            snapshot = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        depth = self._depth
        return lambda: _write(spec, snapshot, depth)

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Return ``torch.profiler.record_function(name)``: an annotation in the memory history."""
        from torch.profiler import record_function

        cm: contextlib.AbstractContextManager[Any] = record_function(name)
        return cm

    def step(self) -> None:
        """Do nothing."""


def settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """Return the torch_memory options with defaults filled in; raise ``ConfigError``."""
    for key in options:
        if key not in DEFAULTS:
            raise ConfigError(f"tool_options.{key}", options[key], f"torch_memory options: {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **options}
    for key in ("max_entries", "stack_depth"):
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"tool_options.{key}", value, "an integer >= 1")
    if out["context"] not in CONTEXTS:
        raise ConfigError("tool_options.context", out["context"], one_of(CONTEXTS))
    return out


def _trim(snapshot: dict[str, Any], depth: int) -> None:
    for segment in snapshot.get("segments", ()):
        for block in segment.get("blocks", ()):
            if "frames" in block:
                block["frames"] = block["frames"][:depth]
    for trace in snapshot.get("device_traces", ()):
        for entry in trace:
            if "frames" in entry:
                entry["frames"] = entry["frames"][:depth]


def _write(spec: CaptureSpec, snapshot: dict[str, Any], depth: int) -> Sequence[Path]:
    _trim(snapshot, depth)
    final = spec.folder / f"{spec.stem}{SUFFIX}"
    with replacing(final, at=spec.at) as f:
        pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
    return (final,)


#: Sub-folder of ``save_path`` that OOM snapshots go to.
OOM_FOLDER: Final = "oom"


def watch_oom(
    save_path: str | os.PathLike[str],
    *,
    max_entries: int = int(DEFAULTS["max_entries"]),
    context: str = str(DEFAULTS["context"]),
    stacks: str = "all",
) -> Path | None:
    """Record CUDA memory history from now on and write an allocator snapshot when CUDA runs out of memory.

    This is what verl's ``torch_memory`` tool does in every worker whatever its steps: call it
    once per process at start-up (each worker). On an out-of-memory error the snapshot is
    written to ``{save_path}/oom/pid{PID}-{TIME}.memory_snapshot.pickle`` before the error
    reaches the caller; the error itself passes through untouched. Return the folder the
    snapshots go to, or ``None`` (and do nothing) when CUDA is not available, e.g. on a CPU-only
    machine. Raise ``ConfigError`` for a bad ``max_entries``, ``context`` or ``stacks``. Calling
    it again attaches no second observer.
    """
    opts = settings({"max_entries": max_entries, "context": context})
    if stacks not in ("python", "all"):
        raise ConfigError("stacks", stacks, one_of(("python", "all")))
    import torch

    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)  # absent from CPU-only builds
    if not torch.cuda.is_available() or attach is None:
        return None
    folder = Path(save_path) / OOM_FOLDER
    torch.cuda.memory._record_memory_history(
        enabled="all", context=opts["context"], stacks=stacks, max_entries=opts["max_entries"]
    )
    global _oom_folder
    _oom_folder = folder
    if not _observing:
        # Attached once per process (torch has no way to detach it); the folder of the latest call is used.
        attach(_on_oom)
        _observing.append(True)
    return folder


#: Where the OOM observer writes (``None``: nowhere; set by :func:`watch_oom`, ended by :func:`reset`).
_oom_folder: Path | None = None
#: Non-empty once the observer is attached to torch: that outlives ``reset()``, as torch keeps it.
_observing: list[bool] = []


@on_reset
def reset() -> None:
    """Stop writing OOM snapshots (``profctx.reset()``); the attached observer then does nothing."""
    global _oom_folder
    _oom_folder = None


def _on_oom(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
    """Write the allocator snapshot at an out-of-memory error; never raise (the OOM error must reach the caller)."""
    from ..util._log import warn_once

    folder = _oom_folder
    if folder is None:
        return
    try:
        import time

        import torch

        snapshot = torch.cuda.memory._snapshot()
        name = f"pid{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}-dev{device}{SUFFIX}"
        final = folder / name
        with walk(folder.parent, folder.name) as held, held.replacing(name) as f:  # a link at oom/: refused
            pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
        warn_once(f"oom:{final}", "profctx: CUDA out of memory on device %s (asked %s bytes, %s free): "
                  "allocator snapshot written to %s", device, alloc, device_free, final)
    except Exception as exc:  # noqa: BLE001 - an observer must not turn an OOM into another error
        warn_once("oom-snapshot-failed", "profctx: could not write the OOM memory snapshot: %s", exc)
