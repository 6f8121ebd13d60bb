"""On-demand capture and capture on anomaly in one process: the requests it reads, the steps it adds.

The runtime of a configuration with ``on_demand`` or ``auto_capture`` holds one :class:`OnDemand`.
Its poll thread (a daemon, one per process, ended by ``profctx.reset()`` and at exit) looks at
``{save_path}/.profctx/requests/`` every :data:`POLL_S` seconds and publishes this process's
progress in ``{save_path}/.profctx/live/``; the training thread pays nothing per block for it:
an accepted request only adds its steps to the runtime's window (``Runtime.in_window``, the set
the block fast path tests), and at the first of those steps the runtime swaps in the request's
policy (:meth:`OnDemand.boundary`). Decisions come from :mod:`profctx.core._ondemand`.

Only a process outside every worker group looks (the Ray driver, or each rank of a job without
Ray); a worker group member follows the requests its driver sends with each step entry.

Who names the steps: a relative request (``profctx trigger``) and an anomaly are decided by one
process, the *decider*: the only process, the Ray driver, or rank 0 of a job without Ray. It
names the first step at a step entry, from its own progress: the step after the one it enters.
In a job of several ranks without Ray it then writes the request, first step named, as the
*agreed* request ``{run}.agreed.{n}.json`` before its step goes on, and every other rank looks
for the next agreed name (one ``os.access``) at each step entry, before the window is looked at.
A rank enters the step after that one only once the decider's step went through the collectives
they share, so it reads the request in time whatever the load: the capture lands on the step
named, within 2 steps of an anomaly, on every rank. Ranks with no collective between them (plain
processes) may run ahead of the decider: a rank that entered the step already records the
request ``skipped``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Container, Iterable
from pathlib import Path
from typing import Any, Final, Protocol

from ..core._config import ProfilerConfig
from ..core._layout import MANIFEST_DIR, capture_folder, safe
from ..core._ondemand import (
    MAX_REQUEST_BYTES,
    Request,
    RequestError,
    admit,
    anomaly,
    at_step,
    overlapping,
    parse,
    reason,
)
from ..core._plan import Policy
from ..core._vocab import CAPTURE_KINDS, capture_kind
from ..core._window import StepWindow
from ..records._manifest import capture_record
from ..util._fs import Folder, walk
from ..util._identity import capture_id
from ..util._log import logger, warn_once
from . import _timeline
from ._timeline import Timeline


class Host(Protocol):
    """What requests need from the runtime that holds them (``_runtime.Runtime``)."""

    config: ProfilerConfig
    save_path: Path
    window: StepWindow
    in_window: Container[int]
    run_id: str
    owner: Any

    @property
    def tool(self) -> str: ...

    def identity(self) -> Any: ...

    def record(self, record: Any) -> None: ...

    def rewindow(self, steps: Iterable[int]) -> None: ...

    def swap_policies(self, policies: dict[bool, Policy]) -> None: ...

#: Seconds between two looks at the requests folder (and two updates of the progress file).
POLL_S: Final = 0.5
#: Seconds after which the progress file is written again even if the step did not change.
HEARTBEAT_S: Final = 5.0
#: A progress file not updated for this long belongs to no live process (``profctx trigger``).
STALE_S: Final = 15.0
#: Folders under ``{save_path}/.profctx/``.
REQUESTS: Final = "requests"
LIVE: Final = "live"
#: Version of the progress file.
LIVE_VERSION: Final = 1
#: Request files looked at per poll, at most (a flood of files costs bounded time per poll).
MAX_FILES_PER_POLL: Final = 256
#: Requests whose state a progress file publishes (the latest ones).
MAX_STATUS: Final = 16

_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,100}\.json")


class Scheduled:
    """A request this process accepted: its steps are in the window; ``started`` once its first step began."""

    __slots__ = ("request", "started")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.started = False


def live_name(run_id: str, host: str, pid: int) -> str:
    """Return the name of a process's progress file."""
    return f"{safe(run_id)}.{safe(host)}.{pid}.json"


def agreed_name(run_id: str, number: int) -> str:
    """Return the name of the ``number``-th agreed request of a run (1, 2, ...; see the module's docstring)."""
    return f"{safe(run_id)}.agreed.{number}.json"


