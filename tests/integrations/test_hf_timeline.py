"""One real Hugging Face ``Trainer`` run with ``ProfctxCallback``: the timeline's phases at every step, a slow
phase caught by ``auto_capture``, the phases in a real TensorBoard event file, and losses bit-identical."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

from transformers import TrainerCallback  # noqa: E402

import profctx  # noqa: E402
from profctx.manifest import read  # noqa: E402

from . import hf_models  # noqa: E402

ProfctxCallback = pytest.importorskip("profctx.integrations.transformers").ProfctxCallback

STEPS = 7
SLOW = 5  # the step whose forward passes sleep
SLEEP_S = 1.5  # at least, per micro-batch of the slow step (see Slow)


class Clock(TrainerCallback):  # type: ignore[misc]
    """The Trainer's own step events, read with the timeline's clock: one instance before ProfctxCallback, one after."""

    def __init__(self, stamps: dict[str, list[float]], event: str) -> None:
        self.stamps, self.event = stamps, event

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.event == "begin":
            self.stamps["begin"].append(time.monotonic())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.event == "end":
            self.stamps["end"].append(time.monotonic())


class Slow(TrainerCallback):  # type: ignore[misc]
    """Marks the micro-batches of step SLOW as slow; a forward pre-hook on the model sleeps in them.

    Each of the slow step's two micro-batches sleeps 6x the longest step so far, so the slow step is more
    than 12x every earlier one (and so more than auto_capture's factor 10 over their median) however loaded
    the machine: a fixed sleep was only 4x a normal step at load average 20.
    """

    def __init__(self) -> None:
        self.on = False
        self.began = 0.0
        self.longest = 0.0
        self.slept = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.on = state.global_step + 1 == SLOW
        self.began = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.on:
            self.longest = max(self.longest, time.monotonic() - self.began)
        self.on = False

    def hook(self, module: Any, inputs: Any) -> None:
        if self.on and module.training:
            pause = max(SLEEP_S, 6 * self.longest)
            time.sleep(pause)
            self.slept += pause


def _trainer(out: Path, report_to: list[str], callbacks: list[Any]) -> Any:
    from transformers import Trainer, TrainingArguments

    tok = hf_models.tokenizer()
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                             max_steps=STEPS, learning_rate=1e-2, report_to=report_to, use_cpu=True,
                             save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True)
    return Trainer(model=hf_models.model(len(tok)), args=args, train_dataset=hf_models.lm_rows(2 * 2 * STEPS),
                   callbacks=callbacks)


def _losses(trainer: Any) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("tensorboard")
    root = tmp_path_factory.mktemp("hf-timeline")
    bare = _trainer(root / "bare", [], [])
    bare.train()

    save = root / "profiles"
    stamps: dict[str, list[float]] = {"begin": [], "end": []}
    slow = Slow()
    # The window after the slow step: the anomaly watch judges no step while a capture's files are being written.
    profctx.configure(steps=[STEPS], mode="step", save_path=save, tool="noop", warmup=False, exit_hooks=False,
                      auto_capture={"factor": 10.0, "window": 3, "max_captures": 3, "role": "training_step"})
    try:
        trainer = _trainer(root / "out", ["tensorboard"], [Clock(stamps, "begin"), slow])
        callback = ProfctxCallback.attach(trainer)  # after the Trainer's own callbacks: as users add one
        trainer.add_callback(Clock(stamps, "end"))  # after ours: its end stamp follows our step's end
        handle = trainer.model.register_forward_pre_hook(slow.hook)
        with callback:
            trainer.train()
        handle.remove()
        assert profctx.flush()
    finally:
        profctx.reset()
    lines = [json.loads(line) for path in sorted((save / ".profctx").glob("*.timeline"))
             for line in path.read_text().splitlines()]
    return {"bare": bare, "trainer": trainer, "slept": slow.slept, "save": save, "stamps": stamps, "out": root / "out",
            "steps": [line for line in lines if "step" in line]}


def test_every_step_has_both_phases_in_and_out_of_the_window(run: dict[str, Any]) -> None:
    steps = run["steps"]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    # Two micro-batches (gradient accumulation 2) and one optimizer step in every step, captured or not.
    assert [{name: count for name, (_, count, *_) in s["roles"].items()} for s in steps] == [
        {"training_step": 2, "optimizer_step": 1}] * STEPS


def test_step_times_are_the_trainers_own_step_events(run: dict[str, Any]) -> None:
    stamps, steps = run["stamps"], run["steps"]
    hf = [end - begin for begin, end in zip(stamps["begin"], stamps["end"], strict=True)]
    assert len(hf) == len(steps) == STEPS
    # The Trainer's on_step_begin..on_step_end read with the same clock, by callbacks on either side of ours:
    # our step lies inside theirs (exact: the same clock, nested calls) ...
    assert all(s["time_s"] <= t + 1e-6 for s, t in zip(steps, hf, strict=True))
    # ... and differs from it only by the callbacks' own code between the two (microseconds per step, steps of
    # tens of ms): over the run, half of theirs is a bound no load reaches.
    assert sum(s["time_s"] for s in steps) >= 0.5 * sum(hf)
    for s in steps:  # the roles lie inside the step
        assert sum(spent for spent, *_ in s["roles"].values()) <= s["time_s"]


def test_a_slow_training_step_is_caught_by_auto_capture_through_the_callback(run: dict[str, Any]) -> None:
    records = read(run["save"])
    by_step = {r.steps: r for r in records}
    assert (STEPS,) in by_step  # the window
    caught = by_step.get((SLOW + 1,))
    assert caught is not None, [r.steps for r in records]
    assert caught.trigger is not None
    assert caught.trigger["reason"].startswith(f"role training_step in step {SLOW} took "), caught.trigger
    slow = run["steps"][SLOW - 1]["roles"]["training_step"][0]
    assert slow >= run["slept"]  # the two sleeping micro-batches are in the role


def test_a_tensorboard_event_file_holds_the_phases_of_every_step(run: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(run["out"].rglob("events.out.tfevents.*"))
    assert files, "the Trainer wrote no TensorBoard file"
    scalars: dict[str, dict[int, float]] = {}
    for path in files:
        acc = EventAccumulator(str(path))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for event in acc.Scalars(tag):
                scalars.setdefault(tag, {})[event.step] = event.value
    assert {"train/timing_s/step", "train/timing_s/training_step", "train/timing_s/optimizer_step"} <= set(scalars)
    for s in run["steps"]:  # the timeline's own figures, as float32
        assert scalars["train/timing_s/step"][s["step"]] == pytest.approx(s["time_s"], rel=1e-5, abs=2e-6)
        assert scalars["train/timing_s/training_step"][s["step"]] == pytest.approx(
            s["roles"]["training_step"][0], rel=1e-5, abs=2e-6)
    assert sorted(scalars["train/loss"]) == list(range(1, STEPS + 1))  # the Trainer's own logging is untouched
    history = [h for h in run["trainer"].state.log_history if "timing_s/step" in h]
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))


def test_losses_are_bit_identical_with_and_without_profctx(run: dict[str, Any]) -> None:
    assert _losses(run["trainer"]) == _losses(run["bare"]) and len(_losses(run["bare"])) == STEPS
    assert all(torch.equal(a, b) for a, b in zip(run["trainer"].model.parameters(), run["bare"].model.parameters(),
                                                 strict=True))
