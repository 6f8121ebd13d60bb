"""Fixtures for engine tests: every adapter kind behind one "kit" interface, detached after each test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.engines import (
    EngineAdapter,
    SGLangEngineAdapter,
    SGLangHttpAdapter,
    SGLangTokenizerAdapter,
    VLLMAdapter,
    VLLMAsyncAdapter,
    VLLMHttpAdapter,
    detach,
)
from profctx.records import _manifest

from .doubles import sglang as sg
from .doubles import vllm as vd
from .doubles.servers import SGLangServer, VLLMServer


@pytest.fixture(autouse=True)
def _detach_engines() -> Iterator[None]:
    yield
    detach()


@dataclass
class Kit:
    """One adapter wired to an engine double, with probes of what the engine saw."""

    name: str
    adapter: EngineAdapter
    starts: Callable[[], int]
    stops: Callable[[], int]
    active: Callable[[], bool]
    folder_tail: str
    closers: list[Callable[[], None]] = field(default_factory=list)


def _vllm_probe(engine: vd._Engine) -> dict[str, Any]:
    return {"starts": lambda: len(engine.start_calls), "stops": lambda: engine.stop_calls,
            "active": lambda: engine.session_active}


def _sglang_probe(manager: sg._TokenizerBase) -> dict[str, Any]:
    return {"starts": lambda: manager.scheduler.starts, "stops": lambda: manager.stop_calls,
            "active": lambda: manager.scheduler.in_progress}


def make_kit(name: str, save: Path, replica: int = 0) -> Kit:
    """Build the kit ``name`` (``engine-kind-version``) writing under ``save``."""
    engine_name, kind, version = name.split("-")
    vllm_dir = f"{save}/engines/vllm-replica{replica}"
    if engine_name == "vllm":
        tail = f"engines/vllm-replica{replica}"
        if kind == "async":
            engine = vd.ASYNC[version](vllm_dir)
            return Kit(name, VLLMAsyncAdapter(engine, replica=replica), folder_tail=tail, **_vllm_probe(engine))
        if kind == "llm":
            llm = vd.SYNC[version](vllm_dir)
            return Kit(name, VLLMAdapter(llm, replica=replica), folder_tail=tail, **_vllm_probe(llm))
        server = VLLMServer(version, vllm_dir)
        kit = Kit(name, VLLMHttpAdapter(server.url, replica=replica), folder_tail=tail, **_vllm_probe(server.engine))
        kit.closers.append(server.close)
        return kit
    tail = f"sglang-replica{replica}"
    if kind == "tm":
        manager: sg._TokenizerBase = (sg.TokenizerManager_0_5_23() if version == "0.5.23"
                                      else sg.TokenizerManager_0_5_12())
        return Kit(name, SGLangTokenizerAdapter(manager, replica=replica), folder_tail=tail, **_sglang_probe(manager))
    if kind == "engine":
        eng = sg.Engine_0_5_23()
        return Kit(name, SGLangEngineAdapter(eng, replica=replica), folder_tail=tail,
                   **_sglang_probe(eng.tokenizer_manager))
    srv = SGLangServer(version)
    kit = Kit(name, SGLangHttpAdapter(srv.url, replica=replica, version=version), folder_tail=tail,
              **_sglang_probe(srv.manager))
    kit.closers.append(srv.close)
    return kit


KITS = [
    "vllm-async-0.10", "vllm-async-0.17", "vllm-async-0.32", "vllm-async-0.33",
    "vllm-llm-0.10", "vllm-llm-0.33",
    "vllm-http-0.17", "vllm-http-0.33",
    "sglang-tm-0.5.12", "sglang-tm-0.5.23", "sglang-engine-0.5.23",
    "sglang-http-0.5.12", "sglang-http-0.5.23",
]


@pytest.fixture(params=KITS)
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    built = make_kit(request.param, tmp_path)
    yield built
    for close in built.closers:
        close()


def configure(save: Path, **fields: Any) -> None:
    """Configure profctx for engine tests: step 1 in the window, no device profiler."""
    base: dict[str, Any] = {"steps": [1], "tool": "noop", "save_path": str(save), "exit_hooks": False,
                            "warmup": False}
    base.update(fields)
    profctx.configure(base)


def engine_records(save: Path) -> list[dict[str, Any]]:
    """Return the merged manifest records of engine captures under ``save``."""
    return [r for r in _manifest.read(save) if r.get("kind") == "engine"]


def run(coro: Any) -> Any:
    return asyncio.run(coro)
