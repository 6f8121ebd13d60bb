"""vLLM specifics: capability detection, prefixes, iteration bounds, launch settings, 404/409, slow stops."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path

import pytest

import profctx
from profctx import ConfigError, ProfilingError, Scope, profile_step
from profctx.engines import VLLMAdapter, VLLMAsyncAdapter, VLLMCapabilities, VLLMHttpAdapter, attach, launch_settings
from profctx.engines.vllm import profile_prefix

from .conftest import configure, engine_records, run
from .doubles import vllm as vd
from .doubles.servers import HangingServer, VLLMServer, gated


@pytest.mark.parametrize(
    ("version", "expected"),
    [("0.10", (False, False, False)), ("0.17", (True, False, False)), ("0.32", (True, True, False)),
     ("0.33", (True, True, True))],
)
def test_capabilities_come_from_the_installed_signature(version: str, expected: tuple[bool, ...]) -> None:
    caps = VLLMCapabilities.from_signature(vd.ASYNC[version]().start_profile)
    assert (caps.prefix, caps.iterations, caps.profiler_kwargs) == expected
    assert VLLMCapabilities.from_version(vd.ASYNC[version].version) == VLLMCapabilities.from_signature(
        vd.ASYNC[version]().start_profile, vd.ASYNC[version].version)


def test_prefix_carries_step_and_role_in_vllm_charset(tmp_path: Path) -> None:
    engine = vd.AsyncLLM_0_33(str(tmp_path / "vllm"))
    configure(tmp_path, engines={"roles": ["roll*"]})
    attach(VLLMAsyncAdapter(engine, trace_dir=str(tmp_path / "vllm")))
    with profile_step(1), profile_step(role="train"), profile_step(role="roll out:gen"):
        pass
    prefix = engine.start_calls[0]["profile_prefix"]
    assert vd.PREFIX_RE.fullmatch(prefix)
    assert prefix.startswith("step000001-train.roll-out-gen-replica0")
    [path] = engine.files
    assert Path(path).name.startswith(prefix + "_dp0_pp0_tp0_dcp0_ep0_rank0.")
    [record] = engine_records(tmp_path)
    assert record["folder"] == str(tmp_path / "vllm")
    assert record["version"] == "0.33+ (from the start_profile signature)"
    assert any("fixed at its launch" in n for n in record["notes"])


def test_profile_prefix_sanitises_anything() -> None:
    for raw in ("", "/a b", "___", "é" * 300, "x" * 200):
        assert vd.PREFIX_RE.fullmatch(profile_prefix(raw))


def test_delay_and_count_map_to_iterations_and_bound_the_trace(tmp_path: Path) -> None:
    engine = vd.LLM_0_32(str(tmp_path / "t"))
    configure(tmp_path, engines={"delay": 2, "count": 3})
    attach(VLLMAdapter(engine))
    with profile_step(1), profile_step(role="rollout"):
        engine.execute_model(10)
    call = engine.start_calls[0]
    assert (call["delay_iterations"], call["max_iterations"]) == (3, 3)  # skip 2 steps, then record 3
    with gzip.open(engine.files[0], "rt") as fh:
        assert json.load(fh)["iterations"] == 3
    assert [r["status"] for r in engine_records(tmp_path)] == ["ok"]


def test_contents_go_as_profiler_kwargs_on_033_and_as_a_note_before(tmp_path: Path) -> None:
    new, old = vd.LLM_0_33(str(tmp_path / "a")), vd.LLM_0_17(str(tmp_path / "b"))
    configure(tmp_path, engines={"contents": ["shapes"], "replicas": "all"})
    attach(VLLMAdapter(new), VLLMAdapter(old, replica=1))
    with profile_step(1), profile_step(role="rollout"):
        pass
    assert new.start_calls[0]["profiler_kwargs"] == {"record_shapes": True, "with_stack": False,
                                                     "profile_memory": False}
    notes = {r["replica"]: " ".join(r["notes"]) for r in engine_records(tmp_path)}
    assert "launch settings" in notes[1]
    assert "first session" in notes[1]  # 0.17 keeps the first prefix


def test_not_enabled_is_a_clear_error_and_training_continues(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    configure(tmp_path)
    attach(VLLMAsyncAdapter(vd.AsyncLLM_0_33(None)))
    ran = []
    for _ in range(2):
        with profile_step(1), profile_step(role="rollout"):
            ran.append(True)
    assert ran == [True, True]
    records = engine_records(tmp_path)
    assert [r["status"] for r in records] == ["failed", "failed"]
    assert "launched without profiling" in records[0]["error"] and "--profiler-config" in records[0]["error"]
    assert sum("launched without profiling" in m for m in caplog.messages) == 1  # logged once


def test_http_404_means_launched_without_profiling(tmp_path: Path) -> None:
    server = VLLMServer("0.33", None, enabled=False)
    try:
        configure(tmp_path)
        attach(VLLMHttpAdapter(server.url))
        with profile_step(1), profile_step(role="rollout"):
            pass
        [record] = engine_records(tmp_path)
        assert record["status"] == "failed"
        assert "404" in record["error"] and "VLLM_TORCH_PROFILER_DIR" in record["error"]
    finally:
        server.close()


def test_on_error_raise_raises(tmp_path: Path) -> None:
    configure(tmp_path, on_error="raise")
    attach(VLLMAsyncAdapter(vd.AsyncLLM_0_33(None)))
    with pytest.raises(ProfilingError, match="launched without profiling"), profile_step(1), \
            profile_step(role="rollout"):
        pass


def test_http_body_only_from_032_with_real_ints(tmp_path: Path) -> None:
    old, new = VLLMServer("0.17", str(tmp_path / "a")), VLLMServer("0.32", str(tmp_path / "b"))
    try:
        configure(tmp_path, engines={"count": 4, "replicas": "all"})
        attach(VLLMHttpAdapter(old.url), VLLMHttpAdapter(new.url, replica=1))
        with profile_step(1), profile_step(role="rollout"):
            pass
        old_start = next(p for p in old.paths if p[1] == "/start_profile")
        new_start = next(p for p in new.paths if p[1] == "/start_profile")
        assert old_start[2] == b""
        body = json.loads(new_start[2])
        assert body == {"profile_prefix": "step000001-rollout-replica1", "max_iterations": 4}
        assert new.engine.start_calls[0]["max_iterations"] == 4
        assert [r["version"] for r in sorted(engine_records(tmp_path), key=lambda r: r["replica"])] == [
            "0.17.0", "0.32.0"]
    finally:
        old.close()
        new.close()


def test_409_is_recorded_as_skipped_and_the_foreign_session_is_left_alone(tmp_path: Path) -> None:
    server = VLLMServer("0.33", str(tmp_path / "t"))
    try:
        server.engine.start_profile("someone-else")
        configure(tmp_path)
        attach(VLLMHttpAdapter(server.url))
        with profile_step(1), profile_step(role="rollout"):
            pass
        [record] = engine_records(tmp_path)
        assert record["status"] == "skipped" and "409" in record["reason"]
        assert server.engine.stop_calls == 0 and server.engine.session_active
    finally:
        server.close()


def test_slow_stop_is_waited_for(tmp_path: Path) -> None:
    # The stop outlasts start_timeout, and is waited for: stop has its own, generous limit. The start
    # must still answer within start_timeout, which a loaded machine made miss at 0.5 s: 3 s is
    # generous for a local HTTP call, and the stop lasts half a second more.
    server = VLLMServer("0.33", str(tmp_path / "t"), stop_delay=3.5)
    try:
        configure(tmp_path, engines={"start_timeout": 3.0})
        attach(VLLMHttpAdapter(server.url))
        with profile_step(1), profile_step(role="rollout"):
            pass
        [record] = engine_records(tmp_path)
        assert record["status"] == "ok"
        assert len(server.engine.files) == 1
    finally:
        server.close()


def test_a_stop_that_never_answers_is_bounded_by_stop_timeout(tmp_path: Path) -> None:
    server = HangingServer()
    try:
        configure(tmp_path, engines={"stop_timeout": 0.5})
        attach(VLLMHttpAdapter(server.url, version="0.33.0"))
        with profile_step(1), profile_step(role="rollout"):
            pass
        # The block ended while the stop was still unanswered: stop_timeout bounded it, not the
        # server (which answers only when closed). No wall-clock margin, so load cannot flip it.
        assert server.answered == 0
        [record] = engine_records(tmp_path)
        assert record["status"] == "failed" and "stop_timeout" in record["error"]
    finally:
        server.close()


def test_sync_with_in_the_engines_own_loop_is_refused_not_deadlocked(tmp_path: Path) -> None:
    configure(tmp_path)

    async def main() -> None:
        engine = vd.AsyncLLM_0_33(str(tmp_path / "t"))
        attach(VLLMAsyncAdapter(engine))  # binds the running loop
        with profile_step(1), profile_step(role="rollout"):
            pass
        assert engine.start_calls == []
        async with profile_step(1), profile_step(role="rollout"):
            assert engine.session_active

    run(main())
    statuses = [r["status"] for r in engine_records(tmp_path)]
    assert statuses == ["failed", "ok"]
    assert "async with" in engine_records(tmp_path)[0]["error"]


def test_engine_in_another_loop_is_called_there(tmp_path: Path) -> None:
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    engine = vd.AsyncLLM_0_33(str(tmp_path / "t"))
    seen: list[object] = []
    original = engine.start_profile

    async def spy(*args: object, **kwargs: object) -> None:
        seen.append(asyncio.get_running_loop())
        await original(*args, **kwargs)  # type: ignore[arg-type]

    engine.start_profile = spy  # type: ignore[method-assign]
    try:
        configure(tmp_path)
        adapter = VLLMAsyncAdapter(engine, loop=loop, version="0.33.0")
        attach(adapter)
        run(_enter())
        assert seen == [loop] and engine.stop_calls == 1
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(2)


async def _enter() -> None:
    async with profile_step(1), profile_step(role="rollout"):
        pass


@pytest.mark.parametrize(
    ("version", "args", "env"),
    [("0.10.2", False, True), ("0.12.0", False, True), ("0.13.0", True, True), ("0.15.1", True, True),
     ("0.16.0", True, False), ("0.32.0", True, False), ("0.33.0", True, False)],
)
def test_launch_settings_per_version(tmp_path: Path, version: str, args: bool, env: bool) -> None:
    config = profctx.ProfilerConfig(steps=[1], save_path=str(tmp_path), tool="noop",
                                    engines={"contents": ["stack", "cuda"]})
    settings = launch_settings(config, version=version, replica=2)
    assert settings.trace_dir == f"{tmp_path}/engines/vllm-replica2"
    assert bool(settings.args) is args
    assert bool(settings.env) is env
    if args:
        assert settings.args[0] == "--profiler-config"
        parsed = json.loads(settings.args[1])
        assert parsed["profiler"] == "torch" and parsed["torch_profiler_dir"] == settings.trace_dir
        assert parsed["torch_profiler_with_stack"] is True and parsed["torch_profiler_record_shapes"] is False
        assert parsed == settings.profiler_config
        assert parsed.get("torch_profiler_activities") == (["CUDA"] if version >= "0.32" else None)
        assert parsed["ignore_frontend"] is True  # never a second torch profiler in the AsyncLLM process
    if env:
        assert settings.env["VLLM_TORCH_PROFILER_DIR"] == settings.trace_dir
        assert settings.env["VLLM_TORCH_PROFILER_WITH_STACK"] == "1"
        assert settings.env["VLLM_TORCH_PROFILER_RECORD_SHAPES"] == "0"
        assert ("VLLM_TORCH_PROFILER_DISABLE_ASYNC_LLM" in settings.env) is (version >= "0.12")


def test_vllm_0100_reads_only_the_folder_variable(tmp_path: Path) -> None:
    config = profctx.ProfilerConfig(steps=[1], save_path=str(tmp_path), tool="noop", engines={"contents": ["shapes"]})
    settings = launch_settings(config, version="0.10.0")
    assert set(settings.env) == {"VLLM_TORCH_PROFILER_DIR"}
    assert any("reads only VLLM_TORCH_PROFILER_DIR" in n for n in settings.notes)
    assert "VLLM_TORCH_PROFILER_RECORD_SHAPES" in launch_settings(config, version="0.10.1").env


def test_a_start_that_times_out_is_stopped_when_it_answers(tmp_path: Path) -> None:
    from profctx.engines._loop import run_sync

    server = VLLMServer("0.33", str(tmp_path / "t"))
    released = threading.Event()  # the engine's start answers when the test says, long after start_timeout
    server.engine.start_profile = gated(released, server.engine.start_profile)  # type: ignore[method-assign]
    try:
        configure(tmp_path, engines={"start_timeout": 0.2})
        adapter = VLLMHttpAdapter(server.url, version="0.33.0")
        attach(adapter)
        with profile_step(1), profile_step(role="rollout"):
            pass
        assert adapter.settling  # the start is still on its way to the engine
        released.set()
        run_sync(lambda: adapter.settle(60))
        [record] = engine_records(tmp_path)
        assert record["status"] == "failed" and "profctx stopped the engine" in record["error"]
        assert server.engine.stop_calls == 1 and not server.engine.session_active
    finally:
        server.close()


def test_launch_settings_carry_iteration_bounds(tmp_path: Path) -> None:
    config = profctx.ProfilerConfig(steps=[1], save_path=str(tmp_path), tool="noop",
                                    engines={"delay": 1, "count": 5})
    modern = launch_settings(config, version="0.33.0").profiler_config
    assert modern is not None
    assert (modern["delay_iterations"], modern["max_iterations"], modern["ignore_frontend"]) == (2, 5, True)
    legacy = launch_settings(config, version="0.12.0").env
    assert (legacy["VLLM_PROFILER_DELAY_ITERS"], legacy["VLLM_PROFILER_MAX_ITERS"]) == ("2", "5")
    with pytest.raises(ConfigError, match=r"engines\.delay/count.*0\.12"):
        launch_settings(config, version="0.10.2")


def test_sglang_only_options_are_refused_for_vllm_at_configure(tmp_path: Path) -> None:
    attach(VLLMAsyncAdapter(vd.AsyncLLM_0_33(str(tmp_path))))
    with pytest.raises(ConfigError, match=r"engines\.merge_profiles.*SGLang-only"):
        configure(tmp_path, engines={"merge_profiles": True})
    with pytest.raises(ConfigError, match=r"engines\.absolute_start_step"):
        configure(tmp_path, engines={"absolute_start_step": 5})


def test_known_old_version_refuses_bounds_at_attach(tmp_path: Path) -> None:
    configure(tmp_path, engines={"count": 3})
    with pytest.raises(ConfigError, match=r"0\.12"):
        attach(VLLMAdapter(vd.LLM_0_10(str(tmp_path)), version="0.10.2"))


def test_unknown_remote_version_sends_no_body_and_says_so(tmp_path: Path) -> None:
    server = HangingServer()  # answers /version with an empty 200
    server.release.set()
    try:
        configure(tmp_path, engines={"count": 2})
        adapter = VLLMHttpAdapter(server.url)
        assert adapter.start_sync(Scope(1, ("rollout",))) is True
        adapter.stop_sync()
        start = next(p for p in server.paths if p[1] == "/start_profile")
        assert start[2] == b""
        [record] = engine_records(tmp_path)
        assert any("version is unknown" in n for n in record["notes"])
    finally:
        server.close()
