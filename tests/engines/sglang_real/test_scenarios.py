"""profctx's SGLang adapter against SGLang's real tokenizer and scheduler profiling code, per wheel.

Each version runs in its own process (``scenarios.py``): the wheel's code is loaded from
``.sglang/<version>`` (see ``.ci/run``). Needs ``msgspec`` next to torch (the real-vLLM
environment has it); skipped without it or without wheels unless ``PROFCTX_REQUIRE_SGLANG=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from profctx.engines.sglang import parse_version

ROOT = Path(os.environ.get("PROFCTX_SGLANG_DIR") or Path(__file__).resolve().parents[3] / ".sglang")
VERSIONS = sorted((p.name for p in ROOT.glob("*") if (p / "sglang/srt/managers/scheduler.py").is_file()),
                  key=parse_version) if ROOT.is_dir() else []
REQUIRED = os.environ.get("PROFCTX_REQUIRE_SGLANG") == "1"

try:
    import msgspec  # noqa: F401
except ImportError:
    if REQUIRED:
        raise
    pytest.skip("msgspec is not installed (the real-vLLM environment has it)", allow_module_level=True)
if not VERSIONS:
    if REQUIRED:
        raise RuntimeError(f"PROFCTX_REQUIRE_SGLANG=1 but no SGLang wheels under {ROOT}")
    pytest.skip(f"no SGLang wheels under {ROOT} (see .ci/run)", allow_module_level=True)


@pytest.fixture(scope="module", params=VERSIONS)
def observed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp(f"sglang-{request.param}")
    script = Path(__file__).with_name("scenarios.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[3]),
                                                                      os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script), str(ROOT / request.param), str(out)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _trace(scenario: dict[str, Any]) -> list[str]:
    [batches] = scenario["traces"].values()
    return list(batches)


def test_count_records_exactly_count_batches_and_lists_the_file(observed: dict[str, Any]) -> None:
    scenario = observed["count"]
    [record] = scenario["records"]
    assert record["status"] == "ok" and [Path(f["path"]).name for f in record["files"]] == list(scenario["traces"])
    # Started after batch 2, count 3: exactly three, before 0.5.16 too (profctx asks for one more there).
    assert _trace(scenario) == ["batch 3", "batch 4", "batch 5"]
    assert not scenario["in_progress"]


def _deferred(observed: dict[str, Any], name: str) -> dict[str, Any]:
    if name not in observed:
        pytest.skip(f"SGLang {observed['version']} has no start_step")
    scenario: dict[str, Any] = observed[name]
    return scenario


def test_absolute_start_step_starts_at_that_batch(observed: dict[str, Any]) -> None:
    scenario = _deferred(observed, "deferred")
    assert [r["status"] for r in scenario["records"]] == ["ok"]
    assert _trace(scenario) == ["batch 5", "batch 6"]


def test_a_deferred_start_that_never_began_is_disarmed(observed: dict[str, Any]) -> None:
    scenario = _deferred(observed, "never_began")
    [record] = scenario["records"]
    assert record["status"] == "failed" and "disarmed" in record["error"] and record["files"] == []
    # 60 more batches ran past the old start step: the real scheduler did not start on its own.
    assert scenario["traces"] == {} and not scenario["in_progress"] and scenario["armed"] is None


def test_start_step_zero_is_now_and_counts_exactly(observed: dict[str, Any]) -> None:
    scenario = observed["zero_is_now"]
    assert [r["status"] for r in scenario["records"]] == ["ok"]
    assert _trace(scenario) == ["batch 5", "batch 6"]  # started after batch 4, count 2


def test_sglang_engine_is_driven_from_a_plain_with(observed: dict[str, Any]) -> None:
    """Engine.start_profile before 0.5.4 runs on get_event_loop(): profctx's helper thread has one."""
    scenario = observed["engine"]
    [record] = scenario["records"]
    assert record["status"] == "ok", record["error"]
    if parse_version(observed["version"]) >= (0, 5, 3):
        assert record["files"] and scenario["default_dir"] == []
    else:  # no options: the engine's own folder, and the record says so
        assert scenario["default_dir"] and any("takes no options" in n for n in record["notes"])


def test_stack_and_shapes_are_off_unless_asked_and_files_are_named_per_version(observed: dict[str, Any]) -> None:
    scenario = observed["count"]
    assert scenario["with_stack"] is False and scenario["record_shapes"] is False  # SGLang turns both on
    [name] = scenario["traces"]
    v = parse_version(observed["version"])
    if v >= (0, 5, 15):  # profile_id names the file
        assert name == "step000001-rollout-replica0-TP-0.trace.json.gz"
    elif v >= (0, 5, 6):  # profile_prefix, then SGLang's time-based id
        assert name.startswith("step000001-rollout-replica0-") and name.endswith("-TP-0.trace.json.gz")
    else:  # nothing names it: a time-based id, in the capture's own folder
        assert name.split("-TP-0")[0].replace(".", "").isdigit()


def test_by_stage_with_count_writes_a_prefill_and_a_decode_trace(observed: dict[str, Any]) -> None:
    scenario = observed["by_stage"]
    [record] = scenario["records"]
    assert record["status"] == "ok", record["error"]
    assert len(scenario["traces"]) == 2 and len(record["files"]) == 2
    prefill, decode = sorted(scenario["traces"].values(), key=lambda b: int(b[0].split()[1]))
    assert prefill == ["batch 1", "batch 2"] and decode == ["batch 5", "batch 6"]


def test_a_pending_deferred_start_is_replaced_by_profctx_start(observed: dict[str, Any]) -> None:
    scenario = _deferred(observed, "overwrite")
    assert [r["status"] for r in scenario["records"]] == ["ok"]  # not refused
    # profctx's own window ran; the foreign start at batch 100 was replaced, so nothing ran there.
    assert _trace(scenario) == ["batch 5", "batch 6"] and scenario["armed"] is None
