"""Worker groups, driver side: registration, the step hook that drives the members, calls, copying files back.

Loaded on first use of a name of :mod:`profctx.ray` (the package itself is light: a member's
join imports the package to reach :mod:`profctx.ray._worker`, and needs none of this).
"""

from __future__ import annotations

import asyncio
import os
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from ..core._layout import MANIFEST_DIR
from ..process._block import current
from ..process._owner import OWNER
from ..process._propagate import _config_dict
from ..records._listing import INDEX_SUFFIX
from ..records._manifest import failed_call
from ..util._files import is_regular
from ..util._fs import walk
from ..util._log import logger, warn_once
from . import _control, _worker
from ._control import Sent
from ._control import message as _message

__all__ = ["WorkerGroup", "fan_out", "fan_out_async", "flush", "flush_async", "group", "group_async", "groups",
           "submit"]

#: A target: a bound actor method (``handle.method``) or ``(handle, "method")``.
Target = Any

#: Seconds the driver waits, by default, for a worker to answer a control call (``group(control_timeout=)``).
CONTROL_TIMEOUT = _control.DEFAULT_TIMEOUT
#: Seconds the driver waits, at exit or ``reset()``, for its workers to leave a step it was still in.
RELEASE_TIMEOUT = 10.0

@dataclass(eq=False)
class Member:
    """One worker of a group, as it reported itself when it joined."""

    handle: Any
    rank: int
    pid: int | None = None
    host: str | None = None
    main: bool = True
    #: Whether the driver copies this member's files (it does not write where the driver reads).
    collect: bool = False
    #: For a collected member: bytes of each file copied so far, by path under save_path.
    copied: dict[str, int] = field(default_factory=dict)
    group: str = ""
    #: Seconds the driver waits for this member's answer to a control call.
    timeout: float = CONTROL_TIMEOUT
    #: (group, rank) the member files as (its own configuration may say otherwise than the driver).
    identity: tuple[str, int] | None = None
    #: Whether the member keeps a configuration of its own, or has engines attached: it acts in every step.
    acts_always: bool = False
    #: Why the member is lost (it missed a control timeout or died), or ``None``.
    lost: str | None = None
    dead: bool = False
    #: Control calls a lost member still owes an answer to.
    pending: list[Any] = field(default_factory=list)
    #: The step a lost member was told to enter and not yet to leave.
    entered: int | None = None
    #: Ray's actor id (hex), as the member reported it: what names it in a death Ray reports.
    actor_id: str | None = None
    #: Whether the member joined with the driver's configuration (so a step entry it cannot hold means a new process).
    joined_ok: bool = False
    #: Whether the member answered a step entry unconfigured (Ray restarted it): it is joined again.
    unjoined: bool = False
    #: Its join, unanswered when the group's ``timeout`` ran out: read when it answers (told of no step until then).
    joining: Any = None

    def acts(self, config: Any) -> bool:
        """Whether this member does anything in an in-window step under the driver's ``config``."""
        if self.acts_always or config is None:
            return True
        group, rank = self.identity or (self.group, self.rank)
        return bool(config.selects(group, rank))


@dataclass(eq=False)
class Joining:
    """The join calls :func:`group` sent and nobody has waited for yet."""

    refs: list[Any]
    #: When the members that have not joined stop being waited for (monotonic seconds; ``None``: never).
    deadline: float | None
    timeout: float | None


class WorkerGroup:
    """A named group of actors: rank = position (or the ``ranks`` given), world size = group size.

    Returned by :func:`group`; ``members`` lists where each worker runs. Reading ``members``
    first waits for the joins still under way (those of every group, at most each group's
    ``timeout``).
    """

    __slots__ = ("_members", "joining", "name", "sent", "world_size")

    def __init__(self, name: str, members: list[Member], world_size: int) -> None:
        self.name = name
        self._members = members
        self.world_size = world_size
        #: The configuration the members were last given (re-sent when the driver reconfigures).
        self.sent: Any = None
        #: The join calls not yet waited for, if any.
        self.joining: Joining | None = None

    @property
    def members(self) -> list[Member]:
        """The members, in rank order of registration, once their joins are settled."""
        if self.joining is not None:
            driver = OWNER.driver
            if isinstance(driver, Driver) and driver.groups.get(self.name) is self:
                driver.settle()
            else:
                self.joining = None  # forgotten by reset(): nobody needs its joins
        return self._members

    @property
    def handles(self) -> list[Any]:
        """The actor handles, in rank order of registration."""
        return [m.handle for m in self._members]

    def __repr__(self) -> str:
        return f"WorkerGroup(name={self.name!r}, world_size={self.world_size}, members={len(self._members)})"


