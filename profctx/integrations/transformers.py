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

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

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

    Profiling errors are logged once and never raised into training (``on_error="raise"``
    raises them, for tests).
    """

    def __init__(self, *, micro_batch_role: str | None = "training_step",
                 optimizer_role: str | None = "optimizer_step") -> None:
        self.micro_batch_role = _role("micro_batch_role", micro_batch_role)
        self.optimizer_role = _role("optimizer_role", optimizer_role)
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
                self.steps.end_role(role)
                self.steps.begin_role(role)
            except Exception as exc:  # noqa: BLE001 - never breaks training (re-raised under on_error="raise")
                _failed(exc)

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              *, model: Any = None, processing_class: Any = None, optimizer: Any = None,
                              lr_scheduler: Any = None, train_dataloader: Any = None, eval_dataloader: Any = None,
                              **kwargs: Any) -> None:
        if self._live:
            steps = self.steps
            try:
                if self.micro_batch_role is not None:
                    steps.end_role(self.micro_batch_role)
                if self.optimizer_role is not None:
                    steps.begin_role(self.optimizer_role)
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
