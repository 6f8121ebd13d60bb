"""The Hugging Face ``Trainer`` and TRL's ``GRPOTrainer``, real, on CPU, with ``ProfctxCallback``."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it
torch = pytest.importorskip("torch")

from transformers import TrainerCallback  # noqa: E402

import profctx  # noqa: E402
from profctx.analysis import summarize  # noqa: E402
from profctx.testing import Captured, capture  # noqa: E402

from . import hf_models  # noqa: E402
from .timers import Stamps, check, least_excess, traces  # noqa: E402

ProfctxCallback = pytest.importorskip("profctx.integrations.transformers").ProfctxCallback


def _trainer(tmp_path: Path, callbacks: list[Any]) -> Any:
    from transformers import Trainer, TrainingArguments

    tok = hf_models.tokenizer()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, max_steps=4, learning_rate=1e-2, report_to=[],
                             use_cpu=True, save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True)
    return Trainer(model=hf_models.model(len(tok)), args=args, train_dataset=hf_models.lm_rows(16),
                   callbacks=callbacks)


def _losses(trainer: Any) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _params(trainer: Any) -> list[Any]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_trainer_with_gradient_accumulation_step_mode(tmp_path: Path) -> None:
    bare = _trainer(tmp_path, [])
    bare.train()
    callback = ProfctxCallback()
    with capture(steps="2:4", mode="step") as caps:
        profiled = _trainer(tmp_path, [callback])
        with callback:
            profiled.train()
    assert [(c.steps, c.status, c.markers, c.ranges) for c in caps] == [
        ((step,), "ok", [f"ProfilerStep#{step}"], ["training_step", "training_step", "optimizer_step"])
        for step in (2, 3)]
    assert _losses(profiled) == _losses(bare) and len(_losses(bare)) == 4
    assert all(torch.equal(a, b) for a, b in zip(_params(profiled), _params(bare), strict=True))
    assert profctx.current() == profctx.Scope()


def test_trainer_role_mode_one_capture_per_micro_batch_and_optimizer_step(tmp_path: Path) -> None:
    with capture(steps=[3], mode="role") as caps:
        _trainer(tmp_path, [ProfctxCallback()]).train()
    assert [(c.steps, c.role) for c in caps] == [
        ((3,), "training_step"), ((3,), "training_step"), ((3,), "optimizer_step")]


def test_the_step_is_the_one_the_trainer_logs(tmp_path: Path) -> None:
    seen: list[tuple[int | None, tuple[str, ...], int]] = []

    class Probe(TrainerCallback):  # type: ignore[misc]
        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:  # after ours
            scope = profctx.current()
            seen.append((scope.step, scope.roles, state.global_step + 1))

    with capture(steps="2:4"):
        _trainer(tmp_path, [ProfctxCallback(), Probe()]).train()
    # Out of the window (steps 1 and 4) the roles are held too, for the timeline.
    assert seen == [(step, ("optimizer_step",), step) for step in (1, 2, 3, 4)]
    assert profctx.current() == profctx.Scope()


def test_bad_role_names_are_refused() -> None:
    with pytest.raises(profctx.ConfigError, match="optimizer_role"):
        ProfctxCallback(optimizer_role="")
    with pytest.raises(profctx.ConfigError, match="micro_batch_role"):
        ProfctxCallback(micro_batch_role=3)  # type: ignore[arg-type]


# -- TRL -----------------------------------------------------------------------------------------


def _grpo(tmp_path: Path, callbacks: list[Any], reward: Callable[..., list[float]], steps: int = 6) -> Any:
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = hf_models.tokenizer()
    data = Dataset.from_dict({"prompt": ["the cat sat on", "a dog ran", "the big red sun", "a blue mat"] * 4})
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=6, max_steps=steps, learning_rate=1e-2, report_to=[], use_cpu=True,
                      logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True)
    return GRPOTrainer(model=hf_models.model(len(tok)), reward_funcs=reward, args=args, train_dataset=data,
                       processing_class=tok, callbacks=callbacks)


@profctx.profiled
def toy_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """Longer completions score higher (TRL names this phase after the function: ``toy_reward``)."""
    return [float(len(c)) for c in completions]


def _grpo_logs(trainer: Any) -> list[tuple[Any, ...]]:
    return [(h["loss"], h["grad_norm"], h["reward"]) for h in trainer.state.log_history if "loss" in h]


class StepProbe(TrainerCallback):  # type: ignore[misc]
    """Stamps at the Trainer's step events; one is registered before ``ProfctxCallback`` and one after it."""

    def __init__(self, stamp: Stamps, side: str) -> None:
        self.stamp = stamp
        self.side = side

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stamp(f"step_begin_{self.side}")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stamp(f"pre_optimizer_step_{self.side}")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stamp(f"optimizer_step_{self.side}")


#: The reward's own time, known in advance: at least this (it sleeps).
REWARD_S = 0.005


def timed_reward(stamp: Stamps) -> Callable[..., list[float]]:
    """``toy_reward`` that sleeps ``REWARD_S``, timed inside its ``@profiled`` range and around it."""

    @profctx.profiled(role="toy_reward")  # the default is the qualified name (timed_reward.<locals>.toy_reward)
    def toy_reward(completions: list[str], **kwargs: Any) -> list[float]:
        stamp("reward")
        time.sleep(REWARD_S)
        scores = [float(len(c)) for c in completions]
        stamp("reward_end")
        return scores

    @functools.wraps(toy_reward)
    def around(*args: Any, **kwargs: Any) -> list[float]:
        stamp("around_reward")
        try:
            return toy_reward(*args, **kwargs)
        finally:
            stamp("around_reward_end")

    return around


