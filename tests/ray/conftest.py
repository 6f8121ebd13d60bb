"""One local Ray cluster per test module (2 CPUs, no dashboard); actor classes come from ``_actors``."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """Start Ray once for the module; workers import ``_actors`` from this folder."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    context = ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                       runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        yield context
    finally:
        ray.shutdown()
