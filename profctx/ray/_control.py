"""The driver's control calls to its workers: bounded waits, and members lost and found again.

A control call (enter or leave a step, join) that a member has not answered within its
group's control timeout marks the member **lost**: the driver records it once (group, rank,
pid, why), stops waiting for it and sends it nothing more until the calls it still owes have
answered. A member that died (Ray says so) stays lost. A member lost while it had not yet
entered a step is told to leave that step once it answers, and rejoins after that.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray

from ..process._owner import OWNER
from ..records._manifest import failed_call
from ..util._errors import ConfigError
from ..util._log import logger, warn_once

#: Seconds the driver waits, by default, for a member to answer a control call.
DEFAULT_TIMEOUT = 60.0


def check_timeout(value: object) -> float:
    """Return ``value`` as a control timeout in seconds; raise ``ConfigError`` unless it is a number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError("control_timeout", value, "seconds to wait for a worker's answer: a number > 0")
    return float(value)


@dataclass(eq=False)
class Sent:
    """One control call: its object ref, the member it went to, what it asks, and when it was sent."""

    ref: Any
    member: Any
    what: str
    step: int | None = None
    at: float = 0.0

    def __post_init__(self) -> None:
        if not self.at:
            self.at = time.monotonic()

    @property
    def deadline(self) -> float:
        """When the member's answer is late (monotonic seconds)."""
        return float(self.at + self.member.timeout)


def wait(sent: Sequence[Sent]) -> None:
    """Wait for ``sent`` from sync code, each at most its member's control timeout; mark the late ones lost."""
    pending = list(sent)
    while pending:
        refs = [s.ref for s in pending]
        left = max(0.0, min(s.deadline for s in pending) - time.monotonic())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=left)
        pending = _settle(pending, set(ready))


async def await_(sent: Sequence[Sent]) -> None:
    """The async twin of :func:`wait` (awaits the refs' futures; never a blocking ``ray.get``)."""
    pending = list(sent)
    futures = {id(s): asyncio.wrap_future(s.ref.future()) for s in pending}
    while pending:
        left = max(0.0, min(s.deadline for s in pending) - time.monotonic())
        await asyncio.wait([futures[id(s)] for s in pending], timeout=left)
        pending = _settle(pending, {s.ref for s in pending if futures[id(s)].done()})


def check(sent: Sequence[Sent]) -> list[Sent]:
    """Report the calls of ``sent`` that answered, mark lost those past their deadline; return the rest (no wait)."""
    pending = list(sent)
    if not pending:
        return []
    refs = [s.ref for s in pending]
    try:
        answers = ray.get(refs, timeout=0)  # the usual case, every call answered: one round, not two
    except Exception:  # noqa: BLE001 - one is late or failed: sorted out call by call below
        pass
    else:
        for s, answer in zip(pending, answers, strict=True):
            _answered(s, answer)
        return []
    ready, _ = ray.wait(refs, num_returns=len(pending), timeout=0)
    return _settle(pending, set(ready))


def _settle(pending: list[Sent], ready: set[Any]) -> list[Sent]:
    """Report the ready calls, mark the late ones' members lost; return the calls still worth waiting for."""
    now = time.monotonic()
    left = []
    report_all([s for s in pending if s.ref in ready])
    for s in pending:
        if s.ref in ready:
            continue
        if now >= s.deadline:
            lose(s, f"no answer to '{s.what}' within {s.member.timeout:g}s")
        else:
            left.append(s)
    return left


def report_all(sent: Sequence[Sent]) -> None:
    """:func:`report` the answered calls ``sent``, with one ``ray.get`` for all of them when none failed."""
    if not sent:
        return
    try:
        answers = ray.get([s.ref for s in sent], timeout=0)
    except Exception:  # noqa: BLE001 - one of them failed: each is read on its own to say which
        for s in sent:
            report(s)
        return
    for s, answer in zip(sent, answers, strict=True):
        _answered(s, answer)


def report(s: Sent) -> None:
    """Log, once per kind, a control call that failed; a member that died is marked lost.

    A member that answers a step entry unconfigured, having joined configured, is marked to join again.
    """
    try:
        answer = ray.get(s.ref, timeout=0)
    except ray.exceptions.RayActorError as exc:
        lose(s, f"died: {message(exc)}")
    except Exception as exc:  # noqa: BLE001 - a failing worker must not stop the driver
        warn_once(f"control:{s.what}:{type(exc).__name__}", "profctx: a worker could not %s: %s", s.what,
                  message(exc))
    else:
        _answered(s, answer)


def _answered(s: Sent, answer: object) -> None:
    if s.what == "enter step" and answer is False and s.member.joined_ok:
        s.member.unjoined = True  # configured when it joined, not now: a new process (Ray restarted it)


def lose(s: Sent, why: str) -> None:
    """Mark ``s.member`` lost (recorded once per loss, with group, rank, pid and why); keep its unanswered call."""
    member = s.member
    if why.startswith("died"):
        member.pending = []
        member.dead = True
    elif s not in member.pending:
        member.pending.append(s)
    if s.what == "enter step" and s.step is not None and not why.startswith("died"):
        member.entered = s.step  # told to enter, not yet to leave: it must leave once it answers
    if member.lost is not None:
        return
    member.lost = why
    step = s.step if s.step is not None else OWNER.last_step
    logger.warning("profctx: worker group %r rank %s (pid %s) is lost: %s; not waited for until it answers",
                   member.group, member.rank, member.pid, why)
    runtime = OWNER.runtime
    if runtime is None or step is None:
        return
    try:
        # The worker is named in the error too: listings show the error, in the driver's row.
        runtime.record(failed_call(step, None, f"{member.group} rank {member.rank} lost: {why}",
                                   f"worker {member.group} rank {member.rank} lost",
                                   target_group=member.group, target_rank=member.rank, target_pid=member.pid,
                                   lost=True))
    except Exception as exc:  # noqa: BLE001 - recording must not break the driver
        logger.debug("profctx: could not record a lost worker: %s", exc)


def available(member: Any, leave: Any) -> bool:
    """Whether ``member`` takes control calls now; a lost member that answered everything rejoins.

    ``leave(step)`` sends the member the step exit it missed and returns the :class:`Sent`;
    the member rejoins once that is answered too.
    """
    if member.lost is None:
        return True
    if member.dead:
        return False
    owed = list(member.pending)
    ready = set(ray.wait([s.ref for s in owed], num_returns=len(owed), timeout=0)[0]) if owed else set()
    for s in owed:
        if s.ref in ready:
            report(s)  # a death keeps it lost for good
    member.pending = [s for s in owed if s.ref not in ready]
    if member.dead or member.pending:
        return False
    if member.entered is not None:
        step, member.entered = member.entered, None
        member.pending = [leave(member, step)]
        return False
    logger.warning("profctx: worker group %r rank %s (pid %s) answers again (it was lost: %s)",
                   member.group, member.rank, member.pid, member.lost)
    member.lost = None
    return True


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def message(error: object) -> str:
    """Return ``Type: first line`` of the actor's own error (Ray's cause, without its coloured header)."""
    if not isinstance(error, BaseException):
        return str(error)
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        error = cause
    lines = [line for line in _ANSI.sub("", str(error)).strip().splitlines() if line.strip()]
    if lines and lines[0].startswith("ray::") and len(lines) > 1:
        lines = lines[1:]
    return f"{type(error).__name__}: {lines[0].strip() if lines else ''}"
