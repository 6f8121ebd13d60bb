"""Run profctx's SGLang adapter against SGLang's real profiling code, one released version per process.

``python scenarios.py WHEEL_DIR OUT_DIR`` prints one JSON object: what each scenario observed.

Executed as shipped: ``ProfileReq``/``ProfileReqOutput`` (io_struct), the tokenizer side's
``start_profile``/``stop_profile``/``_execute_profile``, and the whole scheduler profiler
(``SchedulerProfilerManager``: arming, starting and stopping torch.profiler, the batch
predicate, trace export). Replaced, because they need a GPU server: the ZMQ hop between
tokenizer and scheduler (a direct call), the parallel/device/env lookups (rank 0 of 1, no
NPU), and the process group (a one-process gloo group, real torch.distributed). The torch
profiler is the real one (CPU activity). A "batch" is a forward-count increment, a small
run of the real predicate, then a small CPU op inside ``record_function("batch N")``, in the
order ``Scheduler.run_batch`` uses. The scheduler profiler is the ``SchedulerProfilerManager``
component (0.5.16+), the ``SchedulerProfilerMixin`` (0.4.10-0.5.15), or the ``Scheduler``
class's own methods (0.4.9), taken out of ``scheduler.py`` unchanged.
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import enum
import gzip
import json
import os
import socket
import sys
import tempfile
import types
from pathlib import Path
from typing import Any


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _classes_source(path: Path, names: tuple[str, ...]) -> str:
    source = path.read_text()
    tree = ast.parse(source)
    parts = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in names:
            decorators = "".join(f"@{ast.unparse(d)}\n" for d in node.decorator_list)
            parts.append(decorators + (ast.get_source_segment(source, node) or ""))
    return "\n\n".join(parts)


def _functions_source(path: Path, cls: str, names: tuple[str, ...]) -> str:
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            found = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in names]
            return "\n\n".join(__import__("textwrap").dedent(ast.get_source_segment(source, n) or "") for n in found)
    raise LookupError(cls)


class _Env:
    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


def load(root: Path) -> dict[str, Any]:
    """Load the real profiling code of the SGLang wheel installed under ``root``."""
    import msgspec
    import torch
    import torch.distributed as dist

    managers = root / "sglang" / "srt" / "managers"
    io = _module("sglang.srt.managers.io_struct")
    import abc
    import collections
    import dataclasses
    import uuid

    io.__dict__.update(msgspec=msgspec, Enum=enum.Enum, ABC=abc.ABC, dataclass=dataclasses.dataclass,
                       field=dataclasses.field, uuid=uuid, Counter=collections.Counter,
                       msgspec_struct_pydantic_core_schema=lambda *a: None)
    import typing

    io.__dict__.update({k: getattr(typing, k) for k in ("Optional", "List", "Dict", "Any", "Union", "Literal")})
    sys.modules[io.__name__] = io
    code = "from __future__ import annotations\n" + _classes_source(
        managers / "io_struct.py", ("BaseReq", "ProfileReqType", "ProfileReq", "ProfileReqOutput"))
    exec(compile(code, str(managers / "io_struct.py"), "exec"), io.__dict__)

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    group = dist.new_group([0], backend="gloo")

    class ForwardMode(enum.IntEnum):
        EXTEND = 1
        DECODE = 2

        def is_prefill(self) -> bool:
            return self is ForwardMode.EXTEND

        def is_decode(self) -> bool:
            return self is ForwardMode.DECODE

        def is_idle(self) -> bool:
            return False

        def is_prebuilt(self) -> bool:
            return False

    parallel = types.SimpleNamespace(tp_rank=0, dp_rank=0, num_dp_ranks=1, pp_rank=0, pp_size=1, moe_ep_rank=0,
                                     moe_ep_size=1)
    device = types.SimpleNamespace(gpu_id=0, base_gpu_id=0)
    envs = types.SimpleNamespace(SGLANG_PROFILE_V2=_Env(False), SGLANG_MEM_PROFILE_MAX_ENTRIES=_Env(1000),
                                 SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS=_Env(0))
    stubs = {
        "sglang.srt.environ": _module("sglang.srt.environ", envs=envs),
        "sglang.srt.layers.dp_attention": _module("sglang.srt.layers.dp_attention",
                                                  get_dp_tp_group=lambda: types.SimpleNamespace(cpu_group=group)),
        "sglang.srt.model_executor.forward_batch_info": _module("f", ForwardMode=ForwardMode),
        "sglang.srt.model_executor.step_span_utils": _module("s", set_detailed_annotations_enabled=lambda e: None),
        "sglang.srt.platforms": _module("p", current_platform=types.SimpleNamespace(is_out_of_tree=lambda: False)),
        "sglang.srt.runtime_context": _module("r", get_device=lambda: device, get_parallel=lambda: parallel,
                                              get_server_args=lambda: device),
        "sglang.srt.utils": _module("u", is_mps=lambda: False, is_npu=lambda: False),
        "sglang.srt.server_args": _module("sa", get_global_server_args=lambda: device),
        "sglang.srt.utils.profile_merger": _module("m", ProfileMerger=None),
        "sglang.srt.utils.profile_utils": _module("pu", ProfileManager=None),
        "sglang.srt.utils.torch_npu_patch_utils": _module("t", apply_torch_npu_patches=None),
    }
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        path = managers / "scheduler_components" / "profiler_manager.py"
        if not path.exists():  # before the component: a mixin of the Scheduler class
            path = managers / "scheduler_profiler_mixin.py"
        pm = _module("sglang_real_profiler_manager", __file__=str(path))
        sys.modules[pm.__name__] = pm
        if path.exists():
            exec(compile(path.read_text(), str(path), "exec"), pm.__dict__)
        else:  # 0.4.9: methods of the Scheduler class itself, taken out of scheduler.py as they are
            path = managers / "scheduler.py"
            body = _functions_source(path, "Scheduler", ("init_profier", "profile", "init_profile", "start_profile",
                                                         "stop_profile", "_profile_batch_predicate"))
            pm.__dict__.update(torch=torch, os=os, time=__import__("time"), Path=Path, Optional=Any, List=list,
                               logger=__import__("logging").getLogger("sglang"), ForwardMode=ForwardMode,
                               ProfileReq=io.ProfileReq, ProfileReqType=io.ProfileReqType,
                               ProfileReqOutput=io.ProfileReqOutput)
            code = "class SchedulerProfilerMixin:\n" + "\n".join("    " + line for line in body.splitlines())
            exec(compile(code, str(path), "exec"), pm.__dict__)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value

    tokenizer_path, tokenizer_class = managers / "tokenizer_control_mixin.py", "TokenizerControlMixin"
    if not tokenizer_path.exists():  # 0.4.x: the methods of TokenizerManager itself
        tokenizer_path, tokenizer_class = managers / "tokenizer_manager.py", "TokenizerManager"
    tok_ns: dict[str, Any] = {"ProfileReq": io.ProfileReq, "ProfileReqType": io.ProfileReqType, "Optional": Any,
                              "List": list,
                              "TokenizerManager": object, "time": __import__("time"),
                              "get_bool_env_var": lambda name, default="false":
                              os.environ.get(name, default).lower() in ("true", "1")}
    exec(compile("from __future__ import annotations\n" + _functions_source(
        tokenizer_path, tokenizer_class, ("start_profile", "stop_profile", "_execute_profile")),
        str(tokenizer_path), "exec"), tok_ns)
    engine_path = root / "sglang" / "srt" / "entrypoints" / "engine.py"
    engine_ns: dict[str, Any] = {"asyncio": asyncio, "ProfileReq": io.ProfileReq,
                                 "ProfileReqType": io.ProfileReqType}
    exec(compile("class Engine:\n" + "\n".join(
        "    " + line for line in _functions_source(engine_path, "Engine", ("start_profile", "stop_profile"))
        .splitlines()), str(engine_path), "exec"), engine_ns)
    return {"io": io, "pm": pm, "tok": tok_ns, "torch": torch, "group": group, "engine": engine_ns["Engine"],
            "ForwardMode": ForwardMode}


def build(real: dict[str, Any]) -> Any:
    """Return a tokenizer-manager object wired straight to a real scheduler profiler."""
    torch = real["torch"]
    pm = real["pm"]

    mixin = getattr(pm, "SchedulerProfilerMixin", None)

    class MixinScheduler(mixin or object):  # type: ignore[misc]
        """The Scheduler's own profiling state and methods, as the mixin gives them (0.5.12)."""

        def __init__(self, owner: Any) -> None:
            self.owner, self.tp_rank, self.gpu_id = owner, 0, 0
            self.dp_tp_cpu_group = self.tp_cpu_group = real["group"]  # 0.4.10 names it tp_cpu_group
            # 0.4.10 spells it init_profier.
            (getattr(self, "init_profiler", None) or self.init_profier)()

        @property
        def forward_ct(self) -> int:
            return int(self.owner.forward_ct)

        def _profile(self, req: Any) -> Any:
            return self.profile(req)

    class Scheduler:
        def __init__(self) -> None:
            self.forward_ct = 0
            if mixin is not None:
                self.profiler: Any = MixinScheduler(self)
            else:
                fields = pm.SchedulerProfilerManager.__dataclass_fields__
                kwargs: dict[str, Any] = {"get_forward_ct": lambda: self.forward_ct}
                if "ps" in fields:
                    kwargs["ps"] = types.SimpleNamespace(gpu_id=0, tp_rank=0, dp_rank=0, pp_rank=0, moe_ep_rank=0,
                                                         attn_dp_rank=0, tp_size=1, dp_size=1, pp_size=1,
                                                         moe_ep_size=1)
                if "dp_tp_cpu_group" in fields and fields["dp_tp_cpu_group"].init:
                    kwargs["dp_tp_cpu_group"] = real["group"]
                self.profiler = pm.SchedulerProfilerManager(**kwargs)

            # SGLang's scheduler handles requests and batches on one thread of its own process.
            self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="scheduler")

        def submit(self, fn: Any) -> concurrent.futures.Future[Any]:
            return self.pool.submit(fn)

        def run_batch(self, n: int = 1, mode: Any = None) -> None:
            self.submit(lambda: self._batches(n, mode)).result()

        def _batches(self, n: int, mode: Any) -> None:
            for _ in range(n):  # Scheduler.run_batch: count, then the predicate, then the forward
                self.forward_ct += 1
                self.profiler._profile_batch_predicate(types.SimpleNamespace(forward_mode=mode))
                with torch.profiler.record_function(f"batch {self.forward_ct}"):
                    torch.ones(8).sum()

    scheduler = Scheduler()
    tok = real["tok"]

    class TokenizerManager:
        start_profile = tok["start_profile"]
        stop_profile = tok["stop_profile"]
        _execute_profile = tok["_execute_profile"]

        def auto_create_handle_loop(self) -> None:
            pass

        async def profile_communicator(self, req: Any) -> list[Any]:
            # The ZMQ round trip, made a hand-over to the scheduler's thread.
            return [await asyncio.wrap_future(scheduler.submit(lambda: scheduler.profiler._profile(req)))]

    manager = TokenizerManager()
    manager.scheduler = scheduler  # type: ignore[attr-defined]
    return manager


