"""Static checks run with the suite: ruff over the project, strict mypy over the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    pytest.importorskip("ruff")
    result = run("ruff", "check", "profctx", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    pytest.importorskip("mypy")
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