class Driver:
    """The driver's worker groups, and the step hook telling them about in-window steps.

    Lives in ``OWNER.driver`` (``profctx.reset()`` ends it). One step at a time: a step block
    nested in another (or entered concurrently by another task) does not reach the workers.
    """

    def __init__(self) -> None:
        self.groups: dict[str, WorkerGroup] = {}
        self.step: int | None = None
        self._lock = threading.Lock()
        self.claims: dict[tuple[str, int], int] = {}
        #: Control calls not waited for when sent (sync members: Ray keeps the order).
        self.leaving: list[Sent] = []
        #: The members told to enter the current step (told to leave it with the driver).
        self.told: list[Member] = []
        #: The members whose join had not answered by their group's timeout (adopted when it does).
        self.late: list[Member] = []
        #: Joins sent to members Ray restarted, at a step's end: waited for before the next block opens.
        self.restarting: list[Sent] = []

    # -- registration ---------------------------------------------------------------------------

    def join_refs(self, grp: WorkerGroup, members: Sequence[Member] | None = None) -> list[Any]:
        """Send the driver's configuration and each member's identity; return the object refs.

        ``members``: those to send to (default: every member that is not lost).
        """
        config = OWNER.config
        runtime = OWNER.runtime
        carried = _config_dict(config) if config is not None and config.active else None
        spec: dict[str, Any] = {"group": grp.name, "world_size": grp.world_size, "config": carried}
        if runtime is not None and carried is not None:
            # Absolute: a worker's working folder is not the driver's.
            carried = spec["config"] = {**carried, "save_path": str(runtime.save_path)}
            spec["save_path"] = str(runtime.save_path)
            spec["probe"] = str(_probe(runtime))
        grp.sent = config
        chosen = [m for m in grp._members if m.lost is None] if members is None else members
        return [m.handle.__ray_call__.remote(_worker.join, {**spec, "rank": m.rank}) for m in chosen]

    def settle(self) -> None:
        """Wait for the joins :func:`group` sent and nobody waited for: those of every group, together.

        Each group's members are waited for until its ``timeout`` (counted from ``group()``) runs
        out; one that has not joined by then is warned about once and adopted when its join
        answers (:meth:`adopt`), as :func:`group` says.
        """
        waiting = self._joining()
        while waiting:
            refs = [r for _, joining in waiting for r in joining.refs]
            ready = set(ray.wait(refs, num_returns=len(refs), timeout=_left(waiting))[0])
            waiting = self._settle_done(waiting, ready)
        rejoins, left = self._rejoins()
        if rejoins:
            ray.wait(rejoins, num_returns=len(rejoins), timeout=left)

    async def asettle(self) -> None:
        """The async twin of :meth:`settle` (awaits the refs' futures; never a blocking ``ray.wait``)."""
        waiting = self._joining()
        futures = {r: asyncio.wrap_future(r.future()) for _, joining in waiting for r in joining.refs}
        while waiting:
            await asyncio.wait([futures[r] for _, joining in waiting for r in joining.refs], timeout=_left(waiting))
            waiting = self._settle_done(waiting, {r for r, f in futures.items() if f.done()})
        rejoins, left = self._rejoins()
        if rejoins:
            await asyncio.wait([asyncio.wrap_future(r.future()) for r in rejoins], timeout=left)

    def _rejoins(self) -> tuple[list[Any], float]:
        """Take the joins sent to restarted members at the last step's end; return their refs and the wait left.

        Waited for before the next block opens anything, as fresh members' joins are: the new
        process's start-up and warm-up land between steps, not in the user's next step.
        """
        sent, self.restarting = self.restarting, []
        if not self._joining():
            with OWNER._lock:
                OWNER.settle = [p for p in OWNER.settle if p is not self]
        owed = [s for s in sent if s in s.member.pending]
        if not owed:
            return [], 0.0
        return [s.ref for s in owed], max(0.0, min(s.deadline for s in owed) - time.monotonic())

    def _restarted(self, told: Sequence[Member]) -> None:
        """At a step's end, send their join to the members ``told`` of it that Ray restarted.

        Such a member answered its step entry unconfigured (a new process). Never waits here: the
        join is waited for before the next block opens (:meth:`_rejoins`).
        """
        entries = [s for s in self.leaving if s.what == "enter step"]  # the leaves just sent cannot have answered
        if entries:
            unanswered = _control.check(entries)
            self.leaving = [s for s in self.leaving if (s.what != "enter step" or s in unanswered)
                            and s.member.lost is None]
        for m in told:
            grp = self.groups.get(m.group)
            if grp is not None and m.unjoined and not m.dead and not any(s.what == "join" for s in m.pending):
                sent = Sent(self.join_refs(grp, [m])[0], m, "join")
                m.pending = [sent]
                self.restarting.append(sent)
        if self.restarting:
            with OWNER._lock:
                if self not in OWNER.settle:
                    OWNER.settle = [*OWNER.settle, self]

    def _joining(self) -> list[tuple[WorkerGroup, Joining]]:
        return [(g, g.joining) for g in self.groups.values() if g.joining is not None]

    def _settle_done(self, waiting: list[tuple[WorkerGroup, Joining]],
                     ready: set[Any]) -> list[tuple[WorkerGroup, Joining]]:
        """Settle the groups whose members all answered or whose timeout ran out; return the others."""
        now = time.monotonic()
        still = []
        for grp, joining in waiting:
            if all(r in ready for r in joining.refs) or (joining.deadline is not None and now >= joining.deadline):
                self._settled(grp, joining, ready)
            else:
                still.append((grp, joining))
        return still

    def _settled(self, grp: WorkerGroup, joining: Joining, ready: set[Any]) -> None:
        """Read ``grp``'s join answers (those in ``ready``; the rest did not join in time) and note them, once."""
        with self._lock:  # two threads may settle at once (a step entry, a read of members): one notes them
            if grp.joining is not joining:
                return
            grp.joining = None
            if not self._joining():
                with OWNER._lock:
                    OWNER.settle = [p for p in OWNER.settle if p is not self]
            answered = [r for r in joining.refs if r in ready]
            try:
                answers = dict(zip(answered, ray.get(answered, timeout=0), strict=True)) if answered else {}
            except Exception:  # noqa: BLE001 - one of them failed: each is read on its own to say which
                answers = {}
                for ref in answered:
                    try:
                        answers[ref] = ray.get(ref, timeout=0)
                    except Exception as exc:  # noqa: BLE001 - reported per member
                        answers[ref] = exc
            for member, ref in zip(grp._members, joining.refs, strict=True):
                if ref in answers:
                    self._note(grp, member, answers[ref])
                    continue
                member.joining = ref
                self.late.append(member)
                warn_once(f"join-late:{grp.name}:{member.rank}", "profctx: worker %s rank %s has not joined within "
                          "%ss; it is told of no step until its join answers, then of every later one", grp.name,
                          member.rank, joining.timeout)

    def adopt(self) -> None:
        """Read the joins that answered after their group's timeout (never waits); those members act from now on."""
        if not self.late:
            return
        refs = [m.joining for m in self.late]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        if not ready:
            return
        still = []
        for member in self.late:
            if member.joining not in ready:
                still.append(member)
                continue
            try:
                result = ray.get(member.joining, timeout=0)
            except Exception as exc:  # noqa: BLE001 - reported per member by _note
                result = exc
            member.joining = None
            grp = self.groups.get(member.group)
            if grp is not None:
                self._note(grp, member, result)
                if member.pid is not None:
                    logger.warning("profctx: worker %s rank %s (pid %s) joined late; it takes part from the next "
                                   "in-window step", member.group, member.rank, member.pid)
        self.late = still

    def joined(self, grp: WorkerGroup, results: Sequence[Any]) -> None:
        """Note where each member runs; warn about duplicate claims and undecorated methods, once each."""
        for member, result in zip(grp._members, results, strict=True):
            self._note(grp, member, result)

    def _note(self, grp: WorkerGroup, member: Member, result: Any) -> None:
        """Note where ``member`` runs from its join ``result`` (warnings once each)."""
        if isinstance(result, BaseException) or not isinstance(result, Mapping):
            warn_once(f"join:{grp.name}:{member.rank}", "profctx: worker %s rank %s could not join: %s",
                      grp.name, member.rank, _message(result))
            return
        member.pid, member.host, member.main = result["pid"], result["host"], result["main"]
        member.collect = bool(result.get("collect"))
        member.acts_always = bool(result.get("own") or result.get("engines"))
        member.actor_id = result.get("actor_id")
        if result.get("identity"):
            member.identity = (str(result["identity"][0]), int(result["identity"][1]))
        member.joined_ok = not result.get("error") and result.get("identity") is not None
        if result.get("error"):
            warn_once(f"join-config:{grp.name}", "profctx: worker group %r cannot use the driver's configuration "
                      "(it runs unprofiled): %s", grp.name, result["error"])
        group_name, rank = result.get("identity") or (grp.name, member.rank)
        claimed = self.claims.setdefault((str(group_name), int(rank)), member.pid)
        if claimed != member.pid:
            warn_once(f"claim:{group_name}:{rank}",
                      "profctx: two processes (pids %s and %s) claim worker group %r rank %s; their rows "
                      "and files would be mixed up: give each process its own group and rank",
                      claimed, member.pid, group_name, rank)
        if result.get("undecorated"):
            warn_once(f"undecorated:{grp.name}",
                      "profctx: in worker group %r, @profiled methods %s arrived without profctx's wrapper: "
                      "Ray copies classes defined in the driver's __main__ by value and cloudpickle drops "
                      "the decorator. Define the actor class in an importable module; step captures still "
                      "cover these methods", grp.name, ", ".join(result["undecorated"]))
        if not member.main:
            warn_once(f"threaded:{grp.name}",
                      "profctx: worker group %r runs profctx's control calls off the main thread (an async "
                      "or threaded actor): its step captures start on a profctx thread, so torch records "
                      "device activity of every thread but CPU operators of that thread only", grp.name)

    # -- the step hook ---------------------------------------------------------------------------

    def _refs(self, fn: Any, step: int) -> tuple[list[Sent], list[Sent]]:
        """Send ``fn(step)`` to the members that act in the step; return the calls to wait for now, and those that can.

        Entering reaches only the members the driver's configuration selects (or that keep
        their own, or drive engines) and that are not lost; leaving reaches those told to
        enter. Ray runs one caller's calls to a sync actor in the order they were sent, so a
        sync member (its calls on its main thread) has entered the step before it serves any
        later call of the driver: its reply can wait. Async and threaded members run calls
        concurrently, and members whose files the driver copies must have written them: those
        are waited for now (each at most its control timeout).
        """
        now: list[Sent] = []
        later: list[Sent] = []
        leaving = fn is _worker.step_exit
        what = "leave step" if leaving else "enter step"
        config = OWNER.config
        request = None if leaving else _request_at(step)
        if leaving:
            members, self.told = [m for m in self.told if m.lost is None], []
        else:
            members = []
            for grp in list(self.groups.values()):
                if grp.sent is not config:  # reconfigured: members take the new config first
                    joins = self.join_refs(grp)
                    now.extend(Sent(r, m, "join") for r, m in zip(joins, [m for m in grp._members if m.lost is None],
                                                                   strict=True))
                for m in grp._members:
                    if m.joining is not None:  # not joined yet: told of the steps after its join is read
                        continue
                    if (m.dead or m.unjoined) and not self._rejoin(grp, m):
                        continue
                    if _acts(m, config, request) and _control.available(m, self._leave):
                        members.append(m)
            self.told = members
        if not members:
            return now, later
        # When each call was sent, on the wall clock the worker reads too: a worker that serves one more than its
        # control timeout later did not run the step (it was stopped or starved), and says so instead of capturing.
        wall, mono = time.time(), time.monotonic()
        owed: dict[int, float] = {}
        for s in self.leaving:  # the calls not known answered: a member still owing one is as late as the oldest
            if owed.get(id(s.member), mono) > s.at:
                owed[id(s.member)] = s.at
        for m in members:
            since = wall - (mono - owed.get(id(m), mono))
            if leaving:
                ref = m.handle.__ray_call__.remote(fn, step, m.collect, (wall, m.timeout))
            else:
                ref = m.handle.__ray_call__.remote(fn, step, None if request is None else request.to_dict(),
                                                   (since, m.timeout))
            sent = Sent(ref, m, what, step, mono)
            (now if m.collect or (not leaving and not m.main) else later).append(sent)
        return now, later

    def _rejoin(self, grp: WorkerGroup, member: Member) -> bool:
        """Join again a member that died or answered unconfigured (Ray may have restarted it); return if it is back.

        The join is sent at one in-window step and read at a later one, never waited for: a
        member that stays dead costs one failed call per in-window step.
        """
        owed = [s for s in member.pending if s.what == "join"]
        if not owed:
            member.pending = [Sent(self.join_refs(grp, [member])[0], member, "join")]
            return False
        sent = owed[0]
        if not ray.wait([sent.ref], num_returns=1, timeout=0)[0]:
            if time.monotonic() >= sent.deadline:
                member.pending = []  # sent again at the next step
            return False
        member.pending = []
        try:
            result = ray.get(sent.ref)
        except Exception:  # noqa: BLE001 - still dead: asked again at the next step
            return False
        old = member.pid
        self.claims.pop(member.identity or (grp.name, member.rank), None)
        self._note(grp, member, result)
        member.dead = member.unjoined = False
        member.lost, member.entered = None, None
        logger.warning("profctx: worker group %r rank %s joined again as pid %s (was pid %s; Ray restarted it)",
                       grp.name, member.rank, member.pid, old)
        return True

    @staticmethod
    def _leave(member: Member, step: int) -> Sent:
        """Tell ``member`` (lost while told to enter ``step``) to leave it."""
        return Sent(member.handle.__ray_call__.remote(_worker.step_exit, step), member, "leave step", step)

    def collected(self) -> list[Member]:
        """The members whose files the driver copies."""
        return [m for grp in self.groups.values() for m in grp._members if m.collect]

    def _claim(self, step: int | None) -> bool:
        with self._lock:
            if self.step is not None or step is None:
                return False
            self.step = step
            return True

    def leftovers(self) -> list[Sent]:
        """Take the control calls not waited for when sent (see :meth:`_refs`)."""
        sent, self.leaving = self.leaving, []
        return sent

    def reap(self) -> None:
        """Report the control calls that answered since they were sent, mark lost the members past their timeout.

        Never waits: a sync member that has not answered within its control timeout is lost. A
        join that answered after its group's timeout is read here too.
        """
        self.leaving = [s for s in _control.check(self.leftovers()) if s.member.lost is None]
        self.adopt()

    def enter(self, runtime: Any, scope: Any) -> object:
        if not self.groups or not self._claim(scope.step):
            return None
        self.settle()
        self.reap()
        now, later = self._refs(_worker.step_enter, scope.step)
        _wait(now)
        self.leaving.extend(later)
        return scope.step

    def exit(self, runtime: Any, handle: object) -> None:
        """Tell the workers the step ended, waiting only where :meth:`_refs` says it must.

        The next step's entry, or ``flush``, waits for the rest and reports failures.
        """
        try:
            told = self.told
            acted = [m for m in told if m.collect]  # only they wrote anything in this step
            now, later = self._refs(_worker.step_exit, handle)  # type: ignore[arg-type]
            self.leaving.extend(later)
            _wait(now)
            if acted:
                collect(runtime, acted)
            self._restarted(told)
        finally:
            self.step = None

    async def aenter(self, runtime: Any, scope: Any) -> object:
        if not self.groups or not self._claim(scope.step):
            return None
        await self.asettle()
        self.reap()  # never blocks
        now, later = self._refs(_worker.step_enter, scope.step)
        await _await(now)
        self.leaving.extend(later)
        return scope.step

    async def aexit(self, runtime: Any, handle: object) -> None:
        try:
            told = self.told
            acted = [m for m in told if m.collect]
            now, later = self._refs(_worker.step_exit, handle)  # type: ignore[arg-type]
            self.leaving.extend(later)
            await _await(now)
            if acted:
                await asyncio.to_thread(collect, runtime, acted)
            self._restarted(told)
        finally:
            self.step = None

    def check_config(self, config: Any) -> None:
        return None

    def shutdown(self) -> None:
        """Tell the workers to leave a step the driver is still in (exit, SIGTERM, ``reset()``).

        Without it a worker would keep holding the step, its capture recording, until its own
        process ends. Waits at most :data:`RELEASE_TIMEOUT` seconds; never raises.
        """
        step, self.step = self.step, None
        if step is None or not self.groups or not ray.is_initialized():
            return
        try:
            told, self.told = self.told, []
            refs = [m.handle.__ray_call__.remote(_worker.step_exit, step) for m in told if m.lost is None]
            refs.extend(s.ref for s in self.leftovers() if s.member.lost is None)
            ray.wait(refs, num_returns=len(refs), timeout=RELEASE_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - an exit path: report, never raise
            warn_once("release-workers", "profctx: could not tell the workers to leave step %s: %s", step, exc)

    def reset(self) -> None:
        self.shutdown()
        for grp in self.groups.values():
            grp.joining = None
        self.groups.clear()
        self.claims.clear()
        self.leaving = []
        self.told = []
        self.late = []
        self.restarting = []
        self.step = None


#: Bytes per chunk when the driver copies a worker's files (the most held in memory at once, per file).
CHUNK = 8 * 2**20


def _probe(runtime: Any) -> Path:
    """Write (once per run) the file a worker looks for to tell whether it shares the driver's save_path."""
    path: Path = runtime.save_path / MANIFEST_DIR / f"probe-{runtime.run_id}"
    try:
        written = stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        written = False
    if not written:  # a link planted at this predictable name is replaced, never followed
        with walk(runtime.save_path, MANIFEST_DIR) as folder:  # no link followed below save_path
            folder.write(path.name, b"profctx: a worker that sees this file shares the driver's save_path\n")
    return path


def collect(runtime: Any, members: Sequence[Member]) -> int:
    """Copy what ``members`` wrote since the last copy into the driver's save_path; return the bytes copied.

    For workers that do not share the driver's file system. Each file is read in chunks of
    :data:`CHUNK` bytes through ``__ray_call__`` and appended where it belongs, so no trace is
    ever held whole in memory; traces come before the manifest shard that names them. A
    failure is logged once per member and the copy goes on at the next step.
    """
    root = runtime.save_path.resolve()
    total = 0
    for member in members:
        try:
            if member.lost is not None:
                continue
            listing = ray.get(member.handle.__ray_call__.remote(_worker.listing), timeout=member.timeout)
            for relative, size in listing:
                target = (root / relative).resolve()
                if root not in target.parents:
                    raise ValueError(f"{relative!r} is not under the save_path")
                done = member.copied.get(relative, 0)
                if size < done or (relative.endswith(INDEX_SUFFIX) and size != done):
                    done = 0  # rewritten (a shard recreated, an index written anew at close): copied again whole
                with walk(root, Path(relative).parent) as folder:  # each folder: no link followed
                    fd = os.open(Path(relative).name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
                                 | getattr(os, "O_CLOEXEC", 0), 0o666, dir_fd=folder.fd)
                if not is_regular(fd) or os.fstat(fd).st_nlink != 1:  # a hard link: another file's bytes
                    os.close(fd)
                    raise ValueError(f"{relative!r} is not a regular file of its own under the save_path")
                with os.fdopen(fd, "wb") as out:  # a descriptor: nothing truncated
                    out.seek(done)
                    while done < size:
                        chunk = ray.get(member.handle.__ray_call__.remote(
                            _worker.read_chunk, relative, done, min(CHUNK, size - done)), timeout=member.timeout)
                        if not chunk:
                            break
                        out.write(chunk)
                        done += len(chunk)
                        total += len(chunk)
                    out.truncate(done)
                member.copied[relative] = done
        except Exception as exc:  # noqa: BLE001 - copying later is better than breaking the step
            warn_once(f"collect:{member.pid}:{type(exc).__name__}",
                      "profctx: could not copy the files of worker pid %s to the driver: %s", member.pid,
                      _message(exc))
    return total


def _request_at(step: int) -> Any:
    """Return the on-demand or anomaly request whose steps the driver captures at ``step``, if any."""
    runtime = OWNER.runtime
    ondemand = runtime.ondemand if runtime is not None else None
    return None if ondemand is None else ondemand.current(step)


def _acts(member: Member, config: Any, request: Any) -> bool:
    """Whether ``member`` acts in the step: the driver's selection, or the request's (``--group``, ``--ranks``)."""
    if request is None:
        return member.acts(config)
    group, rank = member.identity or (member.group, member.rank)
    return bool(request.selects(group, rank, member.acts(config)))


def _left(waiting: Sequence[tuple[WorkerGroup, Joining]]) -> float | None:
    """Seconds until the first of ``waiting``'s join deadlines (``None``: none has one)."""
    ends = [joining.deadline for _, joining in waiting if joining.deadline is not None]
    return max(0.0, min(ends) - time.monotonic()) if ends else None


def _wait(sent: list[Sent]) -> None:
    """Wait for control calls from sync code; inside a running event loop, do not block (logged once)."""
    if not sent:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        warn_once("control-in-loop",
                  "profctx: a step block in async code uses 'with'; workers are told without waiting. "
                  "Use 'async with profctx.profile_step(step):' so they have entered the step before your calls")
        return
    _control.wait(sent)


async def _await(sent: list[Sent]) -> None:
    await _control.await_(sent)


def _the_driver() -> Driver:
    driver = OWNER.driver
    if driver is None:
        driver = OWNER.driver = Driver()
        OWNER.step_hooks.append(driver)
    assert isinstance(driver, Driver)
    return driver


def _new_group(name: str, handles: Sequence[Any], ranks: Sequence[int] | None,
               world_size: int | None, control_timeout: float) -> tuple[Driver, WorkerGroup]:
    timeout = _control.check_timeout(control_timeout)
    if not isinstance(name, str) or not name or not all(c.isascii() and (c.isalnum() or c in "._-") for c in name):
        raise ValueError(f"name: {name!r} is not valid; a group name is letters, digits, '.', '_' or '-'")
    if name == "driver":
        raise ValueError("name: 'driver' is reserved for the driver's own row; pick another group name")
    handles = list(handles)
    if not handles:
        raise ValueError(f"handles: group {name!r} has no actors; give at least one actor handle")
    for handle in handles:
        if not hasattr(handle, "__ray_call__"):
            raise TypeError(f"handles: {handle!r} is not a Ray actor handle")
    chosen = list(range(len(handles))) if ranks is None else list(ranks)
    if len(chosen) != len(handles) or len(set(chosen)) != len(chosen):
        raise ValueError(f"ranks: {chosen!r} must give one distinct rank per actor ({len(handles)} actors)")
    world = len(handles) if world_size is None else world_size
    if any(not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < world for r in chosen):
        raise ValueError(f"ranks: {chosen!r} must be integers in [0, {world})")
    driver = _the_driver()
    if name in driver.groups:
        raise ValueError(f"name: a worker group {name!r} is already registered; use another name")
    grp = WorkerGroup(name, [Member(h, r, group=name, timeout=timeout) for h, r in zip(handles, chosen, strict=True)],
                      world)
    driver.groups[name] = grp
    return driver, grp


def group(name: str, handles: Sequence[Any], *, ranks: Sequence[int] | None = None,
          world_size: int | None = None, timeout: float | None = 120.0,
          control_timeout: float = CONTROL_TIMEOUT) -> WorkerGroup:
    """Register actors as the worker group ``name``; return it with the joins sent, not waited for.

    Rank = position in ``handles`` (or ``ranks[i]``); world size = number of handles (or
    ``world_size``). Each member gets the driver's configuration (unless it configured
    itself) and its identity, so its files and manifest records carry the group and rank.
    The joins of every group registered so far are waited for together at the first point
    that needs them: the next block that opens anything, before it opens its capture (so a
    member's backend warm-up lands in no capture, the driver's included), :func:`flush`, or
    reading ``WorkerGroup.members``. Register before the first profiled step, after
    ``profctx.configure`` (a later reconfiguration reaches the members at the next step). In
    async code use :func:`group_async`. ``timeout``: seconds, counted from this call, that
    the members are waited for to join; one that has not is warned about once, told of no
    step, and adopted at the first in-window step (or ``flush``) after its join answers.
    ``control_timeout``: the longest the driver waits for a member's answer to a step's
    control call; a member that misses it is lost (recorded once, not waited for until it
    answers). Raise ``ConfigError`` for a ``control_timeout`` that is not a number > 0.
    """
    _refuse_inside_loop("group", "group_async")
    driver, grp = _new_group(name, handles, ranks, world_size, control_timeout)
    refs = driver.join_refs(grp)
    grp.joining = Joining(refs, None if timeout is None else time.monotonic() + timeout, timeout)
    with OWNER._lock:  # the next block that opens anything settles the joins first: no warm-up in a capture
        if driver not in OWNER.settle:
            OWNER.settle = [*OWNER.settle, driver]
    return grp


async def group_async(name: str, handles: Sequence[Any], *, ranks: Sequence[int] | None = None,
                      world_size: int | None = None, control_timeout: float = CONTROL_TIMEOUT) -> WorkerGroup:
    """The async twin of :func:`group` (awaits the joins; never a blocking ``ray.get``)."""
    driver, grp = _new_group(name, handles, ranks, world_size, control_timeout)
    results = await asyncio.gather(*driver.join_refs(grp), return_exceptions=True)
    driver.joined(grp, list(results))
    return grp


def groups() -> dict[str, WorkerGroup]:
    """Return the registered worker groups by name."""
    driver = OWNER.driver
    return dict(driver.groups) if isinstance(driver, Driver) else {}


# -- calls ------------------------------------------------------------------------------------


def _method(target: Target) -> Any:
    if isinstance(target, tuple):
        if len(target) != 2 or not isinstance(target[1], str):
            raise TypeError(f"target {target!r}: expected (actor handle, 'method name') or handle.method")
        return getattr(target[0], target[1])
    if not hasattr(target, "remote"):
        raise TypeError(f"target {target!r}: expected (actor handle, 'method name') or handle.method")
    return target


def submit(targets: Sequence[Target], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> list[Any]:
    """Call one method on every target with the same arguments; return the object refs, in order (no wait)."""
    methods = [_method(t) for t in targets]
    call_kwargs = dict(kwargs or {})
    return [method.remote(*args, **call_kwargs) for method in methods]


def fan_out(targets: Sequence[Target], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
            return_exceptions: bool = False, timeout: float | None = None) -> list[Any]:
    """Call one method on every target concurrently and wait for all; return the results in order.

    Every call runs to its end even if another fails. Then, if any call failed, the first
    error is raised exactly as ``ray.get`` raises it (``return_exceptions=True`` returns
    errors in the list instead). An actor that died during an in-window step is recorded in
    this process's manifest (a worker records its own raised errors). Raise ``RuntimeError``
    inside a running event loop: use ``await fan_out_async(...)`` there. ``timeout`` (seconds)
    raises ``ray.exceptions.GetTimeoutError`` if the calls are not all done in time.
    """
    _refuse_inside_loop("fan_out", "fan_out_async")
    refs = submit(targets, args, kwargs)
    if not refs:
        return []
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if pending:
        raise ray.exceptions.GetTimeoutError(f"fan_out: {len(pending)} of {len(refs)} calls not done in {timeout}s")
    results: list[Any] = []
    for ref in refs:
        try:
            results.append(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - collected, recorded, re-raised below
            results.append(exc)
    return _settle(targets, results, return_exceptions)


async def fan_out_async(targets: Sequence[Target], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
                        *, return_exceptions: bool = False, timeout: float | None = None) -> list[Any]:
    """The async twin of :func:`fan_out`: awaits the object refs with ``asyncio.gather``, never ``ray.get``.

    ``timeout`` raises ``TimeoutError`` (the calls themselves keep running).
    """
    refs = submit(targets, args, kwargs)
    gathered = asyncio.gather(*refs, return_exceptions=True)
    results = list(await (gathered if timeout is None else asyncio.wait_for(gathered, timeout)))
    return _settle(targets, results, return_exceptions)


def _settle(targets: Sequence[Target], results: list[Any], return_exceptions: bool) -> list[Any]:
    failures = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    if not failures:
        return results
    for index, error in failures:
        if isinstance(error, ray.exceptions.RayActorError):
            _record_death(targets[index], error)
    if return_exceptions:
        return results
    raise failures[0][1]


def _member_of(target: Target, error: BaseException | None = None) -> Member | None:
    """Return the group member ``target`` calls: by handle, or for ``handle.method`` by the actor id in ``error``."""
    if isinstance(target, tuple):
        return _member_for(target[0])
    actor_id = getattr(error, "actor_id", None)
    if not actor_id:
        return None
    for grp in groups().values():
        for member in grp.members:
            if member.actor_id == actor_id:
                return member
    return None


def _describe(target: Target) -> str:
    if isinstance(target, tuple):
        return str(target[1])
    return str(getattr(target, "_method_name", None) or target)


def _record_death(target: Target, error: BaseException) -> None:
    """Record that an actor died during an in-window step (it cannot record it itself)."""
    runtime = OWNER.runtime
    if runtime is None:
        return
    scope = current()
    if scope.step is None or scope.step not in runtime.window:
        return
    method = _describe(target)
    member = _member_of(target, error)
    if member is not None and member.lost is not None:
        return  # recorded when it was lost (its control calls failed first): one row per member
    group_name, rank = (member.group, member.rank) if member is not None else (None, None)
    # Filed in the step it stopped answering in: a control call still unanswered says it died in that step.
    step = _owed_step(member) if member is not None else None
    runtime.record(failed_call(scope.step if step is None else step, "/".join((*scope.roles, method)),
                               _message(error), f"the actor running {method} died", target_group=group_name,
                               target_rank=rank, target_pid=None if member is None else member.pid, lost=True))
    if member is not None:  # recorded here: the control calls do not record it again
        member.lost, member.dead, member.pending = f"died: {_message(error)}", True, []


def _owed_step(member: Member) -> int | None:
    """Return the earliest step of a control call ``member`` has not answered (``None``: it owes none)."""
    driver = OWNER.driver
    if not isinstance(driver, Driver):
        return None
    steps = [s.step for s in driver.leaving if s.member is member and s.step is not None]
    return min(steps) if steps else None


def _refuse_inside_loop(name: str, twin: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"{name} blocks on ray.get and was called inside a running event loop; "
                       f"use 'await profctx.ray.{twin}(...)' there")


def _handles(actors: Sequence[Any]) -> list[Any]:
    out = []
    for a in actors:
        if isinstance(a, WorkerGroup):
            out.extend(a.handles)
        else:
            out.append(a[0] if isinstance(a, tuple) else a)
    return out


def flush(actors: Sequence[Any] | None = None, timeout: float | None = 60.0) -> list[bool]:
    """Make every actor stop its open capture and write its files; return, per actor, whether all finished.

    ``actors``: actor handles, ``(handle, name)`` targets or worker groups; ``None``: every
    member of every registered group. Call before reading the manifest or shutting Ray down:
    workers write traces on a background thread. A dead or lost actor gives ``False`` (a lost
    one is not called; an actor is waited for at most ``timeout`` plus its control timeout).
    """
    _refuse_inside_loop("flush", "flush_async")
    driver = OWNER.driver
    if isinstance(driver, Driver):
        driver.settle()
        _wait(driver.leftovers())
        driver.adopt()
    handles = _handles(list(groups().values()) if actors is None else actors)
    refs = _flush_refs(handles, timeout)
    live = [r for r in refs if r is not None]
    ready = set(ray.wait(live, num_returns=len(live), timeout=_flush_bound(handles, timeout))[0]) if live else set()
    out = []
    for ref in refs:
        try:
            out.append(ref in ready and bool(ray.get(ref)))
        except Exception:  # noqa: BLE001 - a dead actor has nothing left to write
            out.append(False)
    _collect_from(handles)
    return out


def _member_for(handle: Any) -> Member | None:
    for grp in groups().values():
        for member in grp._members:
            if member.handle == handle:
                return member
    return None


def _flush_refs(handles: Sequence[Any], timeout: float | None) -> list[Any]:
    """Send ``flush`` to each handle that is not a lost member (``None`` in its place)."""
    refs: list[Any] = []
    for handle in handles:
        member = _member_for(handle)
        lost = member is not None and member.lost is not None
        refs.append(None if lost else handle.__ray_call__.remote(_worker.flush, timeout))
    return refs


def _flush_bound(handles: Sequence[Any], timeout: float | None) -> float:
    members = [_member_for(h) for h in handles]
    return (timeout or 0.0) + max((m.timeout for m in members if m is not None), default=CONTROL_TIMEOUT)


def _collect_from(handles: Sequence[Any]) -> None:
    runtime, driver = OWNER.runtime, OWNER.driver
    if runtime is None or not isinstance(driver, Driver):
        return
    members = [m for m in driver.collected() if any(m.handle == h for h in handles)]
    if members:
        collect(runtime, members)


async def flush_async(actors: Sequence[Any] | None = None, timeout: float | None = 60.0) -> list[bool]:
    """The async twin of :func:`flush`."""
    driver = OWNER.driver
    if isinstance(driver, Driver):
        await driver.asettle()
        await _await(driver.leftovers())
        driver.adopt()
    handles = _handles(list(groups().values()) if actors is None else actors)
    refs = _flush_refs(handles, timeout)
    futures = [asyncio.wrap_future(r.future()) for r in refs if r is not None]
    if futures:
        await asyncio.wait(futures, timeout=_flush_bound(handles, timeout))
    done = iter(futures)
    results = [False if r is None else _result(next(done)) for r in refs]
    await asyncio.to_thread(_collect_from, handles)
    return results


def _result(future: asyncio.Future[Any]) -> bool:
    if not future.done():
        return False
    return not future.cancelled() and future.exception() is None and future.result() is True

