"""README's set-up commands: exactly two, and CI runs the test one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command() -> None:
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) == 2, "README has one demo command and one test command"
    demo, tests = (b.strip() for b in blocks)
    assert demo.endswith("profctx demo") and "torch==2.13.0" in demo
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci_lines
