"""The layers of docs/architecture.md, held against the real imports of every module.

Every import counts: at module level, under ``if TYPE_CHECKING:`` and inside functions (a late
import is still a dependency, and a circle it closes is still a circle), and so do string
imports: a ``"profctx.x.y"`` or ``"profctx.x.y:Name"`` string naming a module of the package (a
registration imported on use), the name given to ``importlib.import_module`` or ``__import__``
(relative ones too), and a ``sys.modules`` look-up (``.get``, ``[...]``, ``in``): a module found
there is used, whoever imported it. A module may import
its own layer and the layers below; the arrows listed in ``FORBIDDEN`` must never exist even
within the top layer; and no cycle may form. The architecture page's module table names every
module of the package, and nothing else.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import profctx

PACKAGE = Path(profctx.__file__).parent
DOC = PACKAGE.parent / "docs" / "architecture.md"

#: Lowest first. A module belongs to the layer of the longest prefix naming it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("util", ("profctx.util",)),
    ("core", ("profctx.core",)),
    ("interop", ("profctx.interop",)),
    ("records", ("profctx.records", "profctx.manifest")),
    ("backends", ("profctx.backends",)),
    ("engines", ("profctx.engines",)),
    ("process", ("profctx.process",)),
    ("ray", ("profctx.ray",)),
    ("surface", ("profctx", "profctx.__main__", "profctx.integrations", "profctx.analysis", "profctx.cli",
                 "profctx.demo", "profctx.testing")),
]

#: Arrows that must not exist although the layers would allow them (importer prefix, imported prefix).
FORBIDDEN: list[tuple[str, str]] = [
    # The offline side reads run folders; it never touches a process's profiling state.
    ("profctx.analysis", "profctx.process"),
    ("profctx.analysis", "profctx.ray"),
    ("profctx.analysis", "profctx.engines"),
    ("profctx.analysis", "profctx.cli"),
    # The CLI reads run folders and talks to live runs through files (``profctx trigger`` writes
    # requests with process._ondemand's format); it never holds or drives a process's profiling.
    ("profctx.cli", "profctx.process._owner"),
    ("profctx.cli", "profctx.process._runtime"),
    ("profctx.cli", "profctx.process._api"),
    ("profctx.cli", "profctx.process._block"),
    ("profctx.cli", "profctx.ray"),
    # Engines are driven by the process layer and handed what they need (engines._host).
    ("profctx.engines", "profctx.process"),
    # The values and the plan know nothing of the process, the registry of backends, or verl.
    ("profctx.core", "profctx.backends"),
    ("profctx.core", "profctx.interop"),
    # Framework integrations use the public surface of the process layer, not the CLI or analysis.
    ("profctx.integrations", "profctx.cli"),
    ("profctx.integrations", "profctx.analysis"),
]


def module_paths() -> dict[str, Path]:
    """Module name -> its source file, for every module of the package."""
    paths: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return paths


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


#: A string that names a module of the package, or an attribute of one (``"profctx.backends.torch:TorchBackend"``).
_MODULE_STRING = re.compile(r"profctx(?:\.\w+)+(?::\w+)?")
#: A relative module name, as ``importlib.import_module(name, __name__)`` takes one.
_RELATIVE_STRING = re.compile(r"\.+\w+(?:\.\w+)*")
#: Kind of an edge found in a string: counted exactly (the name must be a module), never by prefix.
STRING = "string"


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_sys_modules(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def string_imports(tree: ast.AST, name: str, package: str) -> Iterator[tuple[str, int]]:
    """Yield (module name, line) for every string import in ``tree`` (see the module docstring).

    ``name``, ``package``: the module's ``__name__`` and ``__package__``, what a relative name given
    to ``import_module`` with either is relative to. Names are yielded as written (less any
    ``:Name``); the caller keeps those that are modules of the package.
    """
    def absolute(text: str, anchor: str = package) -> str:
        if not text.startswith("."):
            return text.partition(":")[0]
        level = len(text) - len(text.lstrip("."))
        base = anchor.split(".")
        return ".".join([*base[: len(base) - (level - 1)], text[level:]])

    def anchor_of(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Name) and node.id in ("__name__", "__package__"):
            return name if node.id == "__name__" else package
        return None

    relative_anchor: str | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) in ("import_module", "__import__") and node.args:
            anchor = anchor_of(node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "package"), None))
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if not first.value.startswith("."):
                    yield absolute(first.value), node.lineno
                elif anchor is not None:
                    yield absolute(first.value, anchor), node.lineno
            elif anchor is not None:
                relative_anchor = anchor  # a name held elsewhere in the module: its relative strings count
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and _is_sys_modules(node.func.value) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            yield node.args[0].value, node.lineno
        elif (isinstance(node, ast.Subscript) and _is_sys_modules(node.value) and isinstance(node.slice, ast.Constant)
              and isinstance(node.slice.value, str)):
            yield node.slice.value, node.lineno
        elif (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
              and _is_sys_modules(node.comparators[0]) and isinstance(node.left, ast.Constant)
              and isinstance(node.left.value, str)):
            yield node.left.value, node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.fullmatch(node.value):
            yield absolute(node.value), node.lineno
    if relative_anchor is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _RELATIVE_STRING.fullmatch(
                    node.value):
                yield absolute(node.value, relative_anchor), node.lineno


def imports(source: str, name: str, is_package: bool) -> Iterator[tuple[str, str, int]]:
    """Yield (imported name, kind, line) for every import in ``source``: module, type or function level, or string.

    A string import's name is exact (kind :data:`STRING`): it counts only if it is a module.
    """
    package = name if is_package else name.rpartition(".")[0]

    def resolve(level: int, module: str | None) -> str:
        if level == 0:
            return module or ""
        base = package.split(".")
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def visit(node: ast.AST, kind: str) -> Iterator[tuple[str, str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, kind, child.lineno
            elif isinstance(child, ast.ImportFrom):
                target = resolve(child.level, child.module)
                for alias in child.names:  # ``from . import _api`` imports a module; resolved below
                    yield f"{target}.{alias.name}", kind, child.lineno
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.body:
                    yield from visit(ast.Module(body=[statement], type_ignores=[]), "type")
                for statement in child.orelse:
                    yield from visit(ast.Module(body=[statement], type_ignores=[]), kind)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, "type" if kind == "type" else "function")
            else:
                yield from visit(child, kind)

    tree = ast.parse(source)
    yield from visit(tree, "module")
    for target, line in string_imports(tree, name, package):
        yield target, STRING, line


def edges(paths: dict[str, Path]) -> dict[str, dict[str, tuple[str, int]]]:
    """Module -> {package module it imports (and the packages above that): (kind, line)}.

    ``from x import y`` names module ``x.y`` when there is one, else ``x``. Importing a module
    runs every package above it, so those count too, except the importer's own ancestors
    (already running).
    """
    graph: dict[str, dict[str, tuple[str, int]]] = {}
    for name, path in paths.items():
        found: dict[str, tuple[str, int]] = {}
        for target, kind, line in imports(path.read_text(), name, path.name == "__init__.py"):
            if not target.startswith("profctx") or (kind == STRING and target not in paths):
                continue
            while target and target not in paths:
                target = target.rpartition(".")[0]
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in paths and prefix != name and not name.startswith(prefix + "."):
                    found.setdefault(prefix, (kind, line))
        graph[name] = found
    return graph


def layer_of(module: str) -> int:
    best, level = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    return level


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(graph: dict[str, dict[str, tuple[str, int]]]) -> list[str]:
    """Every arrow that goes up a layer or is forbidden, with where it is."""
    found = []
    for name, targets in sorted(graph.items()):
        for target, (kind, line) in sorted(targets.items()):
            mine, theirs = layer_of(name), layer_of(target)
            if theirs > mine:
                found.append(f"{name}:{line} ({kind}) imports {target}: layer {LAYERS[mine][0]} may not import "
                             f"layer {LAYERS[theirs][0]}")
            for source, sink in FORBIDDEN:
                if _under(name, source) and _under(target, sink):
                    found.append(f"{name}:{line} ({kind}) imports {target}: {source} must never import {sink}")
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """Return one cycle of ``graph`` as a path (first node repeated last), or ``None``."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if colour.get(nxt) is None:
                cycle = walk(nxt)
                if cycle:
                    return cycle
        stack.pop()
        colour[node] = 2
        return None

    for node in sorted(graph):
        if colour.get(node) is None:
            cycle = walk(node)
            if cycle:
                return cycle
    return None


