"""The one owner of profctx's process state. ``reset()`` ends all of it (``Owner.end``).

Everything profctx keeps for a process lives in the single :data:`OWNER`: the configuration,
the runtime of that configuration (identity, backend, the native-capture token, manifest
writer, writer thread, listeners), the role hooks engines attach, the gate ``@profiled``
reads, the configuration carried in from another process and the one carried out. Outside it,
only context variables (the ambient scope and capture, per task) and process-wide helpers with
their own reset outlive a call: the log-once keys (``_log.reset``), the exit hooks
(``_lifecycle.uninstall``) and the engines' private loop (``engines._attach.end``).
``tests/test_structure.py`` checks that ``reset()`` leaves every module as it found it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..core._config import ProfilerConfig
    from ..core._scope import Scope
    from ._runtime import Runtime


class RoleHook(Protocol):
    """Told when a role block matching ``engines.roles`` is entered and left in an in-window step.

    ``enter`` returns a handle passed back to ``exit``; ``None`` means "nothing started".
    Exceptions are caught, logged once and recorded by the runtime. ``shutdown()`` stops
    what is open (process exit, SIGTERM); ``reset()`` forgets everything (``profctx.reset()``);
    ``check_config(config)`` raises ``ConfigError`` for options the hook cannot honour.
    """

    def enter(self, runtime: Runtime, scope: Scope) -> object: ...

    def exit(self, runtime: Runtime, handle: object) -> None: ...

    async def aenter(self, runtime: Runtime, scope: Scope) -> object: ...

    async def aexit(self, runtime: Runtime, handle: object) -> None: ...

    def check_config(self, config: ProfilerConfig) -> None: ...

    def shutdown(self) -> None: ...

    def reset(self) -> None: ...


class Switch(list):  # type: ignore[type-arg]
    """A role's switch: a list, empty while ``@profiled`` calls of the role go straight through.

    Truth-tested in C (``if switch:``). A copy pickled by value (cloudpickle copies a function's
    closure, and a ``@profiled`` function keeps its switch there) unpickles as the switch of the
    same role in the receiving process, not as a frozen copy.
    """

    __slots__ = ("role",)

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def __reduce__(self) -> tuple[Any, ...]:
        return switch_of, (self.role,)


def switch_of(role: str) -> Switch:
    """Return this process's switch of ``role`` (what a pickled :class:`Switch` becomes)."""
    return OWNER.switch(role)


class Timed(list):  # type: ignore[type-arg]
    """Non-empty while a step the timeline times is under way in the process (one entry per such step).

    ``@profiled`` functions read it beside their role's switch (``if switch or timed:``, both in C):
    outside any step both are empty and the call goes straight through; inside one, the wrapper
    times a top-level role for the timeline. Pickled, it becomes the receiving process's.
    """

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return timed_of, ()


def timed_of() -> Timed:
    """Return this process's :class:`Timed` (what a pickled one becomes)."""
    return OWNER.timed


