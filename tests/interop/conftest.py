"""Fixtures for the verl interop tests: verl configs in the January 2026 and August 2026 shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = Path(__file__).parents[2] / "docs" / "examples"
SHAPES = ("jan2026", "aug2026")


def load_shape(shape: str) -> Any:
    """Return the fixture of ``shape`` as an OmegaConf DictConfig (verl's own form)."""
    omegaconf = pytest.importorskip("omegaconf")
    return omegaconf.OmegaConf.load(FIXTURES / f"verl_{shape}.yaml")


@pytest.fixture(params=SHAPES)
def shape(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def verl_wheel(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Make the real verl 0.9.1 importable: installed already, else its wheel installed here with --no-deps.

    verl's own dependencies are heavy (vLLM, Ray extras, datasets...); its config and profiler
    modules need only the light packages of profctx's ``verl`` extra (in ``test``). The wheel is
    installed once into pytest's cache folder.
    """
    import importlib.util
    import subprocess
    import sys

    from .verl_inputs import VERL_VERSION

    if importlib.util.find_spec("verl") is None:
        name = f"verl-{VERL_VERSION}"
        target = pytestconfig.cache.mkdir(name) if pytestconfig.cache else tmp_path_factory.mktemp(name)
        if not (target / "verl").is_dir():
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                            f"verl=={VERL_VERSION}"], check=True)
        sys.path.insert(0, str(target))
        importlib.invalidate_caches()
        from profctx.interop._verl_stages import installed_version

        installed_version.cache_clear()  # it may have been read before the wheel was on the path
    pytest.importorskip("verl.utils.profiler", reason="verl's config modules need profctx's 'verl' extra")
