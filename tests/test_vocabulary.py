"""The closed sets of ``core/_vocab.py``: each spelled once, every branch on one exhaustive, one capture-id scheme."""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

import profctx
from profctx import backends
from profctx.core import _vocab
from profctx.util._identity import capture_id

PACKAGE = Path(profctx.__file__).parent
ROOT = PACKAGE.parent

#: Each closed set, and the modules allowed to spell it (its home).
SETS = {
    "modes": (set(_vocab.MODES), {"profctx/core/_vocab.py"}),
    "record kinds": (set(_vocab.RECORD_KINDS), {"profctx/core/_vocab.py"}),
    "tools": (set(_vocab.BUILTIN_TOOLS), {"profctx/core/_vocab.py"}),
    "states": (set(get_args(_vocab.State)), {"profctx/core/_status.py"}),
    "ended states": (set(get_args(_vocab.Ended)), {"profctx/core/_status.py"}),
}


@functools.cache
def _trees() -> tuple[tuple[str, ast.Module], ...]:
    """Every module of the package, parsed once for the scans below: (path from the root, tree)."""
    return tuple((path.relative_to(ROOT).as_posix(), ast.parse(path.read_text()))
                 for path in sorted(PACKAGE.rglob("*.py")))


def _spellings(tree: ast.AST) -> Iterator[tuple[set[str], int]]:
    """Yield the string sets a tuple, list, set or ``Literal[...]`` of string constants spells, with their line."""
    for node in ast.walk(tree):
        items: list[ast.expr] | None = None
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = list(node.elts)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
            items = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if items and all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            yield {i.value for i in items if isinstance(i, ast.Constant)}, node.lineno


def test_each_closed_set_is_spelled_in_its_home_only() -> None:
    # A second spelling is the trap the issue found (the mode set in 9 places): a value added to
    # one is missing from the other. Code derives tuples from the Literal (typing.get_args).
    stray = []
    for rel, tree in _trees():
        for found, line in _spellings(tree):
            for name, (values, homes) in SETS.items():
                if found == values and rel not in homes:
                    stray.append(f"{rel}:{line}: the {name} {sorted(values)}")
    assert stray == [], "closed sets spelled outside core/_vocab.py:\n" + "\n".join(stray)
    assert list(_spellings(ast.parse("x = ('step', 'role')\ny: Literal['a'] = 'a'"))) == [({"step", "role"}, 1),
                                                                                           ({"a"}, 2)]


def test_the_built_in_backends_are_the_tools_the_vocabulary_names() -> None:
    assert set(backends.BUILTIN) == set(_vocab.BUILTIN_TOOLS)
    assert set(backends.known()) >= {"auto", *_vocab.BUILTIN_TOOLS}
    with pytest.raises(profctx.ConfigError) as bad:
        profctx.ProfilerConfig(tool="no such/tool")
    assert all(repr(tool) in str(bad.value) for tool in _vocab.BUILTIN_TOOLS)


def test_a_bad_mode_lists_the_modes_of_the_vocabulary() -> None:
    with pytest.raises(profctx.ConfigError) as bad:
        profctx.ProfilerConfig(mode="window")  # type: ignore[arg-type]
    assert "mode: 'window'" in str(bad.value) and all(repr(m) in str(bad.value) for m in _vocab.MODES)


def test_every_mode_has_a_capture_kind() -> None:
    assert {_vocab.capture_kind(mode) for mode in _vocab.MODES} <= set(_vocab.CAPTURE_KINDS)
    with pytest.raises(AssertionError, match="unhandled value: 'window'"):
        _vocab.capture_kind("window")  # type: ignore[arg-type]


def _functions_at(tree: ast.AST) -> dict[int, str]:
    """Line -> the (qualified) name of the innermost function holding it."""
    where: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                for line in range(child.lineno, (child.end_lineno or child.lineno) + 1):
                    where[line] = name
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return where


