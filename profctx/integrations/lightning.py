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
from typing import Any

from lightning.pytorch.profilers import Profiler

from .._errors import ConfigError
from .._log import warn_once
from .._owner import OWNER
from .._steps import Steps

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
        #: One entry per open action: (action, the role it began or None, its start time).
        self._open: list[tuple[str, str | None, float]] = []
        #: name -> [calls, total seconds], in first-seen order ("step" first).
        self._times: dict[str, list[float]] = {}

    # -- Lightning's protocol -----------------------------------------------------------------

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        self._safely(self.steps.close)
        self._batches = 0
        self._open = []
        self._times = {}

    def start(self, action_name: str) -> None:
        t0 = time.perf_counter()
        role: str | None = None
        try:
            if action_name == STEP_ACTION:
                self._batches += 1
                self.steps.begin(self._batches)
                role = "step"
            elif self.steps.step is not None:
                match = _ACTION.match(action_name)
                if match is not None and match["source"] in self.sources:
                    hook = match["hook"]
                    roles = self.steps.roles
                    if not roles or roles[-1] != hook:
                        self.steps.begin_role(hook)
                        role = hook
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            self._failed(exc)
        self._open.append((action_name, role, t0))

    def stop(self, action_name: str) -> None:
        now = time.perf_counter()
        for index in range(len(self._open) - 1, -1, -1):  # the innermost open action of that name
            if self._open[index][0] == action_name:
                break
        else:
            return  # a stop without its start: nothing to end
        _, role, t0 = self._open.pop(index)
        if role is None:
            return
        if self.with_summary:
            entry = self._times.setdefault(role, [0, 0.0])
            entry[0] += 1
            entry[1] += now - t0
        try:
            if role == "step":
                self.steps.end()
            else:
                self.steps.end_role(role)
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            self._failed(exc)

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
        self._safely(self.steps.close)
        self._open = []
        super().teardown(stage)

    # -- failures ------------------------------------------------------------------------------

    def _safely(self, action: Any) -> None:
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            self._failed(exc)

    @staticmethod
    def _failed(exc: Exception) -> None:
        config = OWNER.config
        if config is not None and config.on_error == "raise":
            raise exc
        warn_once(f"lightning:{type(exc).__name__}", "profctx: the Lightning profiler failed: %s", exc)
