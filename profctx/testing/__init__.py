"""Test helpers for users of profctx: a recording backend, ``capture()`` and the plan as an oracle.

``expected_captures(config, steps, blocks)`` says what a loop captures without running it
(the same plan the runtime executes); ``replay(steps, blocks)`` runs such a loop through real
``profile_step`` blocks. Hypothesis strategies live in :mod:`profctx.testing.strategies`
(needs ``hypothesis``).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..backends.recording import RecordedCapture, RecordingBackend
from ..core._config import ProfilerConfig, load
from ..core._oracle import Expected, RoleBlock, simulate
from ..core._plan import CaptureKey, Policy
from ..process import _api
from ..process._block import profile_step
from ..process._owner import OWNER

__all__ = [
    "CaptureKey",
    "Captured",
    "Expected",
    "RecordedCapture",
    "RecordingBackend",
    "RoleBlock",
    "capture",
    "expected_captures",
    "replay",
]


@dataclass
class Captured:
    """What one capture covered, as :func:`capture` reports it.

    ``kind``: ``step`` or ``role`` for the process's own captures, ``engine`` for a session of
    an attached engine adapter (compare only the former with :func:`expected_captures`).
    """

    steps: tuple[int, ...]
    role: str | None
    rank: int
    status: str
    ranges: list[str] = field(default_factory=list)
    reason: str | None = None
    markers: list[str] = field(default_factory=list)
    kind: str | None = None


@contextlib.contextmanager
def capture(**fields: Any) -> Iterator[list[Captured]]:
    """Collect what would have been captured inside the block, with no device profiler.

    ``fields`` are configuration fields (``steps`` at least, unless profctx is configured
    already, whose fields are the starting point). ``tool`` is forced to ``recording`` and
    ``save_path`` defaults to a temporary folder. The yielded list fills as captures end
    (``status`` ``ok``, ``skipped`` or ``failed``); the previous configuration is restored after.
    """
    previous = OWNER.config
    base = previous.to_dict() if previous is not None else {}
    base.update(fields)
    base.update(tool="recording", exit_hooks=False, warmup=False)
    results: list[Captured] = []
    with contextlib.ExitStack() as stack:
        if "save_path" not in fields:
            base["save_path"] = stack.enter_context(tempfile.TemporaryDirectory(prefix="profctx-capture-"))
        _api.configure(base)
        runtime = OWNER.runtime
        by_id: dict[str, RecordedCapture] = {}
        first = len(RecordingBackend.log)

        def listen(record: dict[str, Any]) -> None:
            if record.get("event") != "finished":
                return
            for item in RecordingBackend.log[first:]:
                by_id.setdefault(item.capture_id, item)
            recorded = by_id.get(str(record.get("capture")))
            results.append(Captured(
                steps=tuple(record.get("steps", ())),
                role=record.get("role"),
                rank=int(record.get("rank", 0)),
                status=str(record.get("status")),
                ranges=list(recorded.ranges) if recorded else [],
                reason=record.get("reason") or record.get("error"),
                markers=list(recorded.markers) if recorded else [],
                kind=record.get("kind"),
            ))

        if runtime is not None:
            runtime.listeners.append(listen)
        try:
            yield results
        finally:
            _api.flush()
            if previous is not None:
                _api.configure(previous)
            else:
                _api.reset()


def expected_captures(
    config: ProfilerConfig | Mapping[str, Any],
    steps: Iterable[int],
    blocks: Sequence[RoleBlock] = (),
    *,
    rank: int | None = None,
) -> list[Expected]:
    """Return the captures a one-threaded loop makes, without running it or any profiler.

    The loop is ``for step in steps: with profile_step(step): <blocks>``; ``blocks`` are
    role blocks (:class:`RoleBlock`, nested as given) entered one after another in every
    step. ``steps`` may repeat or skip (a retried or resumed step). ``config`` is a
    :class:`~profctx.ProfilerConfig` or the keywords of :func:`profctx.configure`; ``rank``
    is this process's rank (default: the config's, else 0). Each result has ``key``
    (kind, steps, roles), ``status`` (``ok``, or ``skipped`` when another capture held the
    profiler) and ``ranges`` (in the order opened). Raise ``ConfigError`` for a bad config.
    """
    cfg = config if isinstance(config, ProfilerConfig) else load(dict(config))
    if cfg is None or not cfg.active:
        return []
    me = rank if rank is not None else (cfg.rank if cfg.rank is not None else 0)
    selected = cfg.ranks == "all" or me in cfg.ranks
    return simulate(Policy.of(cfg, selected), steps, blocks)


def replay(steps: Iterable[int], blocks: Sequence[RoleBlock] = ()) -> None:
    """Run ``for step in steps: with profile_step(step): <blocks>`` through real blocks.

    Use it with :func:`capture` (or a configured profctx) to check what the runtime really
    captures against :func:`expected_captures`.
    """
    def enter(block: RoleBlock) -> None:
        with profile_step(role=block.role):
            for child in block.children:
                enter(child)

    for step in steps:
        with profile_step(step):
            for block in blocks:
                enter(block)
