"""One real Lightning ``fit()`` with ``ProfctxProfiler``: the timeline's phases at every step, a slow phase caught
by ``auto_capture``, the phases in the Trainer's logger (a real ``CSVLogger``), and losses bit-identical."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

import profctx  # noqa: E402
from profctx.manifest import read  # noqa: E402

ProfctxProfiler = pytest.importorskip("profctx.integrations.lightning").ProfctxProfiler

STEPS = 7
SLOW = 4  # the global step whose training_step sleeps
SLEEP_S = 1.0  # hundreds of times this model's training step


class Net(L.LightningModule):  # type: ignore[misc]
    def __init__(self, slow: bool = False) -> None:
        super().__init__()
        self.slow = slow
        torch.manual_seed(1)
        self.layer = torch.nn.Linear(4, 1)
        self.losses: list[float] = []

    def training_step(self, batch: Any, index: int) -> Any:
        if self.slow and self.global_step == SLOW:
            time.sleep(SLEEP_S)
        loss = self.layer(batch[0]).pow(2).mean()
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Clock(L.Callback):  # type: ignore[misc]
    """Lightning's own batch events, read with the timeline's clock (they enclose the batch's profiler action)."""

    def __init__(self) -> None:
        self.spans: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        self._start = time.monotonic()

    def on_train_batch_end(self, *args: Any) -> None:
        self.spans.append(time.monotonic() - self._start)


def _fit(root: Path, net: Net, profiler: Any, logger: Any, callbacks: list[Any]) -> Any:
    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2 * STEPS, 4)), batch_size=2)
    trainer = L.Trainer(max_steps=STEPS, profiler=profiler, logger=logger, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        default_root_dir=str(root), log_every_n_steps=1, callbacks=callbacks)
    trainer.fit(net, data)
    return trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from lightning.pytorch.loggers import CSVLogger

    root = tmp_path_factory.mktemp("lightning-timeline")
    bare = Net()
    _fit(root / "bare", bare, None, False, [])
    save = root / "profiles"
    net, clock = Net(slow=True), Clock()
    # The window after the slow step: the anomaly watch judges no step while a capture's files are being written.
    profctx.configure(steps=[STEPS - 1], mode="step", save_path=save, tool="noop", warmup=False, exit_hooks=False,
                      auto_capture={"factor": 10.0, "window": 3, "max_captures": 3, "role": "optimizer_step"})
    try:
        logger = CSVLogger(str(root / "logs"), name="run")
        _fit(root / "fit", net, ProfctxProfiler(summary=False), logger, [clock])
        assert profctx.flush()
    finally:
        profctx.reset()
    lines = [json.loads(line) for path in sorted((save / ".profctx").glob("*.timeline"))
             for line in path.read_text().splitlines()]
    with open(Path(logger.log_dir) / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    return {"bare": bare, "net": net, "save": save, "clock": clock, "rows": rows,
            "steps": [line for line in lines if "step" in line]}


def test_every_step_has_its_phases_in_and_out_of_the_window(run: dict[str, Any]) -> None:
    steps = run["steps"]
    assert [s["step"] for s in steps] == list(range(STEPS))
    # Automatic optimization: the optimizer step runs the training step in its closure, so it is the top-level
    # role, once per step, captured (the window, the anomaly's next step) or not.
    assert all(s["roles"].get("optimizer_step", [0, 0])[1] == 1 for s in steps), steps
    assert len({tuple(s["roles"]) for s in steps}) == 1


def test_step_times_lie_inside_lightnings_batch_events(run: dict[str, Any]) -> None:
    steps, spans = run["steps"], run["clock"].spans
    assert len(spans) == len(steps) == STEPS
    assert all(s["time_s"] <= t + 1e-6 for s, t in zip(steps, spans, strict=True))  # same clock, nested calls
    # And they hold the work inside them: the slow step its sleep (never shorter), a bound no load can break,
    # where the sum of the step times had to be half the batch events' at least.
    assert steps[SLOW]["step"] == SLOW and steps[SLOW]["time_s"] >= SLEEP_S


def test_a_slow_training_step_is_caught_by_auto_capture_through_the_profiler(run: dict[str, Any]) -> None:
    records = read(run["save"])
    caught = {r.steps: r for r in records}.get((SLOW + 1,))
    assert caught is not None and caught.trigger is not None, [r.steps for r in records]
    assert caught.trigger["reason"].startswith(f"role optimizer_step in step {SLOW} took "), caught.trigger


def test_the_loggers_get_the_phases_of_every_step(run: dict[str, Any]) -> None:
    logged = {int(row["step"]): row for row in run["rows"] if row.get("timing_s/step")}
    assert sorted(logged) == list(range(STEPS))
    for s in run["steps"]:
        row = logged[s["step"]]
        assert float(row["timing_s/step"]) == pytest.approx(s["time_s"], abs=2e-6)
        assert float(row["timing_s/optimizer_step"]) == pytest.approx(s["roles"]["optimizer_step"][0], abs=2e-6)


def test_losses_are_bit_identical_with_and_without_profctx(run: dict[str, Any]) -> None:
    assert run["net"].losses == run["bare"].losses and len(run["bare"].losses) == STEPS