class Owner:
    """All of profctx's process state. One instance per process: :data:`OWNER`.

    ``gate`` is non-empty while a block of this process is inside an in-window step; each
    role name's ``switch`` is non-empty while a ``@profiled`` call with that role must run
    its wrapper (``@profiled`` reads ``switch.__len__``, a C call, so the off path costs
    about one extra call). Switches are recomputed only when the gate opens or closes,
    a capture starts or ends, or engines are attached.
    """

    __slots__ = ("_lit", "_lock", "capture_hooks", "carried", "carry_cache", "config", "control", "driver", "env_read",
                 "gate", "held", "hooks", "last_step", "runtime", "settle", "step_hooks", "switches", "timed")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        #: The configuration given to ``configure()`` (``None``: never configured, or reset).
        self.config: ProfilerConfig | None = None
        #: The runtime of an active configuration (``None`` when nothing can be captured).
        self.runtime: Runtime | None = None
        #: The configuration adopted from a carried snapshot: (carried dict, rank, world size, config).
        self.carried: tuple[Any, int | None, int | None, ProfilerConfig | None] | None = None
        #: The config as outgoing calls carry it: (config, run id, its dict), built once per config.
        self.carry_cache: tuple[ProfilerConfig, str | None, dict[str, Any]] | None = None
        #: Role hooks (attached engines).
        self.hooks: list[RoleHook] = []
        #: One entry per block of this process inside an in-window step.
        self.gate: list[object] = []
        #: Whether the switches were last computed with the gate open (``refresh``).
        self._lit = False
        #: Role name -> its switch (shared by every ``@profiled`` function of that role).
        self.switches: dict[str, Switch] = {}
        #: Whether the ``PROFCTX_*`` environment was read (by ``configure()``, or by the first
        #: block of a process that was never configured).
        self.env_read = False
        #: Step hooks: told when a step block of this process enters and leaves an in-window step
        #: (the Ray driver, which tells its worker groups).
        self.step_hooks: list[RoleHook] = []
        #: The driver's worker groups (``profctx.ray``'s registry), if any.
        self.driver: Any = None
        #: Work to finish before a block opens anything (``settle()`` / ``asettle()``): the Ray driver's worker
        #: joins still under way, so that a member's warm-up lands in no capture. Empty almost always.
        self.settle: list[Any] = []
        #: The step held for the whole process by its driver (a ``_block.Held``), if any.
        self.held: Any = None
        #: The thread a worker's held steps start and stop on when Ray runs control calls off
        #: the main thread (``profctx.ray``'s control executor), if started.
        self.control: Any = None
        #: The step the last step block of this process entered (named when nothing was captured).
        self.last_step: int | None = None
        #: Called on the writer thread with each finished capture's record (``profctx.on_capture``).
        self.capture_hooks: list[Any] = []
        #: One entry per step the timeline times now (never rebound: ``@profiled`` functions hold it).
        self.timed = Timed()

    # -- switches -----------------------------------------------------------------------------

    def switch(self, role: str) -> Switch:
        """Return the switch of ``role`` (created off, or on if the process state wants it)."""
        with self._lock:
            found = self.switches.get(role)
            if found is None:
                found = self.switches[role] = Switch(role)
                self._set(role, found)
            return found

    def refresh(self) -> None:
        """Recompute every switch from the gate, the live capture and the attached hooks."""
        with self._lock:
            # ``_lit`` first, the gate read again after: a block that opened or closed the gate
            # meanwhile saw the new ``_lit`` (and refreshes) or is seen here (and we go again).
            lit = None
            while lit != bool(self.gate):
                lit = self._lit = bool(self.gate)
                for role, switch in self.switches.items():
                    self._set(role, switch)

    def _set(self, role: str, switch: Switch) -> None:
        on = self._lit and self._wants(role)
        if on and not switch:
            switch.append(True)
        elif not on and switch:
            switch.clear()

    def _wants(self, role: str) -> bool:
        runtime = self.runtime
        return runtime is not None and runtime.wants_role(role, engines=bool(self.hooks))

    def open_gate(self, token: object) -> None:
        """Note a block inside an in-window step (switches are recomputed on the first).

        No lock while the gate is already open: ``list.append`` is atomic, and a block that
        opens it while the last one closes it is settled by :meth:`refresh`.
        """
        self.gate.append(token)
        if not self._lit:
            self.refresh()

    def close_gate(self, token: object) -> None:
        """Undo :meth:`open_gate` for ``token`` (switches go off with the last)."""
        gate = self.gate
        try:
            gate.remove(token)
        except ValueError:
            return
        if not gate:
            self.refresh()

    # -- hooks --------------------------------------------------------------------------------

    def add_hook(self, hook: RoleHook) -> None:
        """Register ``hook`` (once)."""
        with self._lock:
            if hook not in self.hooks:
                self.hooks.append(hook)
                self.refresh()

    def remove_hook(self, hook: RoleHook) -> None:
        """Unregister ``hook`` if registered."""
        with self._lock:
            if hook in self.hooks:
                self.hooks.remove(hook)
                self.refresh()

    # -- the end ------------------------------------------------------------------------------

    def end(self) -> None:
        """Return to the state of a fresh process (the runtime must already be shut down).

        Switches stay registered (decorated functions hold them) but all go off. The Ray
        layer's driver registry, held step and control thread must already be ended
        (``profctx.ray`` does it from ``reset()``).
        """
        with self._lock:
            hooks, self.hooks = self.hooks, []
            self.step_hooks = []
            self.driver = None
            self.settle = []
            self.held = None
            control, self.control = self.control, None
            self.config = None
            self.runtime = None
            self.carried = None
            self.carry_cache = None
            self.env_read = False
            self.last_step = None
            self.capture_hooks = []
            self.gate.clear()
            self.timed.clear()
            self.refresh()
        if control is not None:
            control.shutdown(wait=False)
        for hook in hooks:
            reset = getattr(hook, "reset", None)
            if reset is not None:
                reset()


#: The process's owner.
OWNER = Owner()
