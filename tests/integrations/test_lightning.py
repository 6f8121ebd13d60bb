"""Lightning's ``Trainer.fit``, real, on CPU, with ``ProfctxProfiler``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

import profctx  # noqa: E402
from profctx.analysis import summarize  # noqa: E402
from profctx.testing import capture  # noqa: E402

from .timers import Stamps, check, least_excess, traces  # noqa: E402

ProfctxProfiler = pytest.importorskip("profctx.integrations.lightning").ProfctxProfiler


class Net(L.LightningModule):  # type: ignore[misc]
    """A linear model whose hooks stamp the test's timers and record the scope and step they run in."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.fail_at = fail_at
        self.losses: list[float] = []
        self.seen: list[profctx.Scope] = []
        self.global_steps: list[int] = []
        self.stamp = Stamps()

    def training_step(self, batch: Any, index: int) -> Any:
        self.stamp("training_step")
        if index == self.fail_at:
            raise RuntimeError("bad batch")
        self.global_steps.append(self.global_step)
        with profctx.profile_step(role="loss"):
            self.seen.append(profctx.current())
            loss = self.layer(batch[0]).pow(2).mean()
        self.losses.append(float(loss.detach()))
        self.stamp("training_step_end")
        return loss

    def backward(self, loss: Any, *args: Any, **kwargs: Any) -> None:
        self.stamp("backward")
        super().backward(loss, *args, **kwargs)
        self.stamp("backward_end")

    def optimizer_zero_grad(self, *args: Any, **kwargs: Any) -> None:
        self.stamp("zero_grad")
        super().optimizer_zero_grad(*args, **kwargs)
        self.stamp("zero_grad_end")

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        self.stamp("optimizer_step")
        super().optimizer_step(*args, **kwargs)
        self.stamp("optimizer_step_end")

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Probe(L.Callback):  # type: ignore[misc]
    """Stamps at the callback events around a training batch, inside the backward and before the optimizer steps."""

    def __init__(self, stamp: Stamps) -> None:
        self.stamp = stamp

    def on_train_batch_start(self, *args: Any) -> None:
        self.stamp("batch")

    def on_train_batch_end(self, *args: Any) -> None:
        self.stamp("batch_end")

    def on_before_backward(self, *args: Any) -> None:
        self.stamp("before_backward")

    def on_after_backward(self, *args: Any) -> None:
        self.stamp("after_backward")

    def on_before_optimizer_step(self, *args: Any) -> None:
        self.stamp("before_optimizer_step")


def _fit(tmp_path: Path, net: Net, profiler: Any, batches: int = 8, **kwargs: Any) -> Any:
    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2 * batches, 4)), batch_size=2)
    trainer = L.Trainer(max_steps=4, profiler=profiler, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        default_root_dir=str(tmp_path), **kwargs)
    trainer.fit(net, data)
    return trainer


def _net() -> Net:
    torch.manual_seed(1)
    return Net()


def test_fit_real_traces_hooks_as_ranges_times_agree_with_the_module_timers(tmp_path: Path) -> None:
    bare = _net()
    _fit(tmp_path, bare, None)
    net = _net()
    save = tmp_path / "profiles"
    profctx.configure(steps="1:3", mode="step", save_path=save, exit_hooks=False, warmup=False)
    _fit(tmp_path, net, ProfctxProfiler(), callbacks=[Probe(net.stamp)])
    assert profctx.flush()

    # The steps are the Trainer's global_step, as training_step sees it.
    assert [s.step for s in net.seen] == net.global_steps == [0, 1, 2, 3]
    assert net.seen[1].roles == ("optimizer_step", "training_step", "loss")  # step 1: in the window
    assert net.seen[0].roles == net.seen[1].roles  # out of the window too: the roles are held for the timeline
    assert net.losses == bare.losses and len(bare.losses) == 4
    assert profctx.current() == profctx.Scope()

    figures = traces(save)
    summary = summarize(save)
    assert sorted(figures) == [1, 2]
    excess: dict[str, list[float]] = {"optimizer_step": [], "training_step": [], "backward": []}
    for step, trace in figures.items():
        assert set(trace.roles) == {(step, "optimizer_step")}  # the outermost hook: the rest nest in it
        nested = {name: total / 1e6 for (at, role, name), (_, total, _) in trace.ops.items()
                  if at == step and role == "optimizer_step"}
        assert {"training_step", "loss", "backward", "on_before_optimizer_step"} <= set(nested)
        # Batch `step` ran step `step` (one batch per step): the timers of that batch.
        stamp, batch = net.stamp, step
        phase = summary.phase(step, "optimizer_step")
        assert phase is not None
        excess["optimizer_step"].append(check(
            "optimizer_step", phase.time_s, stamp.span("optimizer_step", "optimizer_step_end", batch),
            stamp.span("batch", "batch_end", batch)))
        excess["training_step"].append(check(
            "training_step", nested["training_step"], stamp.span("training_step", "training_step_end", batch),
            stamp.span("optimizer_step", "zero_grad", batch)))
        excess["backward"].append(check(
            "backward", nested["backward"], stamp.span("before_backward", "after_backward", batch),
            stamp.span("zero_grad_end", "before_optimizer_step", batch)))
        assert stamp.span("backward", "backward_end", batch) <= stamp.span("before_backward", "after_backward", batch)
    for what, values in excess.items():
        least_excess(what, values)


