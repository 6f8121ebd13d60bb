"""The runtime of one active configuration: executes the plan's actions for every block.

It holds what a configuration needs in a process — identity, backend, the native-capture
token, the contiguous run, the manifest writer, the writer thread, listeners — and is
itself held by the owner (``_owner.OWNER.runtime``). Decisions come from ``_plan``.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Container, Iterable
from pathlib import Path
from typing import Any, Final, Protocol, final

from ..backends import CaptureSpec, backend_class, choose_tool
from ..core._config import ProfilerConfig
from ..core._layout import MANIFEST_DIR, Spans, trace_stem
from ..core._plan import Actions, Enter, Policy, decide, role_matches
from ..core._scope import Scope
from ..core._status import HOLDING
from ..core._vocab import assert_never
from ..core._window import StepWindow
from ..records._manifest import ManifestWriter, Record
from ..util._errors import ProfilingError
from ..util._files import make_folders, sweep_tree
from ..util._fs import Folder, walk
from ..util._identity import Identity, detectable, launcher_run_id, resolve
from ..util._log import logger, warn_once
from ._capture import Capture, Range
from ._timeline import Timeline


class Owner(Protocol):
    """What a runtime needs from the process's owner (``_owner.Owner``, which holds the runtime)."""

    hooks: list[Any]
    step_hooks: list[Any]
    capture_hooks: list[Any]
    switches: dict[str, Any]
    driver: Any
    last_step: int | None

    def open_gate(self, token: object) -> None: ...

    def close_gate(self, token: object) -> None: ...

    def refresh(self) -> None: ...


