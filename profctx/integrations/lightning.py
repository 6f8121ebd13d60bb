"""Lightning: a ``Profiler`` whose actions become profctx steps and roles, with the summary ``fit()`` prints.

``Trainer(profiler=ProfctxProfiler())``. Lightning reports each hook it runs to its profiler as a
``start(action)`` / ``stop(action)`` pair inside a ``try``/``finally``, so a pair is closed even when
the hook raises. Each ``run_training_batch`` action is a step; the hooks it runs (``training_step``,
``backward``, ``optimizer_step``, ...) are roles, through :class:`profctx.Steps`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from lightning.pytorch.profilers import Profiler

from ..process._owner import OWNER
from ..process._steps import Steps
from ..util._errors import ConfigError
from ..util._log import warn_once

__all__ = ["ProfctxProfiler"]

#: ``[Source]Owner.hook`` as Lightning names the actions of hooks (``[LightningModule]Net.training_step``).
_ACTION = re.compile(r"^\[(?P<source>[^\]]+)\][^.]*\.(?P<hook>[A-Za-z_][A-Za-z0-9_]*)$")
#: The action Lightning wraps around one training batch.
STEP_ACTION = "run_training_batch"
#: Where hooks come from (the bracketed prefix of an action).
SOURCES = ("LightningModule", "Strategy", "Callback", "LightningDataModule")


class ProfctxProfiler(Profiler):  # type: ignore[misc]
    """Profile a Lightning ``fit()`` with profctx: ``Trainer(profiler=ProfctxProfiler())``.

    - step N is the N-th training batch of this ``fit()`` (Lightning's ``run_training_batch``);
      with ``accumulate_grad_batches=k``, k steps make one optimizer step;
    - each hook Lightning reports inside a step, from ``sources`` (default the ``LightningModule``
      and the ``Strategy``), is a role named after the hook (``training_step``, ``backward``,
      ``optimizer_step``, ``on_before_optimizer_step``...), nested as Lightning nests them; a hook
      of the same name as the role it runs in (the strategy's ``training_step`` calling the
      module's) is one role. profctx's ``roles`` filter and mode then decide what is captured;
    - ``summary()`` (which Lightning prints at the end of ``fit()``) gives the wall time of the
      steps and of each role over every step, profiled or not, when ``summary`` is true.

    Hooks outside a training batch (validation, data loading, epoch hooks) are in no step and
    capture nothing. ``sources`` must name Lightning's sources: ``LightningModule``, ``Strategy``,
    ``Callback``, ``LightningDataModule`` (else :class:`profctx.ConfigError`).
    """

    def __init__(self, *, sources: Iterable[str] = ("LightningModule", "Strategy"), summary: bool = True,
                 dirpath: str | Path | None = None, filename: str | None = None) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        #: The begin/end pairs this profiler drives (set first: Lightning's ``__del__`` tears down).
        self.steps = Steps()
        chosen = tuple(sources) if not isinstance(sources, str) else (sources,)
        for source in chosen:
            if source not in SOURCES:
                raise ConfigError("sources", source, f"one of {', '.join(SOURCES)}")
        if not isinstance(summary, bool):
            raise ConfigError("summary", summary, "True or False")
        self.sources = frozenset(chosen)
        self.with_summary = summary
        self._batches = 0
        #: One entry per open action inside the step: (action, the role it began or None, its start time).
        self._open: list[tuple[str, str | None, float]] = []
        #: The roles open inside the step, outermost first.
        self._names: list[str] = []
        #: name -> [calls, total seconds], in first-seen order ("step" first).
        self._times: dict[str, list[float]] = {}
        #: Action name -> its role (``None``: not a role), parsed once.
        self._roles: dict[str, str | None] = {}
        #: Whether hooks are ignored (no step open, or one out of the window with no summary).
        self._quiet = True
        #: Whether the open step can capture (roles are begun in profctx).
        self._live = False
        self._step_start = 0.0
        #: Out of the window, with the summary: the start time of each open action, by name.
        self._starts: dict[str, float] = {}

    # -- Lightning's protocol -----------------------------------------------------------------

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        self._end_step()
        self._batches = 0
        self._times = {}

    def start(self, action_name: str) -> None:
        if action_name == STEP_ACTION:
            self._begin_step()
            return
        if self._quiet:  # outside a step, or a step out of the window with no summary to keep
            return
        if not self._live:  # out of the window: only the summary's clock
            self._starts[action_name] = time.perf_counter()
            return
        role = self._roles.get(action_name, "")
        if role == "":
            role = self._roles[action_name] = self._role_of(action_name)
        if role is not None:
            roles = self._names
            if roles and roles[-1] == role:
                role = None  # the strategy's hook calling the module's hook of the same name: one role
            else:
                roles.append(role)
                if self._live:
                    try:
                        self.steps.begin_role(role)
                    except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
                        _failed(exc)
        self._open.append((action_name, role, time.perf_counter() if role is not None and self.with_summary else 0.0))

    def stop(self, action_name: str) -> None:
        if action_name == STEP_ACTION:
            self._end_step()
            return
        if self._quiet:
            return
        if not self._live:
            t0 = self._starts.pop(action_name, None)
            if t0 is not None:
                role = self._roles.get(action_name, "")
                if role == "":
                    role = self._roles[action_name] = self._role_of(action_name)
                if role is not None:
                    entry = self._times.get(role)
                    if entry is None:
                        entry = self._times[role] = [0, 0.0]
                    entry[0] += 1
                    entry[1] += time.perf_counter() - t0
            return
        opened = self._open
        if opened and opened[-1][0] == action_name:
            _, role, t0 = opened.pop()
        else:  # not the innermost: Lightning nests its actions, so only a stop without its start
            for index in range(len(opened) - 1, -1, -1):
                if opened[index][0] == action_name:
                    break
            else:
                return
            _, role, t0 = opened.pop(index)
        if role is None:
            return
        if self.with_summary:
            entry = self._times.get(role)
            if entry is None:
                entry = self._times[role] = [0, 0.0]
            entry[0] += 1
            entry[1] += time.perf_counter() - t0
        if self._names and self._names[-1] == role:
            self._names.pop()
        if self._live:
            try:
                self.steps.end_role(role)
            except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
                _failed(exc)

    def _begin_step(self) -> None:
        if self._open or self._names:  # a step whose stop never came
            self._end_step()
        self._batches += 1
        try:
            self.steps.begin(self._batches)
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            _failed(exc)
        self._live = self.steps.live
        self._quiet = not (self._live or self.with_summary)
        self._step_start = time.perf_counter() if self.with_summary else 0.0

    def _end_step(self) -> None:
        if self.with_summary and self._step_start:
            self._add("step", time.perf_counter() - self._step_start)
        self._step_start = 0.0
        self._starts = {}
        self._open = []
        self._names = []
        self._quiet = True
        self._live = False
        try:
            self.steps.end()
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            _failed(exc)

    def _role_of(self, action_name: str) -> str | None:
        match = _ACTION.match(action_name)
        return match["hook"] if match is not None and match["source"] in self.sources else None

    def _add(self, name: str, seconds: float) -> None:
        entry = self._times.get(name)
        if entry is None:
            entry = self._times[name] = [0, 0.0]
        entry[0] += 1
        entry[1] += seconds

    def summary(self) -> str:
        """Return the steps' and roles' wall times over this ``fit()`` (empty without ``summary``)."""
        if not self.with_summary or not self._times:
            return ""
        step_total = self._times.get("step", [0, 0.0])[1]
        lines = [f"{'profctx: role':<32} {'calls':>7} {'total s':>10} {'mean ms':>10} {'of steps':>9}"]
        for name, (calls, total) in self._times.items():
            share = f"{100 * total / step_total:8.1f}%" if step_total else ""
            lines.append(f"{name:<32} {int(calls):>7} {total:>10.3f} {1000 * total / max(calls, 1):>10.3f} {share:>9}")
        return os.linesep + os.linesep.join(lines) + os.linesep

    def teardown(self, stage: str | None) -> None:
        self._end_step()
        super().teardown(stage)


def _failed(exc: Exception) -> None:
    """Log a profiling failure once (raise it under ``on_error="raise"``): never break training."""
    config = OWNER.config
    if config is not None and config.on_error == "raise":
        raise exc
    warn_once(f"lightning:{type(exc).__name__}", "profctx: the Lightning profiler failed: %s", exc)
