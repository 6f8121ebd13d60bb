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
