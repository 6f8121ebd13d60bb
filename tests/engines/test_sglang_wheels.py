"""profctx's SGLang facts and doubles checked against the released wheels' source.

The wheels are installed with ``pip install --no-deps --target .sglang/<version> sglang==<version>``
(``.ci/run`` does it; ``PROFCTX_SGLANG_DIR`` points elsewhere). Their modules are read with
``ast``, not imported: importing them needs SGLang's whole dependency tree and CUDA add-ons. So
this checks signatures, request fields and the lines that decide the behaviour profctx corrects
for, per version; the scheduler itself is not executed here (see docs/engines.md).
Without wheels the module skips, unless ``PROFCTX_REQUIRE_SGLANG=1`` (set by ``.ci/run``).
"""

from __future__ import annotations

import ast
import gzip
import inspect
import json
import os
import re
from functools import cache
from pathlib import Path

import pytest

from profctx.engines.sglang import ENGINE_KWARGS_SINCE, fields_for_version, parse_version

from .doubles import sglang as sg

ROOT = Path(os.environ.get("PROFCTX_SGLANG_DIR") or Path(__file__).resolve().parents[2] / ".sglang")
VERSIONS = sorted((p.name for p in ROOT.glob("*") if (p / "sglang" / "srt").is_dir()), key=parse_version) \
    if ROOT.is_dir() else []

if not VERSIONS:
    if os.environ.get("PROFCTX_REQUIRE_SGLANG") == "1":
        raise RuntimeError(f"PROFCTX_REQUIRE_SGLANG=1 but no SGLang wheels under {ROOT}")
    pytest.skip(f"no SGLang wheels under {ROOT} (see .ci/run)", allow_module_level=True)


def _source(version: str, relative: str) -> str:
    return (ROOT / version / "sglang" / relative).read_text()


@cache
def _tree(version: str, relative: str) -> ast.Module:
    return ast.parse(_source(version, relative))


def _class(version: str, relative: str, name: str) -> ast.ClassDef:
    for node in ast.walk(_tree(version, relative)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"{name} not in {relative} of {version}")


def _fields(cls: ast.ClassDef) -> list[str]:
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def _method(version: str, candidates: tuple[str, ...], cls_names: tuple[str, ...],
            name: str) -> ast.AsyncFunctionDef | ast.FunctionDef:
    for relative in candidates:
        if not (ROOT / version / "sglang" / relative).exists():
            continue
        for node in ast.walk(_tree(version, relative)):
            if isinstance(node, ast.ClassDef) and node.name in cls_names:
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                        return item
    raise LookupError(f"{name} of {cls_names} not found in {version}")


_TOKENIZER = ("srt/managers/tokenizer_control_mixin.py", "srt/managers/tokenizer_communicator_mixin.py",
              "srt/managers/tokenizer_manager.py")
_TOKENIZER_CLASSES = ("TokenizerControlMixin", "TokenizerCommunicatorMixin", "TokenizerManager")


def _tokenizer_start(version: str) -> ast.AsyncFunctionDef | ast.FunctionDef:
    return _method(version, _TOKENIZER, _TOKENIZER_CLASSES, "start_profile")


def _params(func: ast.AsyncFunctionDef | ast.FunctionDef) -> list[str]:
    return [a.arg for a in (*func.args.args, *func.args.kwonlyargs) if a.arg != "self"]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_fields_profctx_sends_are_those_the_version_accepts(version: str) -> None:
    io = "srt/managers/io_struct.py"
    if parse_version(version) >= (0, 5, 15):  # the HTTP body and the Python call both build a ProfileReq
        real = set(_fields(_class(version, io, "ProfileReq"))) - {"req_type", "type", "rid", "http_worker_ipc"}
    else:
        real = set(_fields(_class(version, io, "ProfileReqInput")))
        assert set(_params(_tokenizer_start(version))) >= real  # the in-process call takes them as keywords
    assert fields_for_version(version) == real