def new_run_id() -> str:
    """Return a fresh run id: UTC time plus 6 random hex digits."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()


class Opened:
    """What one block opened on entry, so its exit undoes exactly that."""

    __slots__ = ("actions", "closes_run", "hooks", "owned", "ranges", "target")

    def __init__(self, actions: Actions) -> None:
        self.actions = actions
        #: The capture this block opened and closes (not a contiguous one).
        self.owned: Capture | None = None
        #: The capture blocks nested in this one record into (own, joined, or inherited).
        self.target: Capture | None = None
        self.ranges: list[Range] = []
        self.closes_run = False
        self.hooks: list[tuple[Any, object]] = []


#: Seconds between two looks at the exit deadline while an ``on_capture`` hook runs.
HOOK_POLL_S: Final = 0.1


class Writer:
    """Runs the file-writing jobs, in order, on one thread that lives only while there is work.

    The thread is not a daemon: at interpreter exit Python waits for the jobs already queued
    (traces being written) and then exits; an idle writer holds nothing up. Submitting takes
    no lock (a deque append), so an interrupt on the training thread can never leave a lock
    the writer needs behind; the pending state is read off the queue itself.
    """

    #: Seconds an idle writer thread waits for more work before it ends.
    IDLE_S: Final = 0.2

    def __init__(self) -> None:
        self._jobs: deque[Callable[[], None]] = deque()
        self._running = False
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._idle = threading.Event()

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job``; start the thread if none is running."""
        self._jobs.append(job)
        self._idle.clear()
        self._wake.set()
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        thread = self._thread
        if not self._jobs or (thread is not None and thread.is_alive()):
            return
        thread = threading.Thread(target=self._run, name="profctx-writer")
        self._thread = thread
        try:
            thread.start()
        except RuntimeError:  # the interpreter is shutting down: write here
            self._thread = None
            self._drain()

    def _drain(self) -> None:
        while True:
            self._running = True
            try:
                job = self._jobs.popleft()
            except IndexError:
                self._running = False
                return
            try:
                run_quietly(job)
            finally:
                self._running = False

    def _run(self) -> None:
        while True:
            self._wake.clear()
            self._drain()
            self._idle.set()
            # A wake left by a job the drain already ran starts another idle wait, not the thread's end:
            # a thread started per capture costs the training thread a fraction of a millisecond.
            if self._wake.wait(self.IDLE_S) or self._jobs:
                continue
            self._thread = None
            if self._jobs:  # a job arrived while ending: keep going
                self._thread = threading.current_thread()
                continue
            return

    def pending(self) -> bool:
        """Whether a job is queued or running."""
        return bool(self._jobs) or self._running

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job has run; return whether they all did within ``timeout``."""
        if self._thread is threading.current_thread():
            return not self._jobs
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.pending():
            self._ensure_thread()
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                return not self.pending()
            self._idle.wait(left)
        return True


def run_quietly(job: Callable[[], None]) -> None:
    """Run a writer job; a job records its own failures, so anything escaping is only logged."""
    try:
        job()
    except BaseException as exc:  # noqa: BLE001
        logger.debug("profctx writer job failed: %s", exc)


class TraceBudget:
    """Caps the bytes of traces this process writes for one configuration: in all, and in any hour.

    A capture starts only while both sums are below their caps (``max_trace_bytes``,
    ``max_trace_bytes_per_hour``; ``None``: no cap), so a run overshoots a cap by at most the one
    capture that crosses it. ``clock``: monotonic seconds (injected by tests).
    """

    HOUR: Final = 3600.0

    def __init__(self, total: int | None, per_hour: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.per_hour = per_hour
        self.clock = clock
        self.written = 0
        self.in_hour = 0
        self._recent: deque[tuple[float, int]] = deque()

    def add(self, size: int) -> None:
        """Count ``size`` bytes of trace files just written."""
        self.written += size
        if self.per_hour is not None:
            self._recent.append((self.clock(), size))
            self.in_hour += size

    def refuses(self) -> str | None:
        """Return why a capture may not start now (a cap is reached), logged once per cap; else ``None``."""
        if self.total is not None and self.written >= self.total:
            reason = (f"max_trace_bytes ({self.total} bytes) reached: this process wrote {self.written} bytes of "
                      "traces in this configuration, so it starts no more captures (raise the cap, or None for none)")
            warn_once("cap:max_trace_bytes", "profctx: %s", reason)
            return reason
        if self.per_hour is None:
            return None
        since = self.clock() - self.HOUR
        recent = self._recent
        while recent and recent[0][0] <= since:
            self.in_hour -= recent.popleft()[1]
        if self.in_hour < self.per_hour:
            return None
        reason = (f"max_trace_bytes_per_hour ({self.per_hour} bytes) reached: this process wrote {self.in_hour} bytes "
                  "of traces in the last hour; captures resume as that hour's traces age out")
        warn_once("cap:max_trace_bytes_per_hour", "profctx: %s", reason)
        return reason


class DiskWatch:
    """Backs off after a trace write finds the disk full; resumes when the space is back.

    While waiting, new captures are recorded as ``skipped`` with the reason instead of
    spending a profiler run on a trace that cannot be written.
    """

    #: The least free space to resume at, whatever the traces' size.
    MIN_FREE: Final = 256 * 1024

    def __init__(self) -> None:
        self.reason = ""
        self._full = False
        self._largest = 0

    def failed(self, exc: BaseException) -> None:
        """Note a failed write; back off if it was a full disk."""
        seen: BaseException | None = exc
        while seen is not None:
            if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
                self._full = True
                self.reason = (f"the disk is full ({os.strerror(seen.errno)}); captures resume when "
                               "space is back")
                warn_once("disk-full", "profctx: %s", self.reason)
                return
            seen = seen.__cause__ or seen.__context__

    def wrote(self, files: Any) -> None:
        """Note the size of written files (what to wait for after a full disk)."""
        for path in files:
            with contextlib.suppress(OSError):
                self._largest = max(self._largest, Path(path).stat().st_size)

    def waiting(self, folder: Path) -> bool:
        """Whether to skip a capture now: the disk was full and still has no room for a trace."""
        if not self._full:
            return False
        try:
            stats = os.statvfs(folder if folder.exists() else folder.parent)
        except OSError:
            return False
        if stats.f_bavail * stats.f_frsize >= max(self.MIN_FREE, 2 * self._largest):
            self._full = False
            logger.warning("profctx: disk space is back; captures resume")
            return False
        return True


class Runtime:
    """Everything derived from one active configuration in this process."""

    def __init__(self, owner: Owner, config: ProfilerConfig) -> None:
        self.owner = owner
        self.config = config
        self.window = config.steps or StepWindow()
        #: The window's steps: a C-level membership test for the blocks that open nothing (``_block``); a
        #: window of more than ``SMALL_WINDOW`` steps answers itself (never listed: ``"1:100000"`` cost 6 ms here).
        self.in_window: Container[int] = self.window.lookup()
        #: What the block fast path (``_block``) looks a block's step up in, one C-level test for
        #: everything that makes a block do more than change the scope (:meth:`_refresh_fast`): the
        #: window's steps, or :data:`EVERY` while a stop is pending (``deferred``) and, for step
        #: blocks, while a contiguous run is open (``run``).
        self.busy_steps: Container[int] = self.in_window
        self.busy_roles: Container[int] = self.in_window
        #: The tool and why ``auto`` chose it; ``auto`` is chosen when first asked (:attr:`tool`).
        self._tool: tuple[str, str | None] | None = None if config.tool == "auto" else (config.tool, None)
        self._backend: Any = None
        self.save_path = Path(config.save_path).expanduser().absolute()
        with contextlib.suppress(OSError):  # marks a configured save_path: `profctx ls` says "no capture yet"
            make_folders(self.save_path, MANIFEST_DIR)
        named = config.run_id or os.environ.get("PROFCTX_RUN_ID")
        launched = None if named else launcher_run_id()
        self.run_id = named or (launched[0] if launched else new_run_id())
        #: The run id is a fresh one, no launcher's: a launcher that shows itself later (Lightning's, once
        #: ``fit()`` started the other ranks) replaces it when the rank is detected (:meth:`identity`).
        self._fresh_id = not named and launched is None
        #: The open contiguous capture (``contiguous=True``), if any.
        self.run: Capture | None = None
        self.errors: list[str] = []
        self.listeners: list[Callable[[Any], None]] = []
        self.writer = Writer()
        self.disk = DiskWatch()
        self.traces = TraceBudget(config.max_trace_bytes, config.max_trace_bytes_per_hour)
        #: Set by a second SIGTERM: stop waiting for ``on_capture`` hooks now (see :meth:`exit_passed`).
        self.exit_forced = threading.Event()
        #: When the exit began (monotonic), once seen; ``exit_timeout`` counts from there.
        self.exit_started: float | None = None
        self._identity: Identity | None = None
        self._fallback: Identity | None = None
        #: rank_selected()'s answer for the identity it was computed for.
        self._selected: tuple[Identity, bool] | None = None
        #: decide() results by everything they depend on (the plan is pure; blocks repeat), each with
        #: the policy it was decided under (on-demand capture swaps policies: a stale entry is redone).
        self._decisions: dict[tuple[Any, ...], tuple[Policy, Actions]] = {}
        #: decide() for blocks that only add a role, on a selected rank and (if different) not (role_block()),
        #: with the two policies decided under.
        self._roles: dict[tuple[Any, ...], tuple[Policy, Policy, Actions, Actions | None]] = {}
        #: Role paths a role-only block draws nothing for in an in-window step outside any capture, on
        #: either rank selection and with or without engines, each with the ``_policies`` dict it was
        #: decided under (role_block() fills it). That dict is replaced whole when policies change and
        #: only ever filled in place, so an entry holds while ``quiet[roles] is _policies``: the role
        #: blocks of ``_block`` note it on the child scope their parent keeps (``Scope._quiet``) and
        #: test that themselves (one identity test, no Python call).
        self.quiet: dict[tuple[str, ...], dict[bool, Policy]] = {}
        self._manifest: ManifestWriter | None = None
        self._lock = threading.RLock()
        #: The native-capture token: its one key 'holder' is set while a capture holds the profiler.
        self._token: dict[str, Capture] = {}
        self.deferred: list[Capture] = []
        self._seq = itertools.count(1)
        self._spans = Spans()
        self._policies: dict[bool, Policy] = {}
        self._swept = False
        #: On-demand and anomaly captures (``on_demand``, ``auto_capture``): requests, poll thread, watch.
        self.ondemand: Any = None
        #: Told the step each step block enters, before the window is looked at (the anomaly watch), if any.
        self.watch: Callable[[int], None] | None = None
        if config.on_demand or config.auto_capture is not None:
            from ._ondemand import OnDemand  # json and a thread: only for runs that use them

            self.ondemand = OnDemand(self)
            # Every step entry: the anomaly watch, and the step boundary where requests get their steps.
            self.watch = self.ondemand.step_entered
            self.ondemand.start()
        #: Every step's wall time and its top-level roles' (``_timeline``), written unless ``timeline=False``.
        self.timeline: Timeline | None = (
            Timeline(self, write=config.timeline, totals=config.summary_at_exit, max_bytes=config.max_timeline_bytes)
            if config.timeline or config.summary_at_exit else None)

    @property
    def tool(self) -> str:
        """The tool this process captures with (``auto`` resolved: torch_npu probed here, on first use)."""
        return (self._tool or self._choose_tool())[0]

    @property
    def tool_note(self) -> str | None:
        """Why ``auto`` chose :attr:`tool` (``None`` for a named tool)."""
        return (self._tool or self._choose_tool())[1]

    def _choose_tool(self) -> tuple[str, str | None]:
        # Only a process that captures asks: one that cannot never imports torch_npu for "auto".
        with self._lock:
            chosen = self._tool
            if chosen is None:
                chosen = self._tool = choose_tool(self.config.tool)
                if chosen[1] is not None:
                    logger.info("profctx: %s", chosen[1])
            return chosen

    @property
    def backend(self) -> Any:
        """The backend instance, made (its module imported) the first time a capture or the warm-up needs it."""
        backend = self._backend
        if backend is None:
            backend = self._backend = backend_class(self.tool)()
        return backend

    # -- identity, selection, policy --------------------------------------------------------------

    def identity(self) -> Identity:
        """Return this process's identity (kept once it comes from config, env or torch.distributed)."""
        if self._identity is not None:
            return self._identity
        fallback = self._fallback
        # Resolving costs microseconds and runs for every in-window block: keep the default
        # identity while nothing that could replace it (RANK, a process group, a fork) appeared.
        if fallback is not None and fallback.pid == os.getpid() and not detectable():
            return fallback
        identity = resolve(self.config.rank, self.config.world_size, self.config.group)
        if identity.source != "default":
            self._identity = identity
            if self._fresh_id:
                self._fresh_id = False
                found = launcher_run_id()
                if found is not None:
                    logger.debug("profctx: run id %s, from %s's environment (was %s)", found[0], found[1],
                                 self.run_id)
                    self.run_id = found[0]
        else:
            self._fallback = identity
        return identity

    def rank_selected(self) -> bool:
        """Whether this process's rank is one the config profiles (kept while the identity is the same object)."""
        identity = self.identity()
        known = self._selected
        if known is not None and known[0] is identity:
            return known[1]
        selected = self.config.selects(identity.group, identity.rank)
        self._selected = (identity, selected)
        return selected

    def policy(self) -> Policy:
        """Return the plan's view of the config for this process."""
        return self._policy_of(self.rank_selected())

    def _policy_of(self, selected: bool) -> Policy:
        policy = self._policies.get(selected)
        if policy is None:
            policy = self._policies[selected] = Policy.of(self.config, selected)
        return policy

    def rewindow(self, steps: Iterable[int]) -> None:
        """Make ``steps`` the window (the configuration's plus the steps requests added); any thread.

        ``in_window`` is replaced whole, one store: the block fast path reads it without a lock.
        """
        window = StepWindow(steps)
        with self._lock:
            self.window = window
            self.in_window = window.lookup()
            self._refresh_fast()

    def swap_policies(self, policies: dict[bool, Policy]) -> None:
        """Decide with ``policies`` from now on (by whether the config selects this rank; empty: the config's).

        Called at a step boundary on the thread that enters the step; a contiguous capture never
        spans two policies, so an open one ends here.
        """
        if self.run is not None:
            self.close_run()
        self._decisions = {}
        self._roles = {}
        self._policies = policies
        self.owner.refresh()

    def wants_role(self, role: str, *, engines: bool) -> bool:
        """Whether ``@profiled(role=role)`` calls must run their wrapper in an in-window step now."""
        return self.policy().wants_role(role, capturing=bool(self._token), engines=engines)

    # -- warm-up ------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Run the backend's one-time set-up (imports) here, on the calling thread; never raises.

        On the caller's thread, not a background one: a background import of torch's compiler
        modules races the program's own imports (``import vllm`` right after ``configure()``
        then fails with a deadlock or a partially initialised module).
        """
        try:
            self.backend.prepare()
        except Exception as exc:  # noqa: BLE001 - a failed warm-up only costs time later
            logger.warning("profctx: backend %s could not prepare: %s", self.tool, exc)

    # -- blocks -------------------------------------------------------------------------------

    def opens_nothing(self, step: int | None, sets_step: bool) -> bool:
        """Whether :meth:`open` would return ``None`` at once, doing nothing, for a block at ``step``.

        Out of the window, no stop pending, and no contiguous run for a step block to close.
        ``profile_step.__enter__`` writes this test out itself (one Python call less per block):
        keep the two alike.
        """
        return step not in (self.busy_steps if sets_step else self.busy_roles)

    def _refresh_fast(self) -> None:
        """Recompute :attr:`busy_steps` and :attr:`busy_roles` (after ``in_window``, ``run`` or ``deferred`` changed).

        Under the lock, so that the last of two concurrent changes stores what both left.
        """
        with self._lock:
            self.busy_roles = EVERY if self.deferred else self.in_window
            self.busy_steps = EVERY if self.deferred or self.run is not None else self.in_window

    def role_block(self, context: Capture | None, step: int | None, roles: tuple[str, ...]) -> str | None:
        """Return the range a block that only adds a role draws in ``context``, when that is all it does.

        ``""``: the block draws nothing (no capture around it, or its role is filtered out).
        ``None``: :meth:`open` must run (it may open a capture or start engines, a stop is
        pending, the step is out of the window, or ``context`` is neither absent nor live).
        For a role-only block the plan's answer depends on the role path, the context and
        the rank selection alone (the step only through the window, the contiguous run only
        for blocks that set a step), so it is memoised by path and context; the rank
        (microseconds to resolve) is looked at only where the two answers differ.
        """
        if self.deferred or step not in self.in_window:
            return None
        if context is None:
            state = None
        elif context.status == "live":
            state = "live"
        else:
            return None
        key = (roles, state)
        found = self._roles.get(key)
        policies = self._policies  # read once: swap_policies may replace it meanwhile
        picked, other_policy = policies.get(True), policies.get(False)
        if picked is None or other_policy is None:  # what _policy_of does, in this dict
            picked = policies.setdefault(True, Policy.of(self.config, True))
            other_policy = policies.setdefault(False, Policy.of(self.config, False))
        if found is None or found[0] is not picked or found[1] is not other_policy:
            enter = Enter(step, roles, False, True, state, None)  # type: ignore[arg-type]
            chosen, other = decide(picked, enter), decide(other_policy, enter)
            found = (picked, other_policy, chosen, None if other == chosen else other)
            if len(self._roles) >= 4096:
                self._roles.clear()
                self.quiet.clear()
            self._roles[key] = found
            if state is None and _draws_nothing(chosen) and _draws_nothing(other):
                self.quiet[roles] = policies
        _, _, actions, unselected = found
        if unselected is not None and not self.rank_selected():
            actions = unselected
        if (actions.engines and self.owner.hooks) or actions.open is not None or actions.marker is not None \
                or len(actions.ranges) > (state is not None):
            return None
        return actions.ranges[0] if actions.ranges else ""

    def open(self, scope: Scope, sets_step: bool, sets_role: bool, context: Capture | None) -> Opened | None:
        """Execute what the plan says a block entering ``scope`` opens; ``None`` when it opens nothing.

        ``context``: the capture enclosing blocks of this task record into (or were refused).
        """
        if self.deferred:
            self.stop_deferred()
        step = scope.step
        if sets_step:
            self.owner.last_step = step
            if self.watch is not None and step is not None and step >= 0:
                self.watch(step)  # a step entered by a Session (the fast path told it already: told once)
            if self.ondemand is not None and step is not None:  # a request's steps begin or end: policies swap
                self.ondemand.boundary(step)
        if step is None or step not in self.window:
            if sets_step and self.run is not None:
                self.close_run()
            return None
        effective = context.holder if context is not None and context.status == "skipped" else context
        state = None if context is None else ("live" if effective is not None and effective.recording else "dead")
        run = self.run
        policy = self.policy()
        run_steps = run.steps if run is not None else None
        key = (policy.selected, step, scope.roles, sets_step, sets_role, state, run_steps)
        found = self._decisions.get(key)
        if found is not None and found[0] is policy:
            actions = found[1]
        else:
            actions = decide(policy, Enter(step, scope.roles, sets_step, sets_role, state,  # type: ignore[arg-type]
                                           run_steps))
            if len(self._decisions) >= 4096:  # long windows: keep memory bounded
                self._decisions.clear()
            self._decisions[key] = (policy, actions)
        opened = Opened(actions)
        opened.target = context
        self.owner.open_gate(opened)
        try:
            self._execute(opened, actions)
            return opened
        except BaseException:
            self.close(opened, in_flight=True)
            raise

    def _execute(self, opened: Opened, actions: Actions) -> None:
        if actions.close_run:
            self.close_run()
        if actions.join_run:
            opened.target = self.run
        if actions.open is not None:
            capture = Capture(self, actions.open, next(self._seq))
            if actions.keep_run:
                with self._lock:
                    self.run = capture
                    self._refresh_fast()
            else:
                opened.owned = capture
            capture.begin()
            if actions.keep_run and not capture.recording:
                with self._lock:
                    if self.run is capture:
                        self.run = None
                        self._refresh_fast()
            opened.target = capture
        opened.closes_run = actions.close_run_at_exit
        target = opened.target
        if target is not None and target.status == "skipped":
            target = target.holder
        if target is not None and target.recording:
            if actions.marker is not None:
                # A refused role capture's role becomes a range of the capture that holds the profiler.
                refused = opened.target is not None and opened.target is not target
                entry = target.open_range(actions.marker, marker=not (refused and actions.open is not None
                                                                       and actions.open.kind == "role"))
                if entry is not None:
                    opened.ranges.append(entry)
            for name in actions.ranges:
                entry = target.open_range(name)
                if entry is not None:
                    opened.ranges.append(entry)

    def close(self, opened: Opened, *, in_flight: bool = False) -> None:
        """Undo what :meth:`open` did for ``opened`` (each step runs even if one before it is interrupted)."""
        try:
            try:
                target = opened.target
                if target is not None and target.status == "skipped":
                    target = target.holder
                for entry in reversed(opened.ranges):
                    if target is not None:
                        target.close_range(entry)
                opened.ranges = []
            finally:
                if opened.owned is not None:
                    opened.owned.end(in_flight=in_flight)
                elif opened.closes_run and self.run is not None and self.run is opened.target:
                    self.close_run(in_flight=in_flight)
        finally:
            self.owner.close_gate(opened)

    def close_run(self, *, in_flight: bool = False) -> None:
        """End the open contiguous capture, if any."""
        with self._lock:
            capture, self.run = self.run, None
            self._refresh_fast()
        if capture is not None:
            capture.end(in_flight=in_flight)

    # -- the native-capture token ------------------------------------------------------------------

    def claim(self, capture: Capture) -> Capture | None:
        """Make ``capture`` the holder (status ``starting``) and return ``None``; else return the holder.

        A holder whose start or stop was cut short by an interrupt before it could give the
        profiler back (its status says it is no longer starting, live or stopping) is stale
        and replaced.
        """
        previous = capture.status
        capture.status = "starting"  # before taking the token: a holder is never seen as stale
        while True:
            holder = self._token.setdefault("holder", capture)  # atomic: no lock an interrupt could leave held
            if holder is capture:
                self.owner.refresh()
                return None
            if holder.status in HOLDING:
                capture.status = previous
                return holder
            if self._token.get("holder") is holder:
                self._token.pop("holder", None)

    def release(self, capture: Capture) -> None:
        """Give the profiler back if ``capture`` holds it."""
        if self._token.get("holder") is not capture:
            return
        self._token.pop("holder", None)
        self.owner.refresh()

    def holder(self) -> Capture | None:
        """Return the capture holding the process's profiler, if any."""
        return self._token.get("holder")

    def orphaned(self, opened: Opened) -> None:
        """End, at the next safe point, what a block opened and never closed (it was dropped)."""
        self.owner.close_gate(opened)
        for capture in (opened.owned, opened.target if opened.closes_run else None):
            if capture is not None and capture.recording:
                self.defer_stop(capture)

    def defer_stop(self, capture: Capture) -> None:
        """Stop ``capture`` at the next block its own thread enters or leaves (see :meth:`Capture.end`)."""
        with self._lock:
            if capture not in self.deferred:
                self.deferred.append(capture)
                self._refresh_fast()

    def stop_deferred(self) -> None:
        """Stop the deferred captures started by the calling thread."""
        me = threading.get_ident()
        with self._lock:
            mine = [c for c in self.deferred if c.thread == me]
            self.deferred = [c for c in self.deferred if c.thread != me]
            self._refresh_fast()
        for capture in mine:
            capture.end(in_flight=True)

    # -- capture set-up, records, failures, writing ---------------------------------------------

    def spec_for(self, capture: Capture) -> CaptureSpec:
        """Return the backend's description of ``capture`` (creating its folder)."""
        identity = self.identity()
        at = walk(self.save_path, capture.folder)  # held until the files are written (Capture.close_folder)
        try:
            return self._spec(capture, identity, at)
        except BaseException:
            at.close()
            raise

    def _spec(self, capture: Capture, identity: Identity, at: Folder) -> CaptureSpec:
        folder = at.path
        if not self._swept:  # temporaries that writers killed mid-write left anywhere under save_path
            self._swept = True
            root = self.save_path

            def sweep() -> None:
                sweep_tree(root)

            self.submit(sweep)
        metadata = {
            "capture": capture.id,
            "run": self.run_id,
            "steps": list(capture.steps),
            "step": capture.steps[0],
            "role": "/".join(capture.roles) or None,
            "rank": identity.rank,
            "world_size": identity.world_size,
            "group": identity.group,
            "host": identity.host,
            "pid": identity.pid,
            "start_time": capture.start_wall,
        }
        return CaptureSpec(
            capture_id=capture.id,
            steps=capture.steps,
            roles=capture.roles,
            folder=folder,
            stem=trace_stem(identity, self._spans.next()),
            identity=identity,
            run_id=self.run_id,
            contents=self.config.contents_of(identity.group),
            options=self.config.tool_options,
            compress=self.config.compress,
            metadata=metadata,
            notes=[self.tool_note] if self.tool_note else [],
            at=at,
        )

    def _selection(self, identity: Identity) -> tuple[int, ...] | str:
        """Return the ranks of this process's group (or of processes in none) the configuration profiles."""
        config = self.config
        if identity.group is not None and config.groups:
            chosen = config.groups.get(identity.group)
            return () if chosen is None else chosen.ranks
        return config.ranks if identity.group is not None or config.profile_driver else ()

    def record(self, record: Record | dict[str, Any]) -> None:
        """Append ``record`` to this process's manifest shard and tell listeners."""
        identity = self.identity()
        ondemand = self.ondemand
        if ondemand is not None:  # notes captures not finished; adds who asked for it, and why
            record = ondemand.recorded(record)
        manifest = self._manifest
        if manifest is None or manifest.identity != identity:
            # No lock: the writer thread records too, and two writers of one shard only append.
            manifest = self._manifest = ManifestWriter(self.save_path, self.run_id, identity,
                                                       self._selection(identity))
        full = manifest.envelope(record)
        manifest.write(full)
        for listener in list(self.listeners):
            try:
                listener(full)
            except Exception as exc:  # noqa: BLE001 - a listener never breaks a capture
                warn_once(f"listener:{listener!r}", "profctx: a manifest listener failed: %s", exc)
        if self.owner.capture_hooks and full.get("event") == "finished" and full.get("kind") != "remote":
            self.submit(lambda: self.run_capture_hooks(full))

    def run_capture_hooks(self, full: Record) -> None:
        """Call each ``profctx.on_capture`` hook with a finished capture's record (from the writer thread).

        A hook that raises is logged once and kept in :attr:`errors`; the next hook still runs.
        The hooks run on a daemon thread of their own that the writer waits for: without limit
        while the program runs, and at exit (the main thread ended, or SIGTERM) at most
        ``exit_timeout`` seconds, or until a second SIGTERM (:attr:`exit_forced`). A hook given up
        on is logged and its capture's record is written again with a note saying so (its files
        are written: the record says which), so the process can end.
        """
        from ..manifest import CaptureRecord  # the public record type; ``import profctx`` stays light

        record = CaptureRecord(full)
        current: list[str] = []
        done = threading.Event()

        def call() -> None:
            try:
                for hook in list(self.owner.capture_hooks):
                    current[:] = [getattr(hook, "__qualname__", repr(hook))]
                    try:
                        hook(record)
                    except Exception as exc:  # noqa: BLE001 - a hook never breaks a capture nor training
                        self.failure(f"capture hook {current[0]}", exc, in_flight=True)
            finally:
                done.set()

        if self.exit_passed():
            self._hooks_not_run(full, "not run: the process was exiting and exit_timeout had passed")
            return
        threading.Thread(target=call, name="profctx-hooks", daemon=True).start()
        while not done.wait(HOOK_POLL_S):
            if self.exit_passed():
                why = ("a second SIGTERM" if self.exit_forced.is_set()
                       else f"exit_timeout ({self.config.exit_timeout:g} s)")
                self._hooks_not_run(full, f"given up at exit after {why}, while hook {current[0]} still ran")
                return

    def exit_passed(self) -> bool:
        """Whether the process is exiting and may wait no longer (``exit_timeout`` passed, or a second SIGTERM).

        Exiting: the main thread has ended (Python then waits for the writer thread) or SIGTERM
        arrived (:meth:`exit_began`). The deadline counts from the first of these that is seen.
        """
        if self.exit_forced.is_set():
            return True
        if self.exit_started is None:
            if threading.main_thread().is_alive():
                return False
            self.exit_started = time.monotonic()
        return time.monotonic() - self.exit_started >= self.config.exit_timeout

    def exit_began(self) -> None:
        """Start the exit deadline now (SIGTERM arrived); the hooks are waited for ``exit_timeout`` more seconds."""
        if self.exit_started is None:
            self.exit_started = time.monotonic()

    def _hooks_not_run(self, full: Record, why: str) -> None:
        """Log once and write the capture's record again, saying its ``on_capture`` hooks did not finish."""
        note = f"on_capture hooks {why}; the capture's files are as this record lists them"
        warn_once("hooks-abandoned", "profctx: capture %s: %s", full.get("capture"), note)
        manifest = self._manifest
        if manifest is None:
            return
        again: dict[str, Any] = dict(full)
        again["notes"] = [*(full.get("notes") or ()), note]
        again["hooks"] = "abandoned"
        with contextlib.suppress(Exception):  # exit paths must not raise
            manifest.write(again)

    def manifest_writer(self) -> ManifestWriter | None:
        """Return this process's manifest writer, once anything was recorded."""
        return self._manifest

    def failure(self, what: str, exc: BaseException, *, in_flight: bool = False) -> None:
        """Handle a profiling failure: log once, keep it, raise only when asked to and safe."""
        message = f"{type(exc).__name__}: {exc}"
        self.errors.append(f"{what}: {message}")
        key = f"{what}:{type(exc).__name__}:{getattr(exc, 'errno', '')}"
        warn_once(key, "profctx: %s failed: %s (training continues; repeats are logged at debug level)", what, message)
        if self.config.on_error == "raise" and not in_flight:
            raise ProfilingError(f"profiling {what} failed: {message}") from exc

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the writer thread."""
        self.writer.submit(job)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every stopped capture's files, and the steps timed so far, are written; return whether in time."""
        if self.timeline is not None:
            self.timeline.hand_over(None)
        return self.writer.flush(timeout)

    def shutdown(self, timeout: float | None = None) -> bool:
        """End every capture (stopping those this thread started), write everything, close the manifest.

        A capture started by another thread that is still running is not stopped from here
        (the profiler must stop on its own thread): it is recorded as ``interrupted``. Return
        whether such a thread is still alive (the exit hook then ends the process itself).
        """
        me = threading.get_ident()
        if self.ondemand is not None:
            self.ondemand.stop()
        with self._lock:
            run, holder, deferred = self.run, self.holder(), list(self.deferred)
            self.run = None
            self.deferred = []
            self._refresh_fast()
        alive = {t.ident for t in threading.enumerate()}
        running = False
        for capture in {id(c): c for c in (run, holder, *deferred) if c is not None}.values():
            if capture.thread == me:
                capture.end(in_flight=True)
            else:
                running = running or (capture.recording and capture.thread in alive)
                capture.abandon("still recording at exit on a thread that did not stop it; "
                                "the profiler can only be stopped on the thread that started it")
        timeline = self.timeline
        if timeline is not None:
            timeline.finish()
        self.flush(timeout)
        if timeline is not None and self.config.summary_at_exit:
            timeline.print_summary()
        self.tell_if_nothing_captured(final=True)
        manifest = self._manifest
        if manifest is not None:
            manifest.close(timeout=min(timeout or 0.0, 5.0))
        logger.debug("profctx runtime %s shut down", self.run_id)
        return running

    # -- nothing captured ---------------------------------------------------------------------

    def tell_if_nothing_captured(self, *, final: bool) -> None:
        """Warn (once per process) when the config selected this process and it captured nothing, or no role.

        ``final``: the configuration ends here (exit, ``reset()``, a new ``configure()``);
        otherwise (``profctx.flush()``) only once the steps seen are past the window. Never raises.
        """
        try:
            note = self.nothing_captured(final=final)
        except Exception as exc:  # noqa: BLE001 - exit paths must not raise
            logger.debug("profctx: could not tell whether anything was captured: %s", exc)
            return
        if note is not None:
            warn_once("nothing-captured", "profctx: %s", note)

    def nothing_captured(self, *, final: bool) -> str | None:
        """Return why this process captured nothing (or no role), when it should say so; else ``None``.

        Read from what the runtime keeps anyway, so blocks pay nothing for it: the last step a
        step block entered (``Owner.last_step``), and the plan decisions memoised per role path
        for blocks inside the window (:meth:`open`, :meth:`role_block`), plus the roles of this
        process's ``@profiled`` functions. Silent when nothing here is wrong: the rank is not
        selected, no step was ever marked, or (not ``final``) the window is not over yet.
        """
        if not self.rank_selected():
            return self._selects_no_process() if final else None
        if not self.config.steps:
            return None  # no window of its own (the timeline alone, or armed for requests): nothing to say
        window = self.window
        last = self.owner.last_step
        over = final or (last is not None and bool(window.steps) and last > window.last)
        steps = sorted({key[1] for key in list(self._decisions) if isinstance(key[1], int)})
        entered = bool(steps or self._roles)
        captured = self._manifest is not None or self.run is not None or bool(self._token)
        if not over:
            return None
        shown = f"steps={window.describe()!r}"
        if not entered:
            if captured or last is None:
                return None
            return (f"nothing was captured in this process: no block entered a step of the window {shown} "
                    f"(the last step seen: {last}); check `steps` against the step numbers the loop passes "
                    "to profile_step()")
        patterns = self.config.roles
        mode = self.config.mode
        if mode == "step":
            if not (captured and patterns):
                return None
        elif mode != "role":
            assert_never(mode)
        if self.owner.step_hooks or self.owner.driver is not None:
            return None  # a driver of worker groups: its roles run in the workers, which say this themselves
        paths = {"/".join(roles) for roles in self._seen_role_paths() if roles}
        declared = sorted(set(list(self.owner.switches)) - paths)
        where = f"in the window (steps {_spans(steps)})" if steps else "in the window"
        if patterns:
            if any(role_matches(patterns, tuple(path.split("/"))) for path in paths | set(declared)):
                return None
            if not paths and not declared:
                return None if captured else (
                    f"nothing was captured in this process: mode='role' captures roles, and no role block ran "
                    f"{where}")
            seen = _bounded(sorted(paths)) if paths else "none"
            also = f"; roles of @profiled functions: {_bounded(declared)}" if declared else ""
            head = ("the step captures hold no role ranges" if captured
                    else "nothing was captured in this process")
            return (f"{head}: the role filter roles={list(patterns)!r} matched none of the roles seen {where}: "
                    f"{seen}{also} (a pattern is matched, fnmatch-style, against a role's name or its path)")
        if captured or paths:
            return None
        return f"nothing was captured in this process: mode='role' captures roles, and no role block ran {where}"

    def _selects_no_process(self) -> str | None:
        """Say that ``ranks`` names no rank of this job (``ranks=[1]`` in a one-process run), if so; else ``None``."""
        config, identity = self.config, self.identity()
        ranks = config.ranks
        if ranks == "all" or config.groups or identity.group is not None or identity.world_size < 1:
            return None
        if any(rank < identity.world_size for rank in ranks):
            return None  # another process is selected: this one capturing nothing is what was asked
        return (f"nothing was captured: ranks={list(ranks)!r} selects no process of this run (world size "
                f"{identity.world_size}, ranks 0..{identity.world_size - 1}); check `ranks` against the "
                "launcher's world size")

    def _seen_role_paths(self) -> set[tuple[str, ...]]:
        """Return the role paths of the blocks the plan was asked about inside the window."""
        found: set[tuple[str, ...]] = {key[0] for key in list(self._roles)}
        found.update(key[2] for key in list(self._decisions))
        return found


@final
class Every:
    """A container holding every step (and ``None``): while a stop is pending, no block takes the fast path."""

    __slots__ = ()

    def __contains__(self, step: object) -> bool:
        return True


EVERY: Final = Every()


def _draws_nothing(actions: Actions) -> bool:
    """Whether a role-only block outside any capture does nothing at all with ``actions``, engines attached or not."""
    return not actions.engines and actions.open is None and actions.marker is None and not actions.ranges


def _bounded(names: list[str], limit: int = 8) -> str:
    """Return ``names`` joined by commas, the first ``limit`` of them and how many more."""
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _spans(steps: list[int]) -> str:
    """Return sorted ``steps`` as ranges: ``3-5, 9``."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