@pytest.mark.slow
def test_a_half_added_mode_fails_strict_mypy_at_each_branch_that_misses_it(tmp_path: Path) -> None:
    # What the issue found: a new value in the modes' Literal passed strict mypy, and a run
    # captured 0 of 2 window steps without an error, because the plan branched on `== "step"` /
    # `== "role"` with no exhaustive end. Here a copy of the package gets a new mode and nothing
    # else: mypy must refuse the plan's decision and @profiled's switch at their assert_never.
    pytest.importorskip("mypy")
    copy = tmp_path / "profctx"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    vocab = copy / "core" / "_vocab.py"
    text = vocab.read_text()
    assert 'Mode = Literal["step", "role"]\n' in text
    vocab.write_text(text.replace('Mode = Literal["step", "role"]\n', 'Mode = Literal["step", "role", "window"]\n'))
    # Only the plan and the vocabulary are checked (imports followed silently): seconds, not minutes.
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.10", "--follow-imports=silent",
         "--no-incremental", "--cache-dir", str(tmp_path / "cache"), "profctx/core/_plan.py", "profctx/core/_vocab.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = re.findall(r"^profctx/(core/_\w+)\.py:(\d+): error: (.*)$", result.stdout, re.MULTILINE)
    missed = {"Literal['window']" in message and "assert_never" in message for _, _, message in errors}
    assert missed == {True}, result.stdout  # every error is the new value reaching an assert_never
    functions = {name: _functions_at(ast.parse((copy / f"{name}.py").read_text())) for name in
                 ("core/_plan", "core/_vocab")}
    unhandled = {functions[module][int(line)] for module, line, _ in errors}
    assert unhandled == {"Policy.wants_role", "decide", "capture_kind"}, result.stdout


def test_capture_ids_come_from_one_function() -> None:
    # Capture ids came from 4 sites in 2 formats (uuid4().hex[:12], os.urandom(6).hex()); now one.
    ids = {capture_id() for _ in range(100)}
    assert len(ids) == 100 and all(re.fullmatch(r"[0-9a-f]{12}", i) for i in ids)
    stray = []
    for rel, tree in _trees():
        for node in ast.walk(tree):
            if (isinstance(node, (ast.Import, ast.ImportFrom)) and any(a.name == "uuid" for a in node.names)) or (
                    isinstance(node, ast.ImportFrom) and node.module == "uuid"):
                stray.append(f"{rel}:{node.lineno}: imports uuid")
            value: ast.expr | None = None
            if isinstance(node, ast.keyword) and node.arg == "capture":
                value = node.value
            elif isinstance(node, ast.Dict):
                value = next((v for k, v in zip(node.keys, node.values, strict=True)
                              if isinstance(k, ast.Constant) and k.value == "capture"), None)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "id"
                                                      for t in node.targets):
                value = node.value
            if isinstance(value, ast.Call) and ast.unparse(value.func) != "capture_id":
                stray.append(f"{rel}:{node.lineno}: a capture id made by {ast.unparse(value)}")
    assert stray == [], "capture ids not made by util._identity.capture_id:\n" + "\n".join(stray)


def test_every_record_a_run_writes_carries_such_an_id(tmp_path: Path) -> None:
    # The ids users see: the process's own captures, an engine session's request, a failed remote call.
    from profctx.core._config import EngineConfig
    from profctx.core._scope import Scope
    from profctx.engines import plan
    from profctx.manifest import read
    from profctx.records._manifest import failed_call

    profctx.configure(steps=[1, 2], tool="noop", save_path=str(tmp_path), warmup=False, exit_hooks=False)
    for step in (1, 2, 3):
        with profctx.profile_step(step):
            pass
    profctx.reset()
    records = read(tmp_path)
    ids = [r.capture for r in records]
    ids.append(plan(Scope(3, ("rollout",)), EngineConfig(), str(tmp_path), "vllm", 0).capture)
    ids.append(failed_call(3, "rollout", "RayActorError", "the member died")["capture"])
    assert len(records) == 2 and len(set(ids)) == 4
    assert all(re.fullmatch(r"[0-9a-f]{12}", str(i)) for i in ids), ids
