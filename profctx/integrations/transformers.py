"""Hugging Face ``Trainer`` (and TRL's trainers): steps and phases from ``TrainerCallback`` events.

``ProfctxCallback`` marks each training step with the number the user sees (the ``Trainer``
counts a step when it ends: during step ``state.global_step + 1``), each micro-batch's
``training_step`` (forward and backward; in TRL's online trainers, generation and scoring too)
and the ``optimizer_step``, as roles, through :class:`profctx.Steps`. Only the events the
``Trainer`` publishes are used; TRL 1.16's phase timers (``trl.extras.profiling``) expose no hook,
so its phases are not roles here (see docs/integrations/transformers.md).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..process._last import check_metrics, last_step
from ..process._owner import OWNER
from ..process._steps import Steps
from ..util._errors import ConfigError
from ..util._log import warn_once

__all__ = ["ProfctxCallback"]


def _role(field: str, value: object) -> str | None:
    if value is None or (isinstance(value, str) and value.strip("/")):
        return value
    raise ConfigError(field, value, "a role name such as 'optimizer_step', or None to leave the phase unmarked")


class ProfctxCallback(TrainerCallback):  # type: ignore[misc]
    """Mark the ``Trainer``'s steps and phases for profctx: ``Trainer(..., callbacks=[ProfctxCallback()])``.

    - step ``state.global_step + 1`` from ``on_step_begin`` to ``on_step_end`` (so the steps of
      ``configure(steps=...)`` are the ones the ``Trainer`` logs);
    - role ``micro_batch_role`` (default ``"training_step"``) around each micro-batch's
      ``Trainer.training_step``, once per micro-batch under gradient accumulation;
    - role ``optimizer_role`` (default ``"optimizer_step"``) around ``optimizer.step()``.

    ``None`` leaves a phase unmarked. Loading the step's batches happens before
    ``on_step_begin``, gradient clipping after the last micro-batch: both are in the step's
    capture (step mode) but in neither role.

    A run that raises: the ``Trainer`` fires no event on an exception, so the step it was in
    stays open until the next ``train()`` (``on_train_begin`` closes it) or until the callback
    is closed. Use it as a context manager around ``train()`` for the full guarantee: on exit
    every capture it opened is ended and written, and no block sees the dead step::

        with callback:
            trainer.train()

    **Phases into the tracker.** Given the ``trainer`` (``ProfctxCallback(trainer=trainer)``
    added with ``trainer.add_callback``, or :meth:`attach`), each time the ``Trainer`` logs (its
    ``logging_steps``), the callback logs the phases of the step that just ended through
    ``Trainer.log`` — the path that reaches every ``report_to`` tracker (TensorBoard, W&B,
    MLflow...) and ``state.log_history`` — as ``{prefix}step`` and ``{prefix}{role}`` seconds
    (:meth:`profctx.StepTimes.metrics`; verl's names are ``timing_s/...``), plus each role's
    block count under ``counts`` when given. ``metrics=False`` turns it off. Without the
    ``trainer`` nothing is logged: adding keys to ``logs`` in ``on_log`` reaches only the
    callbacks after this one, not the trackers, which the ``Trainer`` calls first. Needs the
    timeline (``timeline=True``, the default).

    Profiling errors are logged once and never raised into training (``on_error="raise"``
    raises them, for tests).
    """

    def __init__(self, *, micro_batch_role: str | None = "training_step",
                 optimizer_role: str | None = "optimizer_step", trainer: Any = None, metrics: bool = True,
                 prefix: str = "timing_s/", counts: str | None = None) -> None:
        self.micro_batch_role = _role("micro_batch_role", micro_batch_role)
        self.optimizer_role = _role("optimizer_role", optimizer_role)
        check_metrics(metrics, prefix, counts)
        if trainer is not None and not callable(getattr(trainer, "log", None)):
            raise ConfigError("trainer", trainer, "the transformers Trainer (or TRL trainer) this callback is added to")
        #: The Trainer whose ``log`` carries the phases to its trackers (``None``: not logged).
        self.trainer = trainer
        self.metrics = metrics
        self.prefix = prefix
        self.counts = counts
        #: The last step whose phases were logged (each step's once, however many logs the Trainer makes).
        self._logged: int | None = None
        #: Inside this callback's own ``Trainer.log`` call (its ``on_log`` comes back here).
        self._logging = False
        #: The begin/end pairs this callback drives.
        self.steps = Steps()
        #: Whether the open step marks roles (it can capture, or the timeline times its phases): known when
        #: it began (the other events read this rather than ask again; with nothing to do they return at once).
        self._live = False

    # -- the Trainer's events ------------------------------------------------------------------
    # The Trainer passes six objects by keyword to every callback at every event. The events of a
    # step name them, so that they bind as parameters: gathered into ``**kwargs`` they would cost
    # a dict per event, more than the callback's own work out of the window.

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        try:
            self.steps.close()  # a step a previous train() left open when it raised
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            _failed(exc)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      *, model: Any = None, processing_class: Any = None, optimizer: Any = None,
                      lr_scheduler: Any = None, train_dataloader: Any = None, eval_dataloader: Any = None,
                      **kwargs: Any) -> None:
        steps = self.steps
        try:
            steps.begin(state.global_step + 1)
            live = self._live = steps.marks_roles
            if live and self.micro_batch_role is not None:
                steps.begin_role(self.micro_batch_role)
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            _failed(exc)

    def on_substep_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       *, model: Any = None, processing_class: Any = None, optimizer: Any = None,
                       lr_scheduler: Any = None, train_dataloader: Any = None, eval_dataloader: Any = None,
                       **kwargs: Any) -> None:
        role = self.micro_batch_role
        if self._live and role is not None:
            try:
                self.steps.switch_role(role, role)
            except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
                _failed(exc)

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              *, model: Any = None, processing_class: Any = None, optimizer: Any = None,
                              lr_scheduler: Any = None, train_dataloader: Any = None, eval_dataloader: Any = None,
                              **kwargs: Any) -> None:
        if self._live:
            try:
                self.steps.switch_role(self.micro_batch_role, self.optimizer_role)
            except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
                _failed(exc)

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          *, model: Any = None, processing_class: Any = None, optimizer: Any = None,
                          lr_scheduler: Any = None, train_dataloader: Any = None, eval_dataloader: Any = None,
                          **kwargs: Any) -> None:
        role = self.optimizer_role
        if self._live and role is not None:
            try:
                self.steps.end_role(role)
            except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
                _failed(exc)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    *, model: Any = None, processing_class: Any = None, optimizer: Any = None,
                    lr_scheduler: Any = None, train_dataloader: Any = None, eval_dataloader: Any = None,
                    **kwargs: Any) -> None:
        self._live = False
        try:
            self.steps.end()
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            _failed(exc)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs: Any = None,
               **kwargs: Any) -> None:
        trainer = self.trainer
        if trainer is None or not self.metrics or self._logging:
            return
        try:
            last = last_step()
            if last is None or last.step == self._logged or last.step != state.global_step:
                return  # no step ended yet, logged already, or a log made out of the training steps
            self._logged = last.step
            values = last.metrics(self.prefix, counts=self.counts)
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            _failed(exc)
            return
        self._logging = True
        try:
            # The base class's log: a subclass's (TRL's) merges and clears its own pending metrics there.
            log = Trainer.log.__get__(trainer) if isinstance(trainer, Trainer) else trainer.log
            log(values)  # the trackers' own errors are theirs: not caught
        finally:
            self._logging = False

    @classmethod
    def attach(cls, trainer: Any, **options: Any) -> ProfctxCallback:
        """Add a callback to ``trainer`` (``trainer.add_callback``) that logs the phases through it; return it."""
        callback = cls(trainer=trainer, **options)
        trainer.add_callback(callback)
        return callback

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        try:
            self.steps.close()
        except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
            _failed(exc)

    # -- the guarantee around train() ----------------------------------------------------------

    def close(self) -> None:
        """End the step and roles left open, if any (idempotent)."""
        self.steps.close()

    def __enter__(self) -> ProfctxCallback:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.steps.__exit__(exc_type, exc, tb)


def _failed(exc: Exception) -> None:
    """Log a profiling failure once (raise it under ``on_error="raise"``): never break training."""
    config = OWNER.config
    if config is not None and config.on_error == "raise":
        raise exc
    warn_once(f"hf-callback:{type(exc).__name__}", "profctx: the Trainer callback failed: %s", exc)