def batches(path: str) -> list[str]:
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return sorted({e["name"] for e in events if str(e.get("name", "")).startswith("batch ")},
                  key=lambda n: int(n.split()[1]))


def main() -> None:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    real = load(root)
    version = root.name
    import profctx
    from profctx.engines import SGLangTokenizerAdapter, attach, detach
    from profctx.records import _manifest

    results: dict[str, Any] = {"version": version}

    def scenario(name: str, engines: dict[str, Any], before: int, during: int, after: int = 0,
                 stages: bool = False, foreign: dict[str, Any] | None = None) -> Any:
        save = out / name
        profctx.reset()
        profctx.configure(steps=[1], tool="noop", save_path=str(save), exit_hooks=False, warmup=False,
                          engines=engines)
        manager = build(real)
        manager.scheduler.run_batch(before)
        if foreign is not None:  # someone else's deferred start, armed before profctx's
            start = manager.start_profile
            if "req" in start.__code__.co_varnames[:2]:
                asyncio.run(start(real["io"].ProfileReq(output_dir=str(out / f"{name}-foreign"), **foreign)))
            else:
                asyncio.run(start(output_dir=str(out / f"{name}-foreign"), **foreign))
        attach(SGLangTokenizerAdapter(manager, version=version))
        with profctx.profile_step(1), profctx.profile_step(role="rollout"):
            if stages:  # a prefill phase, then decode batches
                manager.scheduler.run_batch(during, real["ForwardMode"].EXTEND)
                manager.scheduler.run_batch(during, real["ForwardMode"].DECODE)
            else:
                manager.scheduler.run_batch(during)
        manager.scheduler.run_batch(after)
        detach()
        records = [r for r in _manifest.read(save) if r.get("kind") == "engine"]
        prof = manager.scheduler.profiler
        files = sorted(str(p) for p in save.rglob("*.trace.json.gz"))
        return {"records": [{k: r.get(k) for k in ("status", "error", "notes", "files")} for r in records],
                "traces": {Path(f).name: batches(f) for f in files},
                "in_progress": bool(prof.profile_in_progress),
                "armed": getattr(prof, "profiler_start_forward_ct", None),
                "with_stack": getattr(prof, "torch_profiler_with_stack", None),
                "record_shapes": getattr(prof, "torch_profiler_record_shapes", None)}

    results["count"] = scenario("count", {"count": 3}, 2, 8)
    results["by_stage"] = scenario("by_stage", {"count": 2, "by_stage": True}, 0, 4, stages=True)

    # sglang.Engine's own start_profile/stop_profile (blocking; before 0.5.3 without options).
    save = out / "engine"
    os.environ["SGLANG_TORCH_PROFILER_DIR"] = str(out / "engine-default")
    profctx.reset()
    profctx.configure(steps=[1], tool="noop", save_path=str(save), exit_hooks=False, warmup=False)
    engine = real["engine"]()
    engine.tokenizer_manager = build(real)
    engine.loop = asyncio.new_event_loop()  # what Engine.__init__ keeps (0.5.x)
    from profctx.engines import SGLangEngineAdapter

    attach(SGLangEngineAdapter(engine, version=version))
    with profctx.profile_step(1), profctx.profile_step(role="rollout"):
        engine.tokenizer_manager.scheduler.run_batch(3)
    detach()
    records = [r for r in _manifest.read(save) if r.get("kind") == "engine"]
    results["engine"] = {"records": [{k: r.get(k) for k in ("status", "error", "notes", "files")} for r in records],
                         "default_dir": sorted(p.name for p in (out / "engine-default").glob("*.trace.json.gz"))}
    from profctx.engines.sglang import fields_for_version

    if "start_step" in fields_for_version(version):  # 0.4.10+
        results["deferred"] = scenario("deferred", {"count": 2, "absolute_start_step": 5}, 0, 8)
        results["never_began"] = scenario("never_began", {"count": 2, "absolute_start_step": 50}, 0, 3, after=60)
        results["overwrite"] = scenario("overwrite", {"count": 2, "absolute_start_step": 5}, 0, 8, after=100,
                                        foreign={"start_step": 100, "num_steps": 1})
    results["zero_is_now"] = scenario("zero_is_now", {"count": 2, "absolute_start_step": 0}, 4, 6)
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    os.environ.setdefault("TMPDIR", tempfile.gettempdir())
    asyncio.set_event_loop(None)
    main()