@pytest.mark.parametrize("version", VERSIONS)
def test_the_doubles_take_what_the_real_tokenizer_manager_takes(version: str) -> None:
    real = _params(_tokenizer_start(version))
    v = parse_version(version)
    if v >= (0, 5, 15):
        assert real == ["req"]
        double = list(inspect.signature(sg.TokenizerManager_0_5_23.start_profile).parameters)[1:]
        assert double == ["req"]
        if version == "0.5.23":  # the version the double's ProfileReq mirrors
            real_fields = set(_fields(_class(version, "srt/managers/io_struct.py", "ProfileReq")))
            assert set(sg.ProfileReq.__struct_fields__) <= real_fields | {"rid", "http_worker_ipc"}
    elif version == "0.5.12":
        double = list(inspect.signature(sg.TokenizerManager_0_5_12.start_profile).parameters)[1:]
        assert double == real


@pytest.mark.parametrize("version", VERSIONS)
def test_engine_start_profile_takes_keywords_from_053_and_used_get_event_loop_before(version: str) -> None:
    func = _method(version, ("srt/entrypoints/engine.py",), ("Engine",), "start_profile")
    takes_kwargs = func.args.kwarg is not None
    assert takes_kwargs is (parse_version(version) >= ENGINE_KWARGS_SINCE)
    body = ast.unparse(func)
    if "get_event_loop()" in body:  # the pre-0.5.4 form the double Engine_0_4_9 mirrors
        assert "get_event_loop" in inspect.getsource(sg.Engine_0_4_9.start_profile)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_server_answers_get_server_info_with_its_version(version: str) -> None:
    source = _source(version, "srt/entrypoints/http_server.py")
    assert '@app.get("/get_server_info")' in source
    # Newer servers answer it through server_info(); the version is in the answer either way.
    assert re.search(r'"version": (__version__|get_version\(\))', source)


def _scheduler_profile_source(version: str) -> str:
    for relative in ("srt/managers/scheduler_components/profiler_manager.py",
                     "srt/managers/scheduler_profiler_mixin.py", "srt/managers/scheduler.py"):
        path = ROOT / version / "sglang" / relative
        if path.exists() and "profiler_target_forward_ct" in path.read_text():
            return path.read_text()
    raise LookupError(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_immediate_batch_count_matches_profctx_correction(version: str, tmp_path: Path) -> None:
    """Before 0.5.16 an immediate start records num_steps - 1 batches; profctx sends one more."""
    source = _scheduler_profile_source(version)
    plus_one = re.search(r"profiler_target_forward_ct = self\.(get_forward_ct\(\)|forward_ct) \+ num_steps \+ 1",
                         source) is not None
    assert plus_one is (parse_version(version) >= (0, 5, 16))
    scheduler = sg.Scheduler(parse_version(version))  # the double counts as the real code reads
    scheduler.start(sg.ProfileReq(num_steps=3, output_dir=str(tmp_path), profile_id="x"))
    scheduler.run_batch(6)
    assert sg.Scheduler(parse_version(version)).version == parse_version(version)
    assert len(scheduler.files) == 1
    with gzip.open(scheduler.files[0], "rt") as fh:
        assert json.load(fh)["batches"] == (3 if plus_one else 2)


@pytest.mark.parametrize("version", [v for v in VERSIONS if parse_version(v) >= (0, 4, 10)])
def test_a_pending_deferred_start_is_overwritten_not_refused(version: str) -> None:
    """The only refusal of a start is "already in progress": a pending start step is replaced."""
    source = _scheduler_profile_source(version)
    refusals = re.findall(r"if (.*?):\s*\n\s*return ProfileReqOutput\(\s*success=False,\s*message=\"Profiling is "
                          r"already in progress", source)
    assert refusals and all("profiler_start_forward_ct" not in cond for cond in refusals)
    assert re.search(r"self\.profiler_start_forward_ct = max\(start_step", source)


@pytest.mark.parametrize("version", [v for v in VERSIONS if parse_version(v) >= (0, 4, 10)])
def test_an_immediate_start_then_a_stop_disarms_a_pending_start(version: str) -> None:
    """What profctx's disarm relies on: a stop clears the pending start step."""
    source = _scheduler_profile_source(version)
    stop = source[source.index("def stop_profile" if "def stop_profile" in source else "def _stop_profile"):]
    stop = stop[: stop.index("\n    def ", 10)]
    assert "self.profiler_start_forward_ct = None" in stop