class OnDemand:
    """The requests of one runtime: read, admitted, scheduled, started; the anomaly watch; the poll thread."""

    def __init__(self, runtime: Host) -> None:
        self.rt = runtime
        config = runtime.config
        self.on_demand = config.on_demand
        self.cap = config.on_demand_max_captures
        self.auto = config.auto_capture
        self.root = runtime.save_path / MANIFEST_DIR
        self.lock = threading.RLock()
        #: Requests accepted, by origin (each counts against its cap).
        self.accepted = {"trigger": 0, "anomaly": 0}
        #: Ids of the requests this process accepted or refused (a request file stays; it is read once).
        self.known: set[str] = set()
        #: Names of request files already looked at.
        self.seen: set[str] = set()
        self.scheduled: list[Scheduled] = []
        #: The request whose policy the runtime holds now (``None``: the configuration's).
        self.active: Scheduled | None = None
        #: Every request accepted here, by id: captures of its steps carry it in their records.
        self.requests: dict[str, Request] = {}
        self.base = frozenset(runtime.window.steps)
        #: Requests written before this process started are an earlier run's (a restart with the same save_path).
        self.started_at = time.time()
        # -- progress (the poll thread's) --
        self._samples: deque[tuple[int, float]] = deque(maxlen=20)
        self._published: tuple[int | None, float] = (None, 0.0)
        self._live_name: str | None = None
        # -- anomaly watch (the training thread's) --
        self.history: deque[float] = deque(maxlen=self.auto.window if self.auto else 1)
        self._entered: tuple[int, float, bool] | None = None
        #: The watched role's seconds per step (``auto_capture.role``), from the timeline's entries; the
        #: seconds of the step under way so far, whether it ran at all, and the last entry read.
        self._role_done: dict[int, float] = {}
        self._role_partial: tuple[float, bool] = (0.0, False)
        self._role_read: Any = None
        #: Whether the watched role ran in any step yet; the steps judged without it until then, and the
        #: top-level roles the timeline held meanwhile (a few, for the warning that the role is never seen).
        self._role_ever = False
        self._role_missing = 0
        self._roles_seen: set[str] = set()
        #: Ids of the captures started and not finished yet (recording, or their files being written).
        self.unfinished: set[Any] = set()
        #: Anomaly captures this process decided (each also an accepted request, here or, for rank 0, everywhere).
        self.decided = 0
        #: Relative requests read by the poll thread, for the training thread to name their first step.
        self.relative: deque[Request] = deque()
        #: The number of the next agreed request to look for (a rank that follows) or to write (the decider).
        self.next_agreed = 1
        #: The state of the latest requests, by id, as the progress file publishes it (``profctx trigger`` reads it).
        self.status: dict[str, dict[str, Any]] = {}
        self._dirty = False
        self._placed: tuple[Any, bool, bool] | None = None
        self._agreed_path: tuple[tuple[str, int], str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- who looks --------------------------------------------------------------------------------

    def looks(self) -> bool:
        """Whether this process reads the requests folder: it is in no worker group (a driver, or a rank)."""
        return self.rt.identity().group is None and (self.on_demand or self._shared_auto())

    def _shared_auto(self) -> bool:
        """Whether anomaly captures reach this process as requests (several ranks, no Ray driver)."""
        return self.auto is not None and self.place()[0]

    def place(self) -> tuple[bool, bool]:
        """Return (shared, decider): several ranks without a Ray driver share requests; this one names steps."""
        identity = self.rt.identity()
        placed = self._placed
        if placed is not None and placed[0] is identity:
            return placed[1], placed[2]
        shared = identity.group is None and identity.world_size > 1 and self.rt.owner.driver is None
        decider = identity.group is None and (not shared or identity.rank == 0)
        self._placed = (identity, shared, decider)
        return shared, decider

    def _state(self, request: Request, **state: Any) -> None:
        """Note the state of a request from ``profctx trigger`` for the progress file."""
        if request.origin != "trigger":
            return
        status = self.status
        status.pop(request.id, None)
        status[request.id] = state
        while len(status) > MAX_STATUS:
            del status[next(iter(status))]
        self._dirty = True

    def start(self) -> None:
        """Start the poll thread when this process looks at requests (never raises)."""
        try:
            if not self.looks():
                return
            thread = threading.Thread(target=self._run, name="profctx-ondemand", daemon=True)
            self._thread = thread
            thread.start()
        except Exception as exc:  # noqa: BLE001 - on-demand capture never breaks configure()
            warn_once("ondemand-start", "profctx: on-demand capture is off in this process: %s", exc)

    def stop(self, timeout: float = 2.0) -> None:
        """End the poll thread and remove this process's progress file (``reset()``, exit).

        A request whose steps the run did not reach is recorded ``skipped`` and said in a warning.
        """
        self._stop.set()
        try:
            self._expire()
        except Exception as exc:  # noqa: BLE001 - exit goes on
            warn_once("ondemand-expire", "profctx: could not record the requests left: %s", exc)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None
        name = self._live_name
        if name is not None:
            with contextlib.suppress(OSError), walk(self.rt.save_path, f"{MANIFEST_DIR}/{LIVE}",
                                                    create=False) as folder:
                folder.remove(name, _NAME)

    # -- the poll thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - logged once; the next poll tries again
                warn_once(f"ondemand-poll:{type(exc).__name__}", "profctx: on-demand capture could not look for "
                          "requests: %s (it tries again)", exc)
            if self._stop.wait(POLL_S):
                return

    def _expire(self) -> None:
        """Record each request whose steps this process did not reach as ``skipped``, with a warning."""
        last = self.rt.owner.last_step
        with self.lock:
            left = [s.request for s in self.scheduled]
            self.scheduled.clear()
            pending = list(self.relative)
            self.relative.clear()
        for request in left:
            unreached = [s for s in request.steps if last is None or s > last]
            if not unreached:
                continue
            steps = f"{unreached[0]}" if len(unreached) == 1 else f"{unreached[0]}-{unreached[-1]}"
            why = (f"the run ended at step {last} before step {steps} of request {request.id}: "
                   f"{'none' if len(unreached) == request.count else 'not all'} of its steps captured")
            logger.warning("profctx: %s (%s)", why, request.describe())
            self._skip(request, why, steps=tuple(unreached))
        for request in pending:
            why = f"the run ended before it entered another step: request {request.id} never got its steps"
            logger.warning("profctx: %s", why)
            self._skip(request, why)

    def poll(self) -> None:
        """Publish progress and read new requests (one pass of the poll thread)."""
        now = time.time()
        self._publish(now)
        if self.on_demand or self._shared_auto():
            for request in self._read():
                if request.first is None:
                    self._relative(request)
                else:
                    self.admit(request)

    def _relative(self, request: Request) -> None:
        """Keep a relative request for the training thread to name its steps (the decider), or leave it (a follower)."""
        if not self.on_demand:
            self.admit(request)  # refused, with its warning
            return
        if request.run is not None and request.run != self.rt.run_id:
            logger.debug("profctx: request %s is for run %s, not this one", request.id, request.run)
            return
        if not self.place()[1]:
            return  # rank 0 names its steps; its agreed request reaches this rank at a step entry
        with self.lock:
            if request.id in self.known or any(r.id == request.id for r in self.relative):
                return
            self.relative.append(request)
            self._state(request, state="pending", count=request.count)

    def period(self) -> float | None:
        """Return this process's seconds per step: its fastest pace between two of its last looks.

        The fastest, not the mean: a request's margin must hold should the loop speed up again
        after a slow stretch (a first step ahead by too little makes every process skip it).
        """
        samples = list(self._samples)
        paces = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(samples) if s1 > s0]
        return min(paces) if paces else None

    def _publish(self, now: float) -> None:
        step = self.rt.owner.last_step
        mono = time.monotonic()
        if step is not None and (not self._samples or self._samples[-1][0] != step):
            if self._samples and step < self._samples[-1][0]:
                self._samples.clear()  # the loop started again from a lower step
            self._samples.append((step, mono))
        last, when = self._published
        if step == last and now - when < HEARTBEAT_S and not self._dirty:
            return
        identity = self.rt.identity()
        self._dirty = False
        with self.lock:
            status = dict(self.status)
        data = {
            "profctx_live": LIVE_VERSION, "run": self.rt.run_id, "host": identity.host, "pid": identity.pid,
            "uid": os.getuid(), "rank": identity.rank, "world_size": identity.world_size, "group": identity.group,
            "step": step, "period": self.period(), "time": now, "on_demand": self.on_demand,
            "decides": self.place()[1], "left": max(0, self.cap - self.accepted["trigger"]), "requests": status,
        }
        name = live_name(self.rt.run_id, identity.host, identity.pid)
        with walk(self.rt.save_path, f"{MANIFEST_DIR}/{LIVE}") as folder:  # each component: no link followed
            folder.write(name, json.dumps(data).encode())
            if self._live_name is not None and self._live_name != name:  # the run id changed (a launcher found late)
                with contextlib.suppress(OSError):
                    folder.remove(self._live_name, _NAME)
        self._live_name = name
        self._published = (step, now)

    def _read(self) -> Iterable[Request]:
        """Yield the new, valid requests in the requests folder; warn once about each file refused."""
        shown = self.root / REQUESTS
        try:
            folder = walk(self.rt.save_path, f"{MANIFEST_DIR}/{REQUESTS}", create=False)
        except FileNotFoundError:
            return
        except OSError as exc:
            warn_once(f"requests-folder:{shown}", "profctx: on-demand requests ignored: %s is not a folder "
                      "(a link?): %s", shown, exc.strerror)
            return
        with folder:
            owner = os.fstat(folder.fd).st_uid
            if owner != os.getuid():
                warn_once(f"requests-folder:{shown}", "profctx: on-demand requests ignored: %s is owned by uid "
                          "%d, not this process's user", shown, owner)
                return
            # Agreed requests are read at step entries (see the module's docstring), not here.
            names = sorted(e.name for e in folder.entries() if e.name not in self.seen
                           and not e.name.startswith(".") and ".agreed." not in e.name)
            requests = []
            for name in names[:MAX_FILES_PER_POLL]:
                self.seen.add(name)
                try:
                    requests.append(read_request(folder, name))
                except (OSError, RequestError) as exc:
                    self._refused_file(name, str(exc))
        for request in requests:
            if request is None:
                continue
            if request.run is not None and request.run != self.rt.run_id:
                continue  # another run's (a folder two runs write to, or a restart)
            # A restart with the same save_path and run id: on this host, one clock tells the earlier run's
            # requests apart (another host's clock is never compared with this one's).
            if request.run is None and request.time is not None and request.time < self.started_at \
                    and request.host in (None, self.rt.identity().host):
                logger.debug("profctx: request %s was written before this process started: not for it", request.id)
                continue
            yield request

    def _refused_file(self, name: str, why: str) -> None:
        warn_once(f"request-file:{name}", "profctx: ignored the on-demand request file %s: %s", name, why)

    # -- admission (poll thread, or a worker told by its driver) ---------------------------------

    def admit(self, request: Request, *, follow: bool = False, entering: int | None = None) -> str:
        """Decide what to do with ``request`` and do it; return the outcome (see :func:`admit`).

        ``follow``: the driver sent it with a step entry (a worker group member): the driver
        counted it against the cap already. ``entering``: the step this process is entering now
        (read at a step entry: that step has not begun).
        """
        with self.lock:
            if request.origin == "trigger" and not self.on_demand and not follow:
                if request.id not in self.known:
                    self.known.add(request.id)
                    warn_once("ondemand-off", "profctx: ignored on-demand request %s: this run was configured "
                              "without on_demand=True", request.id)
                return "known"
            cap = self.cap if request.origin == "trigger" else (self.auto.max_captures if self.auto else 0)
            last = (entering - 1) if entering is not None else self.rt.owner.last_step
            known = request.id in self.known
            outcome = admit(request, None if follow else last, 0 if follow else self.accepted[request.origin], cap,
                            known, [s.request for s in self.scheduled])
            if outcome == "known":
                return outcome
            self.known.add(request.id)
            if outcome == "passed":
                why = (f"this process was at step {last} when it read request {request.id} (first step "
                       f"{request.first}): it captures none of them, so that no process captures other steps "
                       "than the others")
                self._skip(request, why)
                self._state(request, state="refused", why=why)
                return outcome
            if outcome == "overlap":
                other = overlapping(request, [s.request for s in self.scheduled])
                assert other is not None
                why = (f"refused: its steps {_span(request)} overlap steps {_span(other)} of request {other.id}, "
                       "still to capture (overlapping requests are refused, not merged)")
                logger.warning("profctx: %s: %s", request.describe(), why)
                self._skip(request, why)
                self._state(request, state="refused", why=why)
                return outcome
            if outcome == "cap":
                what = "on_demand_max_captures" if request.origin == "trigger" else "auto_capture.max_captures"
                warn_once(f"ondemand-cap:{request.origin}", "profctx: refused request %s: %s=%d reached in this "
                          "process", request.id, what, cap)
                why = f"refused: {what}={cap} requests were accepted already in this process"
                self._skip(request, why)
                self._state(request, state="refused", why=why)
                return outcome
            try:
                self._schedule(request)
            except Exception as exc:  # noqa: BLE001 - a window too large: recorded, never raised
                self._skip(request, f"could not add its steps to the window: {exc}")
                self._state(request, state="refused", why=f"could not add its steps to the window: {exc}")
                return "cap"
            self.accepted[request.origin] += 1
            steps = request.steps
            self._state(request, state="scheduled", first=steps.start, last=steps.stop - 1)
            logger.info("profctx: %s: capturing steps %d-%d", request.describe(), steps.start, steps.stop - 1)
            return outcome

    def _schedule(self, request: Request) -> None:
        self.scheduled.append(Scheduled(request))
        self.scheduled.sort(key=lambda s: s.request.steps.start)
        self.requests[request.id] = request
        self._rewindow()

    def _rewindow(self) -> None:
        """Make the runtime's window the configuration's plus every scheduled request's steps."""
        steps = set(self.base)
        for s in self.scheduled:
            steps.update(s.request.steps)
        self.rt.rewindow(steps)

    def _skip(self, request: Request, why: str, steps: tuple[int, ...] | None = None) -> None:
        """Record ``request`` as skipped in this process, with why (its steps are not annotated as its captures)."""
        kind = capture_kind(request.mode or self.rt.config.mode)
        steps = tuple(request.steps) if steps is None else steps
        self.rt.record(capture_record(
            "finished", capture=capture_id(), kind=kind, steps=steps, roles=None, backend=self.rt.tool,
            folder=capture_folder(steps, ()).as_posix(), status="skipped", time=time.time(), reason=why,
            trigger=_trigger(request), notes=[request.describe()],
        ))

    # -- the step boundary (the training thread, inside Runtime.open) -----------------------------

    def boundary(self, step: int) -> None:
        """Start, continue or end scheduled requests as ``step`` begins; swap the runtime's policy to match."""
        if not self.scheduled and self.active is None:
            return
        chosen: Scheduled | None = None
        changed = False
        with self.lock:
            for s in list(self.scheduled):
                what = at_step(step, s.request, s.started)
                if what == "start":
                    s.started = True
                elif what == "passed":
                    self.scheduled.remove(s)
                    self.requests.pop(s.request.id, None)
                    changed = True
                    why = (f"this process entered step {step} before the request's first step "
                           f"{s.request.first} began here: none of its steps captured")
                    self._skip(s.request, why)
                    self._state(s.request, state="refused", why=why)
                    continue
                elif what == "done":
                    self.scheduled.remove(s)
                    changed = True
                    self._state(s.request, state="done", first=s.request.steps.start, last=s.request.steps.stop - 1)
                    continue
                if what in ("start", "within") and chosen is None:
                    chosen = s
            if changed:
                self._rewindow()
            if chosen is not self.active:
                self._swap(chosen)

    def _swap(self, chosen: Scheduled | None) -> None:
        """Make the runtime decide with ``chosen``'s policy (``None``: the configuration's)."""
        rt = self.rt
        self.active = chosen
        policies: dict[bool, Policy] = {}
        if chosen is not None:
            request = chosen.request
            identity = rt.identity()
            for configured in (True, False):
                policies[configured] = Policy.of(
                    rt.config, request.selects(identity.group, identity.rank, configured), steps=request.steps,
                    mode=request.mode, roles=request.roles)
        rt.swap_policies(policies)

    def current(self, step: int | None) -> Request | None:
        """Return the request whose steps the runtime captures now, when ``step`` is one of them."""
        active = self.active
        if active is None or step is None or step not in active.request.steps:
            return None
        return active.request

    def annotate(self, record: dict[str, Any]) -> dict[str, Any]:
        """Add who asked for a capture, and why, to the record of a capture of a request's steps."""
        step = record.get("step")
        if type(step) is not int or "trigger" in record:
            return record
        for request in self.requests.values():
            if step in request.steps:
                out = dict(record)
                out["trigger"] = _trigger(request)
                if record.get("event") == "finished":
                    out["notes"] = [*(record.get("notes") or ()), request.describe()]
                return out
        return record

    # -- capture on anomaly (the training thread, at each step entry) ------------------------------

    def step_entered(self, step: int) -> None:
        """Tell the requests and the anomaly watch that ``step`` begins (training thread, before the window is read).

        A rank that follows another's decisions looks for the next agreed request; the decider
        names the steps of the relative requests it read; then the step that ended is judged.
        """
        if self.on_demand or self.auto is not None:
            if self.scheduled:
                self._retire(step)
            shared, decider = self.place()
            if shared and not decider:
                self._look_agreed(step)
            if self.relative and decider:
                self._resolve(step, shared)
        if self.auto is not None:
            self._judge(step)

    def _retire(self, step: int) -> None:
        """Mark the requests whose last step ended before ``step`` as done (out of the window, no boundary says so)."""
        with self.lock:
            done = [s for s in self.scheduled if s.started and s.request.steps.stop <= step]
            if not done:
                return
            for s in done:
                self.scheduled.remove(s)
                self._state(s.request, state="done", first=s.request.steps.start, last=s.request.steps.stop - 1)
            self._rewindow()

    def _look_agreed(self, step: int) -> None:
        """Read the agreed requests the decider wrote since this rank last looked (one ``os.access`` when none)."""
        while True:
            key = (self.rt.run_id, self.next_agreed)
            cached = self._agreed_path
            if cached is None or cached[0] != key:  # one path built per agreed request, not per step
                cached = self._agreed_path = (key, os.fspath(self.root / REQUESTS / agreed_name(*key)))
            if not os.access(cached[1], os.F_OK):
                return
            name = agreed_name(*key)
            self.next_agreed += 1
            try:
                with walk(self.rt.save_path, f"{MANIFEST_DIR}/{REQUESTS}", create=False) as folder:
                    request = read_request(folder, name)
            except (OSError, RequestError) as exc:
                self._refused_file(name, str(exc))
                continue
            if request is not None and request.first is not None:
                self.admit(request, entering=step)

    def _resolve(self, step: int, shared: bool) -> None:
        """Name the first step of each relative request read (the step after ``step``); tell the other ranks."""
        while self.relative:
            with self.lock:
                if not self.relative:
                    return
                request = self.relative[0].at(step + 1)
                self.relative.popleft()
            self._agree(request, step, shared)

    def _agree(self, request: Request, step: int, shared: bool) -> None:
        """Admit ``request`` here; shared by several ranks and scheduled, write it as the next agreed request."""
        outcome = self.admit(request, entering=step, follow=request.origin == "anomaly")
        if outcome != "schedule" or not shared:
            return
        try:
            number = self.next_agreed
            self.next_agreed += 1
            with walk(self.rt.save_path, f"{MANIFEST_DIR}/{REQUESTS}") as folder:
                folder.write(agreed_name(self.rt.run_id, number), json.dumps(request.to_dict()).encode())
        except Exception as exc:  # noqa: BLE001 - the other ranks record nothing of it; this one captures
            warn_once("agreed-write", "profctx: could not tell the other ranks request %s: %s", request.id, exc)

    def _judge(self, step: int) -> None:
        """Judge the step that ended as ``step`` began; ask for a capture of ``step`` if it was anomalous.

        A step's time runs from its step block's entry to the next step block's entry. Steps during
        which a capture of this process was recording or its files were being written are neither
        judged nor kept in the median (profctx's own work would look like an anomaly). The same step
        entered again (a nested step block, or a Session after the fast path) is told once.
        """
        auto = self.auto
        previous = self._entered
        if auto is None or (previous is not None and previous[0] == step):
            return
        now = _timeline.clock()  # the clock blocks and the timeline read (a test may set its own)
        rt = self.rt
        if auto.role is not None:
            self.read_roles()
        writing = bool(self.unfinished)
        self._entered = (step, now, writing or step in rt.in_window)
        if previous is None or step < previous[0]:
            return
        last, began, busy = previous
        if busy or writing:
            return
        seconds = now - began if auto.role is None else self._role_done.pop(last, None)
        if seconds is None:  # the watched role did not run in that step (or the timeline is off)
            if auto.role is not None and not self._role_ever and getattr(rt, "timeline", None) is not None:
                self._role_missing += 1
                if self._role_missing == auto.window:
                    seen = ", ".join(repr(name) for name in sorted(self._roles_seen)) or "none"
                    warn_once("auto-capture-role-unseen", "profctx: auto_capture.role=%r was in none of the %d "
                              "steps so far (the roles seen: %s): no step is judged until it runs; check the "
                              "role's name against the roles the loop marks", auto.role, auto.window, seen)
            return
        history = self.history
        # A step within factor x the fastest step kept is within factor x the median: no sort needed.
        median = anomaly(seconds, list(history), auto.factor, auto.window) if (
            len(history) == auto.window and seconds > auto.factor * min(history)) else None
        history.append(seconds)
        if median is None or self.decided >= auto.max_captures or step in rt.in_window:
            return
        self.decided += 1
        why = reason(last, seconds, median, auto.window, auto.role)
        identity = rt.identity()
        request = Request(id=f"auto-{os.urandom(6).hex()}", first=step, count=1, origin="anomaly", reason=why,
                          uid=os.getuid(), host=identity.host, pid=identity.pid, time=time.time())
        self._entered = (step, now, True)
        shared, decider = self.place()
        if shared:
            # Several ranks, no driver: rank 0 decides for all and names the step after this one, which
            # every other rank enters only after reading the agreed request (see the module's docstring).
            if decider:
                logger.warning("profctx: %s: capturing step %d on every rank", why, step + 1)
                self._agree(request.at(step + 1), step, True)
            return
        logger.warning("profctx: %s: capturing step %d", why, step)
        self.admit(request, follow=True)


    def read_roles(self) -> None:
        """Add up the watched role's time per step from the timeline entries not read yet (the training thread).

        The timeline keeps, in order, each top-level role block's and each step's entry (name or step,
        start, end) until its writer takes them (:mod:`profctx.process._timeline`); they are read at
        each step entry and just before each hand-over to the writer (:class:`RoleWatched`), so none
        is missed however long the steps.
        """
        auto = self.auto
        timeline = getattr(self.rt, "timeline", None)
        if auto is None or auto.role is None:
            return
        if timeline is None:
            warn_once("auto-capture-role", "profctx: auto_capture.role=%r needs the step timeline (timeline=True): "
                      "no role time is known, so no step is judged", auto.role)
            return
        if type(timeline) is Timeline:
            timeline.__class__ = RoleWatched  # read before each hand-over (same slots: nothing else changes)
        new = []
        last = self._role_read
        try:
            for entry in reversed(timeline.events):
                if entry is last:
                    break
                new.append(entry)
        except RuntimeError:  # the writer is taking entries read already: read the rest next time
            return
        if not new:
            return
        self._role_read = new[0]
        role = auto.role
        spent, ran = self._role_partial
        done = self._role_done
        seen = None if self._role_ever else self._roles_seen  # (noted until the role is first seen)
        for entry in reversed(new):
            name = entry[0]
            if type(name) is str:
                if name == role or name.partition("/")[0] == role:
                    spent += entry[2] - entry[1]
                    ran = True
                    self._role_ever = True
                    seen = None
                elif seen is not None and len(seen) < 16:
                    seen.add(name)
                continue
            if ran and type(name) is int:
                done[name] = spent
                if len(done) > 16:
                    del done[min(done)]
            spent, ran = 0.0, False
        self._role_partial = (spent, ran)

    def recorded(self, record: Any) -> Any:
        """Note a capture record on its way to the manifest; return it, with who asked and why for a request's steps.

        Captures started and not finished (recording, or their files being written) are noted:
        the anomaly watch judges no step while one is (profctx's own work is no anomaly).
        """
        kind = record.get("kind")
        if kind == "engine":  # an engine's capture of a request's step says who asked, as the process's own does
            return self.annotate(dict(record)) if self.requests else record
        if kind not in CAPTURE_KINDS:
            return record
        capture, event = record.get("capture"), record.get("event")
        with self.lock:
            if event == "started":
                self.unfinished.add(capture)
            elif event == "finished":
                self.unfinished.discard(capture)
        return self.annotate(dict(record)) if self.requests else record


