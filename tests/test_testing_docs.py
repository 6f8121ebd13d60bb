"""docs/testing.md runs: its Python blocks are executed as one module and its tests are run here."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "testing.md"


def load_page() -> dict[str, Any]:
    """Execute the page's ```python blocks, in order, as the module ``profctx_docs_testing``."""
    code = "\n".join(re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S))
    module = types.ModuleType("profctx_docs_testing")
    module.__file__ = str(PAGE)
    sys.modules[module.__name__] = module
    exec(compile(code, str(PAGE), "exec"), module.__dict__)  # the page is this project's own
    return module.__dict__


PAGE_NAMESPACE = load_page()
PAGE_TESTS: dict[str, Callable[[], None]] = {
    name: fn for name, fn in PAGE_NAMESPACE.items() if name.startswith("test_") and callable(fn)
}


def test_the_page_has_its_tests_and_is_linked_from_the_readme() -> None:
    assert set(PAGE_TESTS) == {"test_trainer_profiles_what_the_plan_says",
                               "test_a_retried_step_is_profiled_again_identically"}
    assert "(docs/testing.md)" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(PAGE_TESTS))
def test_page_example(name: str) -> None:
    PAGE_TESTS[name]()


def test_the_page_trainer_really_retries_and_resumes() -> None:
    # The example is only worth its words if the loop it profiles does retry and resume.
    trainer = PAGE_NAMESPACE["Trainer"](8, 3, nan_at={2}, preempt_after={4})
    PAGE_NAMESPACE["run_job"](trainer)
    assert trainer.ran == [0, 1, 2, 2, 3, 4, 3, 4, 5, 6, 7]