def test_grpo_real_traces_and_role_mode_match_an_unprofiled_run_times_agree_with_the_test_timers(
        tmp_path: Path) -> None:
    bare = _grpo(tmp_path, [], toy_reward)
    bare.train()
    stamp = Stamps()
    save = tmp_path / "profiles"
    profctx.configure(steps="2:5", mode="step", save_path=save, exit_hooks=False, warmup=False)
    probes = [StepProbe(stamp, "before"), ProfctxCallback(), StepProbe(stamp, "after")]
    stepped = _grpo(tmp_path, probes, timed_reward(stamp))
    stepped.train()
    assert profctx.flush()
    profctx.reset()
    with capture(steps="2:5", mode="role") as role_caps:
        roles = _grpo(tmp_path, [ProfctxCallback()], toy_reward)
        roles.train()

    assert len(_grpo_logs(bare)) == 6
    assert _grpo_logs(stepped) == _grpo_logs(bare) == _grpo_logs(roles)
    assert all(torch.equal(a, b) for a, b in zip(_params(stepped), _params(bare), strict=True))
    assert sorted((c.steps, c.role) for c in role_caps) == sorted(
        ((s,), role) for s in (2, 3, 4) for role in ("training_step", "optimizer_step"))
    for c in role_caps:
        assert c.ranges == (["toy_reward"] if c.role == "training_step" else [])

    # Step mode, from the real traces: one capture per step, the callback's roles, the reward inside
    # training_step; each range agrees with the timers the Probes and the reward took (index: step - 1).
    figures = traces(save)
    summary = summarize(save)
    assert sorted(figures) == [2, 3, 4]
    excess: dict[str, list[float]] = {"training_step": [], "optimizer_step": [], "toy_reward": []}
    for step, trace in figures.items():
        assert set(trace.roles) == {(step, "training_step"), (step, "optimizer_step")}
        reward = trace.ops[(step, "training_step", "toy_reward")]
        assert reward[2] == 1 and reward[1] / 1e6 >= REWARD_S
        at = step - 1
        training, optimizer = summary.phase(step, "training_step"), summary.phase(step, "optimizer_step")
        assert training is not None and optimizer is not None
        excess["training_step"].append(check(
            "training_step", training.time_s, stamp.span("step_begin_after", "pre_optimizer_step_before", at),
            stamp.span("step_begin_before", "pre_optimizer_step_after", at)))
        excess["optimizer_step"].append(check(
            "optimizer_step", optimizer.time_s, stamp.span("pre_optimizer_step_after", "optimizer_step_before", at),
            stamp.span("pre_optimizer_step_before", "optimizer_step_after", at)))
        excess["toy_reward"].append(check(
            "toy_reward", reward[1] / 1e6, stamp.span("reward", "reward_end", at),
            stamp.span("around_reward", "around_reward_end", at)))
    for what, values in excess.items():
        least_excess(what, values)


def test_grpo_the_reward_phase_alone_in_role_mode(tmp_path: Path) -> None:
    with capture(steps=[2, 4], mode="role", roles=["toy_reward"]) as caps:
        _grpo(tmp_path, [ProfctxCallback()], toy_reward, steps=4).train()
    assert [(c.steps, c.role) for c in caps] == [((2,), "training_step/toy_reward"), ((4,), "training_step/toy_reward")]


def test_grpo_a_run_that_raises_mid_step_leaves_nothing_open(tmp_path: Path) -> None:
    calls = []

    def failing_reward(completions: list[str], **kwargs: Any) -> list[float]:
        calls.append(profctx.current().step)
        if len(calls) == 2:
            raise RuntimeError("reward server down")
        return [0.0] * len(completions)

    @profctx.profiled(role="later")
    def later() -> int | None:
        return profctx.current().step

    callback = ProfctxCallback()
    with capture(steps="1:4", mode="step") as caps:
        trainer = _grpo(tmp_path, [callback], failing_reward, steps=4)
        with pytest.raises(RuntimeError, match="reward server down"), callback:
            trainer.train()
        assert profctx.current() == profctx.Scope()
        assert later() is None
    assert calls == [1, 2]
    assert [(c.steps, c.status) for c in caps] == [((1,), "ok"), ((2,), "ok")]


def test_grpo_without_the_with_the_next_train_closes_the_dead_step(tmp_path: Path) -> None:
    def failing_reward(completions: list[str], **kwargs: Any) -> list[float]:
        raise RuntimeError("boom")

    callback = ProfctxCallback()
    trainer = _grpo(tmp_path, [callback], failing_reward, steps=2)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert profctx.current().step == 1  # the stated limit: no Trainer event on an exception
    callback.on_train_begin(trainer.args, trainer.state, trainer.control)
    assert profctx.current() == profctx.Scope()


def _names(caps: list[Captured]) -> list[str | None]:
    return [c.role for c in caps]


@pytest.mark.slow
def test_a_two_process_torchrun_job_captures_each_rank_at_the_same_steps(tmp_path: Path) -> None:
    import subprocess
    import sys

    from profctx import manifest

    job = Path(__file__).with_name("hf_torchrun_job.py")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(job), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = manifest.read(tmp_path)
    assert sorted((r.rank, r.steps, r.status, r.world_size) for r in records) == [
        (rank, (step,), "ok", 2) for rank in (0, 1) for step in (2, 3)]
    assert len({r.run for r in records}) == 1  # one run id for the job (torchrun's)
