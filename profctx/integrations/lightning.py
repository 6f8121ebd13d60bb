"""Lightning: a ``Profiler`` whose actions become profctx steps and roles, with the summary ``fit()`` prints.

``Trainer(profiler=ProfctxProfiler())``. Lightning reports each hook it runs to its profiler as a
``with profiler.profile(action)`` block (or a ``start``/``stop`` pair in a ``try``/``finally``), so
an action is closed even when the hook raises. The step is the Trainer's ``global_step`` (one per
optimizer step, over the training batches that make it); the hooks it runs (``training_step``,
``backward``, ``optimizer_step``, ...) are roles, through :class:`profctx.Steps`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import final

from lightning.pytorch.profilers import Profiler

from ..process._last import check_metrics, last_step
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


@final
class _Nothing:
    """The context of an action that does nothing: shared, so an ignored hook allocates nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


_NOTHING = _Nothing()


@final
class _Tally:
    """One row of the summary: calls and wall seconds over this ``fit()``.

    ``depth`` counts the open actions of the row, so that an action nested in one of the same
    row (the strategy's ``training_step`` calling the module's) is timed once; ``batch`` is
    the batch the outermost one opened in (an action left open in an earlier batch is dropped).
    """

    __slots__ = ("batch", "calls", "depth", "start", "total")

    def __init__(self) -> None:
        self.calls = 0
        self.total = 0.0
        self.depth = 0
        self.start = 0.0
        self.batch = -1


@final
class _Hook:
    """The context of one hook action that is a role: begins the role (in a live step) and times it."""

    __slots__ = ("profiler", "role", "tally")

    def __init__(self, profiler: ProfctxProfiler, role: str, tally: _Tally | None) -> None:
        self.profiler = profiler
        self.role = role
        self.tally = tally

    def __enter__(self) -> None:
        profiler = self.profiler
        if profiler._live:
            profiler._enter_role(self.role)
        tally = self.tally
        if tally is not None:
            if tally.depth and tally.batch == profiler._batches:
                tally.depth += 1
            else:
                tally.depth = 1
                tally.batch = profiler._batches
                tally.start = time.perf_counter()

    def __exit__(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
                 tb: TracebackType | None = None) -> None:
        tally = self.tally
        if tally is not None and tally.depth:
            tally.depth -= 1
            if not tally.depth:
                tally.calls += 1
                tally.total += time.perf_counter() - tally.start
        profiler = self.profiler
        if profiler._live:
            profiler._exit_role(self.role)


@final
class _Batch:
    """The context of Lightning's ``run_training_batch`` action."""

    __slots__ = ("profiler",)

    def __init__(self, profiler: ProfctxProfiler) -> None:
        self.profiler = profiler

    def __enter__(self) -> None:
        self.profiler._begin_batch()

    def __exit__(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
                 tb: TracebackType | None = None) -> None:
        if exc_type is None:
            self.profiler._end_batch()
        else:  # the batch raised: its optimizer step will not come
            self.profiler._close_step(raised=True)


