"""SGLang specifics: request object vs keywords, explicit defaults, auto-stop, by-stage, merge, auth, 500s."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from profctx import ConfigError, Scope, profile_step
from profctx.engines import SGLangEngineAdapter, SGLangHttpAdapter, SGLangTokenizerAdapter, attach, detach

from .conftest import configure, engine_records
from .doubles import sglang as sg
from .doubles.servers import SGLangServer


def _trace(path: str) -> dict[str, object]:
    with gzip.open(path, "rt") as fh:
        data: dict[str, object] = json.load(fh)
    return data


def test_request_object_from_0515_with_explicit_off_defaults(tmp_path: Path) -> None:
    manager = sg.TokenizerManager_0_5_23()
    configure(tmp_path, engines={"contents": ["cuda", "cpu"]})
    attach(SGLangTokenizerAdapter(manager))
    with profile_step(1), profile_step(role="rollout"):
        manager.scheduler.run_batch(3)
    [req] = manager.requests
    assert isinstance(req, sg.ProfileReq)
    assert req.with_stack is False and req.record_shapes is False  # SGLang would turn both on
    assert req.activities == ["CPU", "GPU"]
    assert req.profile_id == "step000001-rollout-replica0" and req.profile_prefix is None
    folder = tmp_path / "step000001" / "rollout" / "sglang-replica0"
    assert req.output_dir == str(folder)
    [path] = manager.scheduler.files
    assert Path(path) == folder / "step000001-rollout-replica0-TP-0.trace.json.gz"
    assert _trace(path)["batches"] == 3


def test_keywords_before_0515_and_prefix_names_files(tmp_path: Path) -> None:
    manager = sg.TokenizerManager_0_5_12()
    configure(tmp_path, engines={"contents": ["stack"]})
    adapter = SGLangTokenizerAdapter(manager)
    assert adapter.request_type is None
    attach(adapter)
    with profile_step(1), profile_step(role="rollout"):
        pass
    [req] = manager.requests
    assert req.profile_prefix == "step000001-rollout-replica0"
    assert req.with_stack is True and req.record_shapes is False
    assert Path(manager.scheduler.files[0]).name.startswith("step000001-rollout-replica0-")


def test_auto_stop_then_stop_is_a_normal_end(tmp_path: Path) -> None:
    manager = sg.TokenizerManager_0_5_23()
    configure(tmp_path, engines={"count": 2})
    attach(SGLangTokenizerAdapter(manager, version="0.5.23"))
    with profile_step(1), profile_step(role="rollout"):
        manager.scheduler.run_batch(5)  # stops itself at the start of batch 3
        assert not manager.scheduler.in_progress
    [record] = engine_records(tmp_path)
    assert record["status"] == "ok" and record["error"] is None
    assert any("stopped on its own" in n for n in record["notes"])
    assert _trace(manager.scheduler.files[0])["batches"] == 2


def test_auto_stop_then_stop_over_http(tmp_path: Path) -> None:
    server = SGLangServer("0.5.23")
    try:
        configure(tmp_path, engines={"count": 1})
        attach(SGLangHttpAdapter(server.url, version="0.5.23"))
        with profile_step(1), profile_step(role="rollout"):
            server.scheduler.run_batch(3)
        [record] = engine_records(tmp_path)
        assert record["status"] == "ok" and any("stopped on its own" in n for n in record["notes"])
        body = json.loads(next(p for p in server.paths if p[1] == "/start_profile")[2])
        assert body["num_steps"] == 1 and isinstance(body["num_steps"], int)
    finally:
        server.close()


def test_count_is_corrected_for_the_off_by_one_before_0516(tmp_path: Path) -> None:
    manager = sg.TokenizerManager_0_5_12()
    configure(tmp_path, engines={"count": 3})
    attach(SGLangTokenizerAdapter(manager, version="0.5.12"))
    with profile_step(1), profile_step(role="rollout"):
        manager.scheduler.run_batch(6)
    assert manager.requests[0].num_steps == 4
    assert _trace(manager.scheduler.files[0])["batches"] == 3


def test_by_stage_without_count_is_refused_at_configure(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"engines\.by_stage"):
        configure(tmp_path, engines={"by_stage": True})


def test_by_stage_with_count_reaches_the_scheduler_and_never_crashes_it(tmp_path: Path) -> None:
    manager = sg.TokenizerManager_0_5_23()
    configure(tmp_path, engines={"by_stage": True, "count": 2})
    attach(SGLangTokenizerAdapter(manager, version="0.5.23"))
    with profile_step(1), profile_step(role="rollout"):
        manager.scheduler.run_batch(4)
    assert manager.requests[0].profile_by_stage is True and manager.requests[0].num_steps == 2
    assert manager.scheduler.crashed is None
    assert sorted(Path(f).name.split("-TP-0")[1] for f in manager.scheduler.files) == [
        "-DECODE.trace.json.gz", "-EXTEND.trace.json.gz"]


def test_merge_profiles_is_never_combined_with_a_prefix(tmp_path: Path) -> None:
    old = sg.TokenizerManager_0_5_12()
    new = sg.TokenizerManager_0_5_23()
    configure(tmp_path, engines={"merge_profiles": True, "replicas": "all"})
    attach(SGLangTokenizerAdapter(old), SGLangTokenizerAdapter(new, replica=1))
    with profile_step(1), profile_step(role="rollout"):
        pass
    assert old.requests[0].profile_prefix is None and old.requests[0].merge_profiles is True
    assert new.requests[0].profile_prefix is None and new.requests[0].profile_id == "step000001-rollout-replica1"
    assert any(Path(f).name == "merged-step000001-rollout-replica1.trace.json.gz" for f in new.scheduler.files)
    assert any(Path(f).name.startswith("merged-") for f in old.scheduler.files)


def test_relative_delay_is_refused_for_sglang(tmp_path: Path) -> None:
    attach(SGLangTokenizerAdapter(sg.TokenizerManager_0_5_23()))
    with pytest.raises(ConfigError, match=r"engines\.delay.*absolute_start_step"):
        configure(tmp_path, engines={"delay": 3})


def test_absolute_start_step_is_sent_as_start_step(tmp_path: Path) -> None:
    manager = sg.TokenizerManager_0_5_23()
    configure(tmp_path, engines={"absolute_start_step": 4, "count": 2})
    attach(SGLangTokenizerAdapter(manager))
    with profile_step(1), profile_step(role="rollout"):
        manager.scheduler.run_batch(8)
    assert manager.requests[0].start_step == 4
    assert _trace(manager.scheduler.files[0])["batches"] == 2


def test_never_two_starts_even_when_a_block_overlaps(tmp_path: Path) -> None:
    manager = sg.TokenizerManager_0_5_23()
    configure(tmp_path, engines={"roles": ["rollout", "generate"]})
    attach(SGLangTokenizerAdapter(manager))
    with profile_step(1), profile_step(role="rollout"), profile_step(role="generate"):
        pass
    assert manager.scheduler.starts == 1 and manager.scheduler.violations == []


def test_engine_keywords_and_engine_without_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_TORCH_PROFILER_DIR", str(tmp_path / "default"))
    new, old = sg.Engine_0_5_23(), sg.Engine_0_4_9()
    configure(tmp_path, engines={"replicas": "all"})
    attach(SGLangEngineAdapter(new), SGLangEngineAdapter(old, replica=1))
    with profile_step(1), profile_step(role="rollout"):
        pass
    assert new.tokenizer_manager.requests[0].output_dir.endswith("step000001/rollout/sglang-replica0")
    records = {r["replica"]: r for r in engine_records(tmp_path)}
    assert records[0]["status"] == records[1]["status"] == "ok"
    assert any("takes no options" in n for n in records[1]["notes"])
    assert records[1]["folder"] is None and records[1]["files"] == []  # it chose its own folder
    assert records[0]["files"] and all(f["path"].startswith("step000001/rollout/sglang-replica0/")
                                       for f in records[0]["files"])
    assert old.scheduler.files and Path(old.scheduler.files[0]).parent == tmp_path / "default"


def test_bearer_token_and_missing_token(tmp_path: Path) -> None:
    server = SGLangServer("0.5.23", api_key="s3cret")
    try:
        configure(tmp_path, engines={"replicas": "all"})
        attach(SGLangHttpAdapter(server.url, api_key="s3cret"), SGLangHttpAdapter(server.url, replica=1))
        with profile_step(1), profile_step(role="rollout"):
            pass
        records = {r["replica"]: r for r in engine_records(tmp_path)}
        assert records[0]["status"] == "ok"
        assert records[1]["status"] == "failed" and "api_key" in records[1]["error"]
    finally:
        server.close()


def test_a_second_deferred_start_overwrites_the_pending_one(tmp_path: Path) -> None:
    server = SGLangServer("0.5.23")
    try:
        server.scheduler.start(sg.ProfileReq(start_step=100, num_steps=1))  # someone else's deferred session
        configure(tmp_path, engines={"absolute_start_step": 2, "count": 1})
        attach(SGLangHttpAdapter(server.url))
        with profile_step(1), profile_step(role="rollout"):
            server.scheduler.run_batch(3)
        [record] = engine_records(tmp_path)
        assert record["status"] == "ok" and record["files"]
        assert server.scheduler.pending_start is None
    finally:
        server.close()


@pytest.mark.parametrize("kind", ["tm", "http"])
def test_a_deferred_start_that_never_began_is_disarmed_and_recorded(tmp_path: Path, kind: str) -> None:
    server = SGLangServer("0.5.23") if kind == "http" else None
    manager = server.manager if server else sg.TokenizerManager_0_5_23()
    try:
        configure(tmp_path, steps=[1, 2], engines={"absolute_start_step": 50, "count": 2})
        attach(SGLangHttpAdapter(server.url, version="0.5.23") if server else SGLangTokenizerAdapter(manager))
        with profile_step(1), profile_step(role="rollout"):
            manager.scheduler.run_batch(2)  # never reaches batch 50
        [record] = engine_records(tmp_path)
        assert record["status"] == "failed" and "had not begun" in record["error"] and "disarmed" in record["error"]
        assert record["files"] == []
        assert manager.scheduler.pending_start is None and not manager.scheduler.in_progress
        manager.scheduler.run_batch(60)  # past the old start step: nothing starts on its own any more
        assert not manager.scheduler.in_progress
        configure(tmp_path, steps=[2], engines={"count": 1})
        with profile_step(2), profile_step(role="rollout"):
            manager.scheduler.run_batch(2)
        assert [r["status"] for r in engine_records(tmp_path) if r["step"] == 2] == ["ok"]
    finally:
        if server:
            server.close()


def test_absolute_start_step_zero_means_now_and_gets_the_count_correction(tmp_path: Path) -> None:
    manager = sg.TokenizerManager_0_5_12()
    configure(tmp_path, engines={"absolute_start_step": 0, "count": 3})
    attach(SGLangTokenizerAdapter(manager, version="0.5.12"))
    with profile_step(1), profile_step(role="rollout"):
        manager.scheduler.run_batch(6)
    assert manager.requests[0].num_steps == 4 and manager.requests[0].start_step is None
    assert _trace(manager.scheduler.files[0])["batches"] == 3


def test_known_version_refuses_what_it_lacks(tmp_path: Path) -> None:
    configure(tmp_path, engines={"absolute_start_step": 3})
    with pytest.raises(ConfigError, match=r"0\.4\.10"):
        attach(SGLangHttpAdapter("http://127.0.0.1:9", version="0.4.9"))
    attach(SGLangHttpAdapter("http://127.0.0.1:9", version="0.4.10"))
    detach()
    configure(tmp_path, engines={"merge_profiles": True})
    with pytest.raises(ConfigError, match=r"0\.5\.4"):
        attach(SGLangHttpAdapter("http://127.0.0.1:9", version="0.5.3"))
    attach(SGLangHttpAdapter("http://127.0.0.1:9", version="0.5.4"))


def test_request_round_trips_for_remote_engines(tmp_path: Path) -> None:
    from profctx.engines import EngineRequest, plan
    from profctx.engines._base import EngineConfig

    request = plan(Scope(7, ("train", "rollout")), EngineConfig(contents=("cpu",), count=2), str(tmp_path),
                   "sglang", 3)
    assert EngineRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    assert request.folder == f"{tmp_path}/step000007/train/rollout/sglang-replica3"


def test_the_server_version_is_asked_so_old_servers_get_the_count_correction(tmp_path: Path) -> None:
    server = SGLangServer("0.5.12")
    try:
        configure(tmp_path, engines={"count": 3})
        adapter = SGLangHttpAdapter(server.url)  # no version given
        attach(adapter)
        with profile_step(1), profile_step(role="rollout"):
            server.scheduler.run_batch(6)
        assert adapter.version == "0.5.12"
        body = json.loads(next(p for p in server.paths if p[1] == "/start_profile")[2])
        assert body["num_steps"] == 4 and "profile_id" not in body
        assert _trace(server.scheduler.files[0])["batches"] == 3
        [record] = engine_records(tmp_path)
        assert record["version"] == "0.5.12" and record["files"]
    finally:
        server.close()


def test_an_engine_that_runs_on_get_event_loop_starts_from_a_plain_with(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_TORCH_PROFILER_DIR", str(tmp_path / "default"))
    engine = sg.Engine_0_4_9()
    configure(tmp_path)
    attach(SGLangEngineAdapter(engine, version="0.4.9"))
    with profile_step(1), profile_step(role="rollout"):
        assert engine.scheduler.in_progress
    [record] = engine_records(tmp_path)
    assert record["status"] == "ok", record.get("error")
    assert engine.scheduler.files
