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


def pytest_configure(config: pytest.Config) -> None:
    """Make the real verl 0.9.1 importable before the verl tests are collected (their cases come from its files).

    Installed already, or its wheel installed here with --no-deps, once, into pytest's cache folder:
    verl's own dependency list pulls vLLM-scale packages, while its config and profiler modules
    need only the light packages of profctx's ``verl`` extra (in ``test``).
    """
    import importlib
    import importlib.util
    import subprocess
    import sys
    import tempfile

    from .verl_inputs import VERL_VERSION

    if importlib.util.find_spec("verl") is not None:
        return
    name = f"verl-{VERL_VERSION}"
    cache = getattr(config, "cache", None)  # absent with -p no:cacheprovider
    target = cache.mkdir(name) if cache is not None else Path(tempfile.mkdtemp(prefix=name))
    if not (target / "verl").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                        f"verl=={VERL_VERSION}"], check=True)
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    from profctx.interop._verl_stages import installed_version

    installed_version.cache_clear()  # it may have been read before the wheel was on the path


@pytest.fixture(scope="session")
def verl_wheel() -> None:
    """Skip when verl's config modules cannot be imported (profctx's 'verl' extra is missing)."""
    pytest.importorskip("verl.utils.profiler", reason="verl's config modules need profctx's 'verl' extra")
