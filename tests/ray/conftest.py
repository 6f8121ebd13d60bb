"""Local Ray clusters (2 CPUs, no dashboard) for the modules here; actor classes come from ``_actors``.

Starting a cluster and shutting it down takes several seconds, so modules that run one after
another share one: a module's ``ray_cluster`` is shut down when the next test to run does not use
it, so no other test (and no cluster of a test's own) ever runs beside it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

HERE = Path(__file__).resolve().parent

_STARTED: list[Any] = []  # the context of the cluster this process started and has not shut down


def _next_test_uses_it(request: pytest.FixtureRequest) -> bool:
    items = request.session.items
    last = max((i for i, item in enumerate(items) if item.getparent(pytest.Module) is request.node), default=None)
    if last is None or last + 1 >= len(items):
        return False
    return "ray_cluster" in getattr(items[last + 1], "fixturenames", ())


@pytest.fixture(scope="module")
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Start Ray for the module (or keep the previous module's); workers import ``_actors`` from this folder."""
    if not (_STARTED and ray.is_initialized()):
        _STARTED.clear()
        path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
        _STARTED.append(ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
                                 log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}}))
    try:
        yield _STARTED[0]
    finally:
        if not (_next_test_uses_it(request) and ray.is_initialized()):
            _STARTED.clear()
            ray.shutdown()
