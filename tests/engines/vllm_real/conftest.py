"""Fixtures for the real-vLLM group: one tiny model per session, engines shared per module.

The group runs in its own environment (``requirements-vllm.txt``; ``.ci/run`` builds it).
Without vLLM it is skipped, unless ``PROFCTX_REQUIRE_VLLM=1`` (set by ``.ci/run``) makes
that an error, so CI can never pass it by skipping.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from . import model

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes a large share of memory
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vllm_real)


@pytest.fixture(scope="session")
def vllm() -> Any:
    """The installed vLLM module (skip without it, fail under PROFCTX_REQUIRE_VLLM=1)."""
    try:
        import vllm as module
    except ImportError as exc:
        if os.environ.get("PROFCTX_REQUIRE_VLLM") == "1":
            pytest.fail(f"PROFCTX_REQUIRE_VLLM=1 but vLLM does not import: {exc}")
        pytest.skip(f"vLLM is not installed ({exc}); see requirements-vllm.txt")
    return module


@pytest.fixture(scope="session")
def tiny_model(vllm: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a word-level tokenizer, written once per session."""
    return model.build(tmp_path_factory.mktemp("tiny-llama"))


def engine_kwargs(model_dir: Path) -> dict[str, Any]:
    """Keyword arguments that make a small, quick CPU engine."""
    return {"model": str(model_dir), "dtype": "bfloat16", "max_model_len": 128, "enforce_eager": True,
            "max_num_seqs": 4, "seed": 0}


class LoopThread:
    """An event loop on a daemon thread: where an in-process ``AsyncLLM`` lives."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 300) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()