def test_every_module_has_a_layer() -> None:
    assert [name for name in module_paths() if layer_of(name) < 0] == []


def test_no_arrow_goes_up_a_layer_or_is_forbidden() -> None:
    found = violations(edges(module_paths()))
    assert not found, "layer rules broken (docs/architecture.md, 'Layers'):\n" + "\n".join(found)


def test_no_import_cycle_counting_type_and_function_imports() -> None:
    graph = {name: set(targets) for name, targets in edges(module_paths()).items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_cycle_finder_reports_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _graph_of(sources: dict[str, str]) -> dict[str, dict[str, tuple[str, int]]]:
    paths = {name: Path(f"/{name.replace('.', '/')}.py") for name in sources}
    graph: dict[str, dict[str, tuple[str, int]]] = {}
    for name, source in sources.items():
        found: dict[str, tuple[str, int]] = {}
        for target, kind, line in imports(source, name, False):
            if kind == STRING and target not in paths:
                continue
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.setdefault(target, (kind, line))
        graph[name] = found
    return graph


@pytest.mark.parametrize("where", ["module", "type", "function"])
def test_the_check_sees_every_kind_of_import(where: str) -> None:
    # What the issue found: the scope value importing the owner, at module level, under
    # TYPE_CHECKING, or inside a function, must each be reported, and close a cycle.
    statement = {
        "module": "from ..process._owner import OWNER\n",
        "type": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..process._owner import OWNER\n",
        "function": "def ambient():\n    from ..process._owner import OWNER\n    return OWNER\n",
    }[where]
    graph = _graph_of({"profctx.core._scope": statement, "profctx.process._owner": "from ..core._scope import x\n"})
    found = violations(graph)
    assert len(found) == 1 and f"({where}) imports profctx.process._owner" in found[0]
    assert find_cycle({k: set(v) for k, v in graph.items()}) is not None


@pytest.mark.parametrize("where", ["registration", "module string", "import_module", "relative import_module",
                                   "relative name held apart", "__import__", "sys.modules.get", "sys.modules[]",
                                   "in sys.modules"])
def test_the_check_sees_every_kind_of_string_import(where: str) -> None:
    # What the issue found: the backends layer registering "profctx.testing._recording:RecordingBackend",
    # and reset() reaching modules through sys.modules. Each spelling is an arrow, and closes a cycle.
    statement = {
        "registration": '_REGISTRY = {"x": "profctx.process._owner:OWNER"}\n',
        "module string": 'COMMANDS = {"x": "profctx.process._owner"}\n',
        "import_module": 'import importlib\ndef f():\n    return importlib.import_module("profctx.process._owner")\n',
        "relative import_module": ('import importlib\ndef f():\n'
                                   '    return importlib.import_module("..process._owner", __package__)\n'),
        "relative name held apart": ('import importlib\nWHERE = {"OWNER": "..process._owner"}\n'
                                     'def f(n):\n    return importlib.import_module(WHERE[n], __package__)\n'),
        "__import__": 'def f():\n    return __import__("profctx.process._owner")\n',
        "sys.modules.get": 'import sys\ndef f():\n    return sys.modules.get("profctx.process._owner")\n',
        "sys.modules[]": 'import sys\ndef f():\n    return sys.modules["profctx.process._owner"]\n',
        "in sys.modules": 'import sys\ndef f():\n    return "profctx.process._owner" in sys.modules\n',
    }[where]
    graph = _graph_of({"profctx.core._scope": statement, "profctx.process._owner": "from ..core._scope import x\n"})
    found = violations(graph)
    assert len(found) == 1 and "(string) imports profctx.process._owner" in found[0], found
    assert find_cycle({k: set(v) for k, v in graph.items()}) is not None


def test_a_string_that_names_no_module_is_no_arrow() -> None:
    # Schema names, context variable names and docstrings that mention a module are not imports.
    source = ('"""Read by profctx.process._owner."""\nSCHEMA = "profctx.timeline"\nNAME = "profctx.scope"\n'
              'LOGGER = "profctx"\nWHERE = "..process._owner"\n')
    graph = _graph_of({"profctx.core._scope": source, "profctx.process._owner": "", "profctx.timeline_x": ""})
    assert graph["profctx.core._scope"] == {}


def test_a_forbidden_arrow_in_the_top_layer_is_reported() -> None:
    graph = _graph_of({"profctx.analysis._x": "def f():\n    from ..process._owner import OWNER\n",
                       "profctx.process._owner": ""})
    assert any("profctx.analysis must never import profctx.process" in line for line in violations(graph))


# -- the architecture page's module table -------------------------------------------------------


def documented_modules() -> list[str]:
    """The modules named in the first column of the module table (`profctx/…py`)."""
    text = DOC.read_text()
    start = text.index("## Modules")
    end = text.find("\n## ", start + 1)
    table = text[start:end if end >= 0 else None]
    return re.findall(r"^\| `(profctx/[\w/]+\.py)` \|", table, re.MULTILINE)


def test_the_module_table_names_every_module_and_only_those() -> None:
    named = documented_modules()
    real = sorted(path.relative_to(PACKAGE.parent).as_posix() for path in PACKAGE.rglob("*.py"))
    assert len(named) == len(set(named)), "a module is listed twice"
    assert sorted(set(real) - set(named)) == [], "modules missing from docs/architecture.md's table"
    assert sorted(set(named) - set(real)) == [], "docs/architecture.md lists modules that do not exist"


def test_the_page_states_the_layers_the_test_holds() -> None:
    text = DOC.read_text()
    for name, _ in LAYERS:
        assert f"**{name}**" in text, f"layer {name} is not described in docs/architecture.md"
    for source, sink in FORBIDDEN:
        assert f"`{source}` → `{sink}`" in text, f"forbidden arrow {source} -> {sink} not stated"


# -- what the layer fixes change for a user ------------------------------------------------------

_CARRIED = '''
import json, logging, sys
import profctx
from profctx.backends import register
logging.basicConfig(level=logging.ERROR, stream=sys.stdout, format="%(message)s")
if sys.argv[1] == "registered":
    register("mine", "profctx.backends.recording:RecordingBackend")
snapshot = json.loads(sys.argv[2])
with profctx.adopt(snapshot) as scope:
    print("configured", profctx.is_configured(), scope.step)
'''


@pytest.mark.parametrize("registered", [True, False])
def test_a_config_naming_a_registered_backend_is_adopted_where_it_is_registered(
    registered: bool, tmp_path: Path
) -> None:
    # The config value checks only that `tool` is a name; the registry is asked by configure(),
    # in the process that runs it. A carried config naming a backend that process registered is
    # adopted; where it is not registered the call runs unprofiled and the log lists what is.
    import json
    import subprocess
    import sys

    config = profctx.ProfilerConfig(steps=[1], tool="mine", save_path=str(tmp_path), warmup=False)
    snapshot = {"v": 1, "scope": {"step": 1, "roles": [], "tags": {}}, "config": config.to_dict(),
                "rank": 0, "world_size": 1}
    out = subprocess.run([sys.executable, "-c", _CARRIED, "registered" if registered else "plain",
                          json.dumps(snapshot)], capture_output=True, text=True, check=True, timeout=120,
                         env={"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"})
    if registered:
        assert out.stdout.strip().splitlines()[-1] == "configured True 1"
    else:
        assert out.stdout.strip().splitlines()[-1] == "configured False None"  # refused: runs as the caller
        assert "tool: 'mine' is not valid; allowed: 'auto', 'torch'" in out.stdout
        assert "registered in this process" in out.stdout


# -- one vocabulary of capture states -------------------------------------------------------------

#: Modules whose ``status`` is something else: a Ray control reply's code, a doctor finding's level.
_OTHER_STATUS = {"profctx/engines/ray.py", "profctx/cli/doctor.py"}


def _status_strings(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Yield the string constants this code compares a ``status`` with, assigns to one, or records as one."""
    def is_status(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr == "status"
        if isinstance(node, ast.Name):
            return node.id == "status"
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "status")

    def strings(node: ast.AST | None) -> Iterator[tuple[str, int]]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value, node.lineno
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            for item in node.elts:
                yield from strings(item)
        elif isinstance(node, ast.IfExp):
            yield from strings(node.body)
            yield from strings(node.orelse)

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and (is_status(node.left) or any(map(is_status, node.comparators))):
            for side in (node.left, *node.comparators):
                yield from strings(side)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(map(is_status, targets)):
                yield from strings(node.value)
        elif isinstance(node, ast.keyword) and node.arg == "status":
            yield from strings(node.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "status":
                    yield from strings(value)


def test_capture_states_are_one_closed_vocabulary() -> None:
    # core._status.State is the one list; a status written, compared or recorded anywhere in the
    # package is one of its strings (what the manifest's JSON carries stays the same text).
    from typing import get_args

    from profctx.core._status import Ended, State

    allowed = set(get_args(State))
    assert set(get_args(Ended)) <= allowed
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel in _OTHER_STATUS:
            continue
        for text, line in _status_strings(ast.parse(path.read_text())):
            if text not in allowed:
                stray.append(f"{rel}:{line}: {text!r}")
    assert stray == [], "capture states outside core._status.State:\n" + "\n".join(stray)
    assert len(list(_status_strings(ast.parse("x.status = 'lve'\nif r.get('status') in ('ok', 'gone'): pass")))) == 3


def test_adopting_a_carried_config_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Receiving a snapshot configures a process that has no config of its own: not silently.
    import logging

    profctx.configure(steps=[1], tool="noop", save_path=str(tmp_path), warmup=False, exit_hooks=False,
                      run_id="carried-run")
    with profctx.profile_step(1):
        carrier = profctx.inject({})
    profctx.reset()
    with caplog.at_level(logging.INFO, logger="profctx"):
        for _ in range(3):
            with profctx.adopt(profctx.extract(carrier)):
                assert profctx.is_configured()
    said = [r.getMessage() for r in caplog.records if "carried in by a snapshot" in r.getMessage()]
    assert len(said) == 1 and "run carried-run" in said[0]
    profctx.reset()