def test_steps_follow_global_step_with_gradient_accumulation_and_the_summary_fit_prints(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bare = _net()
    _fit(tmp_path, bare, None, accumulate_grad_batches=2)
    net = _net()
    profiler = ProfctxProfiler()
    with capture(steps=[3], mode="step") as caps, caplog.at_level(logging.INFO):
        _fit(tmp_path, net, profiler, accumulate_grad_batches=2)

    # Two batches per optimizer step: both are in the step the Trainer counts.
    assert [s.step for s in net.seen] == net.global_steps == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [(c.steps, c.status) for c in caps] == [((3,), "ok")]
    ranges = caps[0].ranges
    assert (ranges.count("training_step"), ranges.count("loss"), ranges.count("optimizer_step")) == (2, 2, 1)
    assert net.seen[6].roles == ("training_step", "loss")  # the batch that only accumulates
    assert net.seen[7].roles == ("optimizer_step", "training_step", "loss")
    assert net.losses == bare.losses and len(bare.losses) == 8
    assert profctx.current() == profctx.Scope()

    text = profiler.summary()
    rows = {line.split()[0]: line.split() for line in text.strip().splitlines()[1:]}
    assert text.strip().splitlines()[1].startswith("step")
    assert (rows["step"][1], rows["training_step"][1], rows["optimizer_step"][1], rows["backward"][1]) == (
        "4", "8", "4", "8")
    assert "profctx: role" in caplog.text  # Lightning printed it at the end of fit()
    assert ProfctxProfiler(summary=False).summary() == ""


def test_fit_role_mode_under_the_role_filter(tmp_path: Path) -> None:
    with capture(steps=[3], mode="role", roles=["backward", "training_step"]) as caps:
        _fit(tmp_path, _net(), ProfctxProfiler(summary=False))
    assert sorted((c.steps, c.role) for c in caps) == [
        ((3,), "optimizer_step/backward"), ((3,), "optimizer_step/training_step")]


def test_a_fit_that_raises_in_a_batch_leaves_nothing_open(tmp_path: Path) -> None:
    with capture(steps="0:4", mode="step") as caps:
        with pytest.raises(RuntimeError, match="bad batch"):
            _fit(tmp_path, Net(fail_at=1), ProfctxProfiler())
        assert profctx.current() == profctx.Scope()
    assert [(c.steps, c.status) for c in caps] == [((0,), "ok"), ((1,), "ok")]


def test_a_fit_that_raises_between_the_batches_of_a_step_is_closed_by_the_with(tmp_path: Path) -> None:
    class Failing(L.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, *args: Any) -> None:
            raise RuntimeError("batch end failed")

    profiler = ProfctxProfiler()
    with capture(steps=[0], mode="step") as caps:
        with pytest.raises(RuntimeError, match="batch end failed"), profiler:
            _fit(tmp_path, _net(), profiler, accumulate_grad_batches=2, callbacks=[Failing()])
        assert profctx.current() == profctx.Scope()
    assert [(c.steps, c.status) for c in caps] == [((0,), "ok")]


def test_bad_sources_are_refused() -> None:
    with pytest.raises(profctx.ConfigError, match="sources"):
        ProfctxProfiler(sources=["Model"])
    with pytest.raises(profctx.ConfigError, match="summary"):
        ProfctxProfiler(summary="yes")  # type: ignore[arg-type]