class RoleWatched(Timeline):
    """A step timeline whose entries the anomaly watch reads before each hand-over to its writer.

    Only for ``auto_capture.role`` (:meth:`OnDemand.read_roles` makes the runtime's timeline one).
    """

    __slots__ = ()

    def hand_over(self, now: float | None) -> None:
        ondemand = getattr(self.runtime, "ondemand", None)
        if ondemand is not None:
            ondemand.read_roles()
        super().hand_over(now)


def _span(request: Request) -> str:
    steps = request.steps
    return f"{steps.start}" if len(steps) == 1 else f"{steps.start}-{steps.stop - 1}"


def _trigger(request: Request) -> dict[str, Any]:
    data = request.to_dict()
    data.pop("profctx_request", None)
    return {k: v for k, v in data.items() if v is not None}


# -- files (the CLI writes requests and reads progress; the poll thread the other way round) ---------


def read_request(folder: Folder, name: str) -> Request | None:
    """Return the request in the file ``name`` of the held requests folder; ``None`` for one gone meanwhile.

    Refused (:class:`RequestError` or :class:`OSError`): a link, FIFO, hard link or anything but a
    regular file of this process's user; more than :data:`MAX_REQUEST_BYTES`; not a valid
    request. Never blocks.
    """
    if not _NAME.fullmatch(name):
        raise RequestError("not a request file name (letters, digits, '.', '_', '-', ending in .json)")
    try:
        data = folder.read(name, MAX_REQUEST_BYTES + 1, owners=(os.getuid(),))
    except FileNotFoundError:
        return None
    if len(data) > MAX_REQUEST_BYTES:
        raise RequestError(f"larger than {MAX_REQUEST_BYTES} bytes")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise RequestError(f"not JSON ({exc})") from None
    return parse(value)


