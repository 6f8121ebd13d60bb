"""``on_capture``: user hooks called after each capture's files are written."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..util._errors import ConfigError
from ._owner import OWNER

if TYPE_CHECKING:
    from ..manifest import CaptureRecord

Hook = TypeVar("Hook", bound="Callable[[CaptureRecord], object]")


def on_capture(hook: Hook) -> Hook:
    """Call ``hook(record)`` after each capture of this process ends; return ``hook`` (usable as a decorator).

    ``record`` is the capture's :class:`profctx.manifest.CaptureRecord` as its ``finished`` line
    reads: status (``ok``, ``failed``, ``skipped``, ``interrupted``), steps, role, files (paths
    relative to ``save_path``), sizes, times. Hooks run on a thread profctx's writer waits for,
    after the capture's files are written and its record appended, never on the training thread;
    they run one after another, in the order added, and ``profctx.flush()`` waits for them; process
    exit waits at most ``exit_timeout`` seconds (a second SIGTERM: not at all), then notes in the
    capture's record that its hooks were given up on. A slow hook delays the writing of later
    captures: hand long work (uploads) to your own executor. A hook that raises is logged once and
    recorded in the process's profiling errors; nothing is raised into training. Hooks outlive
    ``configure()`` and are removed by ``profctx.reset()`` or :func:`remove_on_capture`. Raises
    :class:`profctx.ConfigError` for a hook that is not callable.
    """
    if not callable(hook):
        raise ConfigError("on_capture", hook, "a callable taking the capture's record")
    with OWNER._lock:
        if hook not in OWNER.capture_hooks:
            OWNER.capture_hooks = [*OWNER.capture_hooks, hook]
    return hook


def remove_on_capture(hook: Callable[[CaptureRecord], object]) -> None:
    """Remove ``hook`` added by :func:`on_capture` (nothing if it is not there)."""
    with OWNER._lock:
        OWNER.capture_hooks = [h for h in OWNER.capture_hooks if h is not hook and h != hook]
