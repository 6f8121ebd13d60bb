"""Every YAML under docs/examples loads through profctx.configure(path), and each verl example
converts to exactly the profctx example shown beside it in docs/migrating-from-verl.md."""

from __future__ import annotations

from pathlib import Path

import pytest

import profctx

from .conftest import EXAMPLES

PAIRS = ("whole-step", "discrete-rollout", "npu", "nsys")


def _install_doubles(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand in for what this CPU machine lacks: torch_npu (npu) and a CUDA build (nsys)."""
    if "npu" in name:
        from backends.doubles import torch_npu

        torch_npu.install(monkeypatch)
    if "nsys" in name:
        from backends.doubles import cuda

        cuda.install_profiler(monkeypatch)


def test_every_example_is_tested() -> None:
    names = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    covered = sorted([f"verl-{p}.yaml" for p in PAIRS] + [f"profctx-{p}.yaml" for p in PAIRS] + ["profctx-hydra.yaml"])
    assert names == covered


@pytest.mark.parametrize("case", PAIRS)
def test_verl_example_converts_to_the_profctx_example(
    case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _install_doubles(case, monkeypatch)
    monkeypatch.chdir(tmp_path)  # the examples' relative save_path lands here
    expected = profctx.configure(EXAMPLES / f"profctx-{case}.yaml", warmup=False)
    profctx.reset()
    converted = profctx.configure(verl=EXAMPLES / f"verl-{case}.yaml", warmup=False)
    assert expected is not None and expected.active
    assert converted == expected


def test_hydra_example_loads_through_configure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = profctx.configure(EXAMPLES / "profctx-hydra.yaml", warmup=False)
    assert config is not None
    assert list(config.steps or ()) == [10, 20, 30]
    assert config.mode == "role" and config.roles == ("actor_*", "rollout") and config.engines.count == 20
