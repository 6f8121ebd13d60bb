"""Compare the doubles with the real vLLM / SGLang classes when they are importable (skipped otherwise)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from .doubles import sglang as sg
from .doubles import vllm as vd


def _params(func: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(func).parameters.values() if p.name != "self"]


def _vllm_double(version: str, sync: bool) -> Any:
    major, minor = (int(x) for x in version.split(".")[:2])
    table = vd.SYNC if sync else vd.ASYNC
    chosen = "0.10"
    for key in ("0.17", "0.32", "0.33"):
        if (major, minor) >= tuple(int(x) for x in key.split(".")):
            chosen = key
    return table[chosen]


@pytest.mark.vllm_real
def test_vllm_signatures_match_the_double() -> None:
    vllm = pytest.importorskip("vllm")
    from vllm import LLM
    from vllm.v1.engine.async_llm import AsyncLLM

    assert _params(AsyncLLM.start_profile) == _params(_vllm_double(vllm.__version__, False).start_profile)
    assert _params(LLM.start_profile) == _params(_vllm_double(vllm.__version__, True).start_profile)
    assert inspect.iscoroutinefunction(AsyncLLM.start_profile) and not inspect.iscoroutinefunction(LLM.start_profile)


def test_sglang_signatures_match_the_double() -> None:
    sglang = pytest.importorskip("sglang")
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from profctx.engines.sglang import parse_version

    real = {name for name, _ in _params(TokenizerManager.start_profile)}
    if parse_version(sglang.__version__) >= (0, 5, 15):
        from sglang.srt.managers.io_struct import ProfileReq

        assert real == {"req"}
        assert set(sg.ProfileReq.__struct_fields__) <= set(ProfileReq.__struct_fields__)
    else:
        assert real <= {name for name, _ in _params(sg.TokenizerManager_0_5_12.start_profile)}