class ProfctxProfiler(Profiler):  # type: ignore[misc]
    """Profile a Lightning ``fit()`` with profctx: ``Trainer(profiler=ProfctxProfiler())``.

    - the step is ``trainer.global_step`` as the training batch sees it (``self.global_step``
      in ``training_step``, the step Lightning's loggers plot the batch's metrics at): step N
      holds the training batches of the (N+1)-th optimizer step, so with
      ``accumulate_grad_batches=k`` one step holds k batches, and ``configure(steps=[3])``
      captures what the Trainer calls step 3;
    - each hook Lightning reports inside a training batch, from ``sources`` (default the
      ``LightningModule`` and the ``Strategy``), is a role named after the hook
      (``training_step``, ``backward``, ``optimizer_step``, ``on_before_optimizer_step``...),
      nested as Lightning nests them; a hook of the same name as the role it runs in (the
      strategy's ``training_step`` calling the module's) is one role. profctx's ``roles``
      filter and mode then decide what is captured;
    - ``summary()`` (which Lightning prints at the end of ``fit()``) gives the wall time of the
      steps and of each role over every step, profiled or not, when ``summary`` is true;
    - each step's phases go to the Trainer's loggers (``trainer.loggers``, each one's
      ``log_metrics(..., step=N)``) every ``log_every_n_steps`` steps, as ``{prefix}step`` and
      ``{prefix}{role}`` seconds (top-level roles, :meth:`profctx.StepTimes.metrics`), plus
      block counts under ``counts`` when given; ``metrics=False`` turns it off. Needs the
      timeline (``timeline=True``, the default).

    Hooks outside a training batch (validation, data loading, epoch hooks) are in no role; those
    between the batches of one step are inside the step. ``sources`` must name Lightning's
    sources: ``LightningModule``, ``Strategy``, ``Callback``, ``LightningDataModule`` (else
    :class:`profctx.ConfigError`). Call it from the training thread (as Lightning does).
    """

    def __init__(self, *, sources: Iterable[str] = ("LightningModule", "Strategy"), summary: bool = True,
                 dirpath: str | Path | None = None, filename: str | None = None, metrics: bool = True,
                 prefix: str = "timing_s/", counts: str | None = None) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.metrics = False
        self.prefix = prefix
        self.counts = counts
        # Every field is set before the arguments are checked: Lightning's ``__del__`` tears down.
        #: The begin/end pairs this profiler drives.
        self.steps = Steps()
        self.with_summary = False
        self._batch = _Batch(self)
        #: Training batches begun in this ``fit()``.
        self._batches = 0
        #: The step the next batch is in, known from the end of the last one (``None``: ask the Trainer).
        self._next: int | None = None
        #: The step open, if any (it may span several batches).
        self._step: int | None = None
        #: Inside a training batch.
        self._in_batch = False
        #: Whether hooks are ignored (outside a batch, or in a step out of the window with no summary).
        self._quiet = True
        #: Whether the open step marks roles in profctx (it can capture, or the timeline times them).
        self._live = False
        #: The roles open inside the batch, innermost last: (role, whether it began one in profctx).
        self._open: list[tuple[str, bool]] = []
        #: Summary rows by name, in first-seen order.
        self._times: dict[str, _Tally] = {}
        #: Action name -> its context: a role's, or the shared one of an action that is no role.
        self._hooks: dict[str, _Hook | _Nothing] = {}
        self._step_start = 0.0
        chosen = tuple(sources) if not isinstance(sources, str) else (sources,)
        for source in chosen:
            if source not in SOURCES:
                raise ConfigError("sources", source, f"one of {', '.join(SOURCES)}")
        if not isinstance(summary, bool):
            raise ConfigError("summary", summary, "True or False")
        check_metrics(metrics, prefix, counts)
        self.sources = frozenset(chosen)
        self.with_summary = summary
        self.metrics = metrics

    # -- Lightning's protocol -----------------------------------------------------------------

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        self._close_step()
        self._batches = 0
        self._next = None
        self._times = {}
        self._hooks = {}

    def profile(self, action_name: str) -> _Batch | _Hook | _Nothing:
        """Return the context of ``action_name``: a shared no-op unless the action is a role in a step."""
        if action_name == STEP_ACTION:
            return self._batch
        if self._quiet:
            return _NOTHING
        hook = self._hooks.get(action_name)
        if hook is None:
            hook = self._hooks[action_name] = self._hook_for(action_name)
        return hook

    def start(self, action_name: str) -> None:
        self.profile(action_name).__enter__()

    def stop(self, action_name: str) -> None:
        if action_name == STEP_ACTION:
            self._end_batch()
        elif not self._quiet:
            hook = self._hooks.get(action_name)
            if hook is not None:
                hook.__exit__(None, None, None)

    def summary(self) -> str:
        """Return the steps' and roles' wall times over this ``fit()`` (empty without ``summary``)."""
        if not self.with_summary or not self._times:
            return ""
        step = self._times.get("step")
        step_total = step.total if step is not None else 0.0
        lines = [f"{'profctx: role':<32} {'calls':>7} {'total s':>10} {'mean ms':>10} {'of steps':>9}"]
        for name, tally in sorted(self._times.items(), key=lambda row: row[0] != "step"):  # the steps first
            calls, total = tally.calls, tally.total
            share = f"{100 * total / step_total:8.1f}%" if step_total else ""
            lines.append(f"{name:<32} {calls:>7} {total:>10.3f} {1000 * total / max(calls, 1):>10.3f} {share:>9}")
        return os.linesep + os.linesep.join(lines) + os.linesep

    def teardown(self, stage: str | None) -> None:
        self._close_step()
        super().teardown(stage)

    # -- the guarantee around fit() ------------------------------------------------------------

    def close(self) -> None:
        """End the step and roles left open, if any (idempotent)."""
        self._close_step()

    def __enter__(self) -> ProfctxProfiler:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._close_step(raised=exc_type is not None)

    # -- steps --------------------------------------------------------------------------------

    def _begin_batch(self) -> None:
        if self._in_batch:  # a batch whose end never came
            self._end_batch()
        self._batches += 1
        step = self._next
        if step is None:
            step = self._global_step()
            if step is None:  # no Trainer to ask (the profiler driven by hand): one step per batch
                step = self._batches - 1
        if step != self._step:
            self._close_step()
            try:
                self.steps.begin(step)
            except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
                _failed(exc)
            self._step = step
            self._live = self.steps.marks_roles
            if self.with_summary:
                self._step_start = time.perf_counter()
        self._in_batch = True
        self._quiet = not (self._live or self.with_summary)

    def _end_batch(self) -> None:
        if not self._in_batch:
            return
        self._in_batch = False
        self._quiet = True
        if self._open:  # actions whose stop never came
            self._end_roles()
        after = self._global_step()
        if after is None:
            after = self._batches
        self._next = after
        if after != self._step:  # the optimizer stepped: the step is over
            self._close_step()

    def _close_step(self, raised: bool = False) -> None:
        """End the open step, its batch and its roles, if any (``raised``: ended by an exception)."""
        self._in_batch = False
        self._quiet = True
        if self._open:
            if raised:
                self._open = []  # closed with the step below
            else:
                self._end_roles()
        if self._step is None:
            return
        self._step = None
        self._live = False
        if self._step_start:
            tally = self._times.get("step")
            if tally is None:
                tally = self._times["step"] = _Tally()
            tally.calls += 1
            tally.total += time.perf_counter() - self._step_start
            self._step_start = 0.0
        try:
            if raised:
                self.steps.close()  # as a block an exception leaves
            else:
                self.steps.end()
                if self.metrics:
                    self._log_phases()
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            _failed(exc)

    def _log_phases(self) -> None:
        """Log the phases of the step that just ended to the Trainer's loggers, every ``log_every_n_steps``."""
        module = getattr(self, "_lightning_module", None)  # as _global_step reads it
        trainer = getattr(module, "trainer", None) if module is not None else None
        loggers = getattr(trainer, "loggers", None) if trainer is not None else None
        if not loggers:
            return
        last = last_step()
        if last is None:
            return
        every = getattr(trainer, "log_every_n_steps", 1)
        if type(every) is int and every > 1 and (last.step + 1) % every:
            return
        values = last.metrics(self.prefix, counts=self.counts)
        for logger in loggers:
            logger.log_metrics(values, step=last.step)  # the loggers' own errors are theirs: not caught

    def _global_step(self) -> int | None:
        """The Trainer's ``global_step``, or ``None`` when no Trainer drives this profiler.

        Lightning hands no public handle on the Trainer to a profiler; the Trainer sets the
        module it runs as ``_lightning_module`` on every profiler before ``setup`` (Lightning's
        own ``PyTorchProfiler`` reads it for its step count too). Only read, never set.
        """
        module = getattr(self, "_lightning_module", None)
        if module is None:
            return None
        try:
            step = module.trainer.global_step
        except Exception:  # noqa: BLE001 - a module no longer attached (or gone): count batches instead
            return None
        return step if type(step) is int and step >= 0 else None

    # -- roles --------------------------------------------------------------------------------

    def _hook_for(self, action_name: str) -> _Hook | _Nothing:
        match = _ACTION.match(action_name)
        if match is None or match["source"] not in self.sources:
            return _NOTHING
        role = match["hook"]
        tally = None
        if self.with_summary:
            tally = self._times.get(role)
            if tally is None:
                tally = self._times[role] = _Tally()
        return _Hook(self, role, tally)

    def _enter_role(self, role: str) -> None:
        opened = self._open
        if opened and opened[-1][0] == role:  # the strategy's hook calling the module's of the same name
            opened.append((role, False))
            return
        opened.append((role, True))
        try:
            self.steps.begin_role(role)
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            _failed(exc)

    def _exit_role(self, role: str) -> None:
        opened = self._open
        for index in range(len(opened) - 1, -1, -1):
            if opened[index][0] == role:
                break
        else:
            return  # a stop without its start
        began = opened.pop(index)[1]
        if began:
            try:
                self.steps.end_role(role)
            except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
                _failed(exc)

    def _end_roles(self) -> None:
        """End the roles whose stop never came (the outermost such role ends those inside it)."""
        opened, self._open = self._open, []
        for role, began in opened:
            if began:
                try:
                    self.steps.end_role(role)
                except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
                    _failed(exc)
                return

def _failed(exc: Exception) -> None:
    """Log a profiling failure once (raise it under ``on_error="raise"``): never break training."""
    config = OWNER.config
    if config is not None and config.on_error == "raise":
        raise exc
    warn_once(f"lightning:{type(exc).__name__}", "profctx: the Lightning profiler failed: %s", exc)
