"""Lightning's ``Trainer.fit``, real, on CPU, with ``ProfctxProfiler``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

import profctx  # noqa: E402
from profctx.testing import capture  # noqa: E402

ProfctxProfiler = pytest.importorskip("profctx.integrations.lightning").ProfctxProfiler


class Net(L.LightningModule):  # type: ignore[misc]
    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.fail_at = fail_at
        self.losses: list[float] = []
        self.seen: list[profctx.Scope] = []

    def training_step(self, batch: Any, index: int) -> Any:
        if index == self.fail_at:
            raise RuntimeError("bad batch")
        with profctx.profile_step(role="loss"):
            self.seen.append(profctx.current())
            loss = self.layer(batch[0]).pow(2).mean()
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path: Path, net: Net, profiler: Any, **kwargs: Any) -> Any:
    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=2)
    trainer = L.Trainer(max_steps=4, profiler=profiler, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        default_root_dir=str(tmp_path), **kwargs)
    trainer.fit(net, data)
    return trainer


def _net() -> Net:
    torch.manual_seed(1)
    return Net()


def test_fit_step_mode_one_capture_per_step_hooks_as_ranges(tmp_path: Path) -> None:
    bare = _net()
    _fit(tmp_path, bare, None)
    net = _net()
    with capture(steps="2:4", mode="step") as caps:
        _fit(tmp_path, net, ProfctxProfiler())
    assert [(c.steps, c.status) for c in caps] == [((2,), "ok"), ((3,), "ok")]
    for c in caps:
        assert c.ranges[0] == "optimizer_step"
        assert {"training_step", "loss", "backward", "on_before_optimizer_step"} <= set(c.ranges)
    assert net.losses == bare.losses and len(bare.losses) == 4
    assert [s.step for s in net.seen] == [1, 2, 3, 4]
    assert net.seen[1].roles == ("optimizer_step", "training_step", "loss")  # step 2: in the window
    assert net.seen[0].roles == ("loss",)  # out of the window only the step is held
    assert profctx.current() == profctx.Scope()


def test_fit_role_mode_under_the_role_filter(tmp_path: Path) -> None:
    with capture(steps=[3], mode="role", roles=["backward", "training_step"]) as caps:
        _fit(tmp_path, _net(), ProfctxProfiler())
    assert sorted((c.steps, c.role) for c in caps) == [
        ((3,), "optimizer_step/backward"), ((3,), "optimizer_step/training_step")]


def test_the_summary_fit_prints(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    profiler = ProfctxProfiler()
    with caplog.at_level(logging.INFO):
        _fit(tmp_path, _net(), profiler)
    text = profiler.summary()
    assert "step" in text and "training_step" in text and "backward" in text
    rows = {line.split()[0]: line.split() for line in text.strip().splitlines()[1:]}
    assert rows["step"][1] == "4" and rows["training_step"][1] == "4"
    assert "profctx: role" in caplog.text  # Lightning printed it at the end of fit()
    assert ProfctxProfiler(summary=False).summary() == ""


def test_a_fit_that_raises_leaves_nothing_open(tmp_path: Path) -> None:
    with capture(steps="1:4", mode="step") as caps:
        with pytest.raises(RuntimeError, match="bad batch"):
            _fit(tmp_path, Net(fail_at=1), ProfctxProfiler())
        assert profctx.current() == profctx.Scope()
    assert [(c.steps, c.status) for c in caps] == [((1,), "ok"), ((2,), "ok")]


def test_bad_sources_are_refused() -> None:
    with pytest.raises(profctx.ConfigError, match="sources"):
        ProfctxProfiler(sources=["Model"])