def write_request(save_path: Path, request: Request) -> Path:
    """Write ``request`` into ``save_path``'s requests folder (exclusive temporary, renamed); return its path.

    Raise ``OSError`` (``ELOOP``) when a link stands where a folder on the way belongs.
    """
    with walk(save_path, f"{MANIFEST_DIR}/{REQUESTS}") as folder:
        return folder.write(f"{request.id}.json", json.dumps(request.to_dict()).encode())


def live_processes(save_path: Path, now: float, *, stale_s: float = STALE_S) -> list[dict[str, Any]]:
    """Return the progress files of the live processes writing to ``save_path``.

    On this host: the file's pid is alive. On another: the file was updated within ``stale_s``
    seconds by this host's clock (``math.inf``: every file; the caller judges).
    """
    from ..util._identity import hostname

    try:
        folder = walk(save_path, f"{MANIFEST_DIR}/{LIVE}", create=False)
    except OSError:
        return []
    host = hostname()
    found = []
    with folder:
        names = sorted(e.name for e in folder.entries(4096))
        loaded = []
        for name in names:
            if not _NAME.fullmatch(name):
                continue
            try:
                loaded.append(json.loads(folder.read(name, MAX_REQUEST_BYTES, owners=(os.getuid(),))))
            except (OSError, ValueError, RecursionError):
                continue
    for data in loaded:
        if not isinstance(data, dict) or data.get("profctx_live") != LIVE_VERSION:
            continue
        when, pid = data.get("time"), data.get("pid")
        if not isinstance(when, (int, float)) or type(pid) is not int:
            continue
        if data.get("host") == host:
            # On this host the pid tells (a process removes its file at exit; one killed leaves it, its pid gone).
            if not _alive(pid):
                continue
        elif now - when > stale_s:  # another host's clock: see profctx.cli.trigger.live
            continue
        found.append(data)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
