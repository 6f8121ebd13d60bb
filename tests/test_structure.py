"""The package's shape: reset() ends all process state, no import cycles, a light ``import profctx``, value types."""

from __future__ import annotations

import ast
import contextvars
import importlib
import inspect
import logging
import pkgutil
import re
import subprocess
import sys
import threading
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

import profctx
from profctx.engines import EngineAdapter
from profctx.engines._base import EngineRequest, Outcome
from profctx.records import _manifest
from profctx.testing import capture

PACKAGE = Path(profctx.__file__).parent


def _module_names() -> list[str]:
    """Every module of the package, by dotted name (``profctx.engines._attach``...)."""
    names = ["profctx"]
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="profctx."):
        if info.name.rpartition(".")[2] != "__main__":  # runs the CLI when imported
            names.append(info.name)
    return sorted(names)


def _import_all() -> list[types.ModuleType]:
    """Import every module that imports here (a module needing an absent optional package is skipped)."""
    modules = []
    for name in _module_names():
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            missing = getattr(exc, "name", None) or ""
            if missing.startswith("profctx"):
                raise  # a broken import of our own is a bug, not an absent extra
    return modules


# -- reset() ends everything -------------------------------------------------------------------

_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, re.Pattern, frozenset)


def _is_immutable(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_is_immutable(v) for v in value)
    return isinstance(value, _IMMUTABLE)


def _is_code(value: Any) -> bool:
    """Modules, functions, classes and typing constructs: definitions, not state."""
    if isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
                          types.MethodType, staticmethod, classmethod, property)):
        return True
    if isinstance(value, (typing.TypeVar, typing.ParamSpec)) or type(value).__module__ == "typing":
        return True
    return isinstance(value, types.GenericAlias) or (callable(value) and hasattr(value, "__wrapped__"))


def _shallow(value: Any) -> Any:
    """A comparable picture of ``value``: containers by content, anything else by identity and repr."""
    if isinstance(value, dict):
        return ("dict", {k: _item(v) for k, v in value.items()})
    if isinstance(value, (list, set, frozenset, tuple)) or type(value).__name__ == "deque":
        return (type(value).__name__, [_item(v) for v in value])
    return _item(value)


def _item(value: Any) -> Any:
    if _is_immutable(value):
        return value
    if isinstance(value, (list, dict, set)):
        return (type(value).__name__, repr(value))  # a nested container: by content
    if isinstance(value, (type(threading.Lock()), type(threading.RLock()))):
        return ("lock", id(value), "locked" if "<locked" in repr(value) else "unlocked")
    return (type(value).__qualname__, id(value))


def _attributes(value: Any) -> dict[str, Any]:
    """``value``'s attributes, one level deep (``__slots__`` and ``__dict__``)."""
    names: list[str] = []
    for klass in type(value).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    names.extend(getattr(value, "__dict__", {}))
    found = {}
    for name in names:
        if name in ("__weakref__", "__dict__"):
            continue
        try:
            found[name] = _shallow(getattr(value, name))
        except AttributeError:
            found[name] = "<unset>"
    return found


def _picture(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return ("nan",)  # a NaN constant is the same value after reset, though it compares unequal to itself
    if isinstance(value, contextvars.ContextVar):
        return ("contextvar", _item(value.get()))
    if isinstance(value, logging.Logger):
        return ("logger", value.name, value.level, list(value.handlers))  # stdlib state profctx never sets
    if _is_immutable(value) or isinstance(value, (dict, list, set, frozenset, tuple)) \
            or type(value).__name__ == "deque":
        return _shallow(value)
    attributes = _attributes(value)
    if attributes:
        return (type(value).__qualname__, id(value), attributes)
    return _item(value)


def _defines(module: types.ModuleType, attr: str) -> bool:
    """Whether ``module``'s own source assigns ``attr`` at module level (rather than importing it)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return False
    return re.search(rf"^{re.escape(attr)}\s*[:=]", source, re.MULTILINE) is not None


def process_state() -> dict[str, Any]:
    """Every module-level variable of every loaded profctx module, pictured for comparison.

    A mutable object imported by several modules is pictured once, under the module defining it.
    """
    state: dict[str, Any] = {}
    where: dict[int, str] = {}
    for name, module in sorted(sys.modules.items()):
        if not (name == "profctx" or name.startswith("profctx.")) or module is None:
            continue
        for attr, value in vars(module).items():
            if attr.startswith("__") or _is_code(value):
                continue
            key = f"{name}.{attr}"
            if not _is_immutable(value):
                seen = where.get(id(value))
                if seen is not None:
                    if not _defines(module, attr):
                        continue
                    del state[seen]
                where[id(value)] = key
            state[key] = _picture(value)
    return state


def _differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    lines = []
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key, "<absent>"), after.get(key, "<absent>")
        if old != new:
            lines.append(f"{key}:\n    before reset-cycle: {old!r}\n    after reset():      {new!r}")
    return lines


class _LocalEngine(EngineAdapter):
    """An engine adapter whose engine is this process: it starts and stops nothing but answers."""

    engine = "local"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def _start(self, request: EngineRequest) -> Outcome:
        self.calls.append(f"start {request.step}")
        return Outcome()

    async def _stop(self, request: EngineRequest) -> Outcome:
        self.calls.append("stop")
        return Outcome()


@profctx.profiled(role="rollout")
def _rollout() -> str:
    return profctx.current().path


@pytest.fixture
def all_modules() -> Iterator[list[types.ModuleType]]:
    yield _import_all()


def test_every_module_imports(all_modules: list[types.ModuleType]) -> None:
    loaded = {m.__name__ for m in all_modules}
    for name in ("profctx.engines", "profctx.testing", "profctx.backends.torch", "profctx.backends.nsys",
                 "profctx.backends.npu", "profctx.backends.torch_memory", "profctx.backends.noop"):
        assert name in loaded


def _warm_up() -> None:
    """Do once what a first use does for good: the backend registry resolves ``recording`` to its class."""
    with capture(steps=[0]), profctx.profile_step(0):
        _rollout()
    profctx.reset()


def _use_profctx(save_path: Path) -> None:
    """Use what holds state: captures, an attached engine, a carried config, a block left open."""
    engine = _LocalEngine()
    profctx.configure(steps=[1, 2], mode="step", tool="recording", save_path=str(save_path), warmup=False,
                      engines={"roles": ["rollout"]})
    profctx.attach(engine)
    with profctx.profile_step(1):
        assert _rollout() == "rollout"
    assert engine.calls == ["start 1", "stop"]
    carrier = profctx.inject({})
    profctx.reset()
    with profctx.adopt(profctx.extract(carrier)):  # configures this process from the carried config
        assert profctx.is_configured()
        _rollout()
    with capture(steps=[5], mode="role") as found, profctx.profile_step(5):
        _rollout()
    assert [c.role for c in found] == ["rollout"]
    profctx.configure(steps=[3], tool="recording", save_path=str(save_path), warmup=False)
    profctx.attach(engine)
    outer = profctx.profile_step(3)
    outer.__enter__()  # left open: reset() must end it
    profctx.reset()
    outer.__exit__(None, None, None)


def test_reset_ends_everything(all_modules: list[types.ModuleType], tmp_path: Path) -> None:
    _warm_up()
    before = process_state()
    _use_profctx(tmp_path)
    profctx.reset()
    left = _differences(before, process_state())
    assert not left, "reset() left state behind:\n" + "\n".join(left)


class _SilentHook:
    """A role hook that starts nothing (what a plugin registering on the owner looks like)."""

    def enter(self, runtime: Any, scope: Any) -> object:
        return None

    def exit(self, runtime: Any, handle: object) -> None:
        pass

    async def aenter(self, runtime: Any, scope: Any) -> object:
        return None

    async def aexit(self, runtime: Any, handle: object) -> None:
        pass

    def check_config(self, config: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def reset(self) -> None:
        pass


def test_reset_check_sees_leftover_hooks(all_modules: list[types.ModuleType], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The check above must fail when reset() forgets something: here, the owner's hooks.
    from profctx.process._owner import OWNER, Owner

    end = Owner.end

    def end_keeping_hooks(self: Owner) -> None:
        hooks = list(self.hooks)
        end(self)
        self.hooks[:] = hooks

    _warm_up()
    before = process_state()
    monkeypatch.setattr(Owner, "end", end_keeping_hooks)
    _use_profctx(tmp_path)
    hook = _SilentHook()
    OWNER.add_hook(hook)
    profctx.reset()
    left = _differences(before, process_state())
    monkeypatch.undo()
    OWNER.remove_hook(hook)
    assert [line.split(":")[0] for line in left] == ["profctx.process._owner.OWNER"]
    assert "'hooks': ('list', [('_SilentHook'" in left[0]


def _rebound() -> set[str]:
    """Module-level names some function of the package rebinds (``global name``): state by construction."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Global):
                found.update(f"{module}.{name}" for name in node.names)
    return found


#: Every module-level variable a function rebinds, and what ``reset()`` leaves it at. A new one
#: must be added here, with a reset: the state check above only sees what ``_use_profctx`` touches.
REBOUND = {
    "profctx.backends.torch_memory._oom_folder": None,
    "profctx.engines._attach._atexit_installed": False,
    "profctx.engines._loop._loop": None,
    "profctx.engines._loop._thread": None,
}


def test_module_state_rebound_by_functions_is_known_and_ended_by_reset(
    all_modules: list[types.ModuleType], tmp_path: Path
) -> None:
    assert _rebound() == set(REBOUND)
    # The OOM watch needs CUDA to start; its folder is set as watch_oom would set it.
    memory = importlib.import_module("profctx.backends.torch_memory")
    memory._oom_folder = tmp_path / "oom"
    _use_profctx(tmp_path)  # starts the engine loop and installs the exit hook
    profctx.reset()
    for key, value in REBOUND.items():
        module, _, name = key.rpartition(".")
        assert getattr(sys.modules[module], name) is value, key


# -- import graph --------------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_imports(path: Path, name: str) -> set[str]:
    """The profctx modules ``name`` imports at module level (not under TYPE_CHECKING, not in functions)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def resolve(level: int, module: str | None) -> str:
        if level == 0:
            return module or ""
        base = package.split(".")
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                target = resolve(node.level, node.module)
                found.add(target)
                for alias in node.names:  # ``from . import _api`` imports a module
                    found.add(f"{target}.{alias.name}")
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(ast.parse(path.read_text(), str(path)).body)
    return found


def _paths() -> dict[str, Path]:
    """Module name -> its source file, for every module of the package."""
    paths: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return paths


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports at module level."""
    paths = _paths()
    graph = {}
    for name, path in paths.items():
        edges = set()
        for target in _module_imports(path, name):
            # ``from .x import y``: importing profctx.x.y imports every package above it too.
            while target and target not in paths:
                target = target.rpartition(".")[0]
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in paths and prefix != name and not name.startswith(prefix + "."):
                    edges.add(prefix)
        graph[name] = edges
    return graph


def test_type_checking_and_function_imports_are_not_edges(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nfrom . import a\nif TYPE_CHECKING:\n    from . import b\n"
                      "def f():\n    from . import c\n")
    assert _module_imports(source, "pkg.m") == {"typing", "typing.TYPE_CHECKING", "pkg", "pkg.a"}


# -- a light import ---------------------------------------------------------------------------


HEAVY = ("asyncio", "ssl", "profctx.engines", "profctx.cli", "torch")
#: What ``import profctx`` may load of the engines: the package (its names load on first use) and
#: the port through which the process layer serves them (``engines._host``: no asyncio, no HTTP).
LIGHT_ENGINES = ("profctx.engines", "profctx.engines._host")


def _heavy(name: str) -> bool:
    return name not in LIGHT_ENGINES and any(name == h or name.startswith(h + ".") for h in HEAVY)


def test_import_profctx_stays_light() -> None:
    # wrapt (profctx's one dependency) imports asyncio itself from version 2 on: what it loads
    # is its own cost, so it is imported first and only what profctx adds on top is checked.
    code = ("import sys, wrapt\n"
            "before = set(sys.modules)\n"
            "import profctx\n"
            "print(sorted(set(sys.modules) - before))\n")
    env = {"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    added = ast.literal_eval(out.stdout.strip())
    assert "profctx.process._block" in added
    assert [m for m in added if _heavy(m)] == []


def _fresh(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter that imports this checkout's profctx; return its output lines."""
    env = {"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip().splitlines()


def test_a_fresh_import_profctx_loads_no_heavy_module() -> None:
    # Nothing imported first: what a user's `import profctx` costs. wrapt (which imports asyncio
    # and ssl) waits for the first @profiled, and the decorator still works then.
    code = ("import sys\n"
            "import profctx\n"
            "print(sorted(sys.modules))\n"
            "@profctx.profiled(role='r')\n"
            "def f():\n"
            "    return profctx.current().role\n"
            "with profctx.profile_step(1):\n"
            "    print(f())\n")
    loaded, result = _fresh(code)
    modules = ast.literal_eval(loaded)
    assert "profctx.process._block" in modules and "profctx.process._decorate" in modules
    heavy = ("asyncio", "ssl", "torch", "ray", "wrapt", "profctx.engines", "profctx.cli", "logging", "json")
    assert [m for m in modules if m not in LIGHT_ENGINES and any(m == h or m.startswith(h + ".") for h in heavy)] \
        == []
    assert result == "None"  # not configured: the call goes straight to the function


def test_logging_waits_for_the_first_message() -> None:
    # `import profctx` leaves `logging` out (several ms); the first message still reaches the
    # "profctx" logger, at the level asked for, and a warning keyed once goes to DEBUG the second time.
    code = ("import sys\n"
            "import profctx\n"
            "from profctx.util import _log\n"
            "print('logging' in sys.modules)\n"
            "import logging\n"
            "seen = []\n"
            "class Keep(logging.Handler):\n"
            "    def emit(self, record):\n"
            "        seen.append((record.name, record.levelname, record.getMessage()))\n"
            "logging.getLogger('profctx').addHandler(Keep())\n"
            "logging.getLogger('profctx').setLevel(logging.DEBUG)\n"
            "_log.warn_once('k', 'first %s', 1)\n"
            "_log.warn_once('k', 'again %s', 2)\n"
            "_log.logger.error('bad %d', 3)\n"
            "print(seen)\n")
    loaded, seen = _fresh(code)
    assert loaded == "False"
    assert ast.literal_eval(seen) == [("profctx", "WARNING", "first 1"), ("profctx", "DEBUG", "again 2"),
                                      ("profctx", "ERROR", "bad 3")]


def test_no_module_import_profctx_loads_imports_heavy_modules() -> None:
    # The static twin of the check above, which also covers modules wrapt happens to load first.
    graph, paths = import_graph(), _paths()
    seen, todo = set(), ["profctx"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    assert "profctx.process._runtime" in seen and not any(_heavy(m) for m in seen)
    direct = {name: sorted(m for m in _module_imports(paths[name], name) if _heavy(m)) for name in seen}
    assert {name: found for name, found in direct.items() if found} == {}


# -- value types ----------------------------------------------------------------------------------


def test_scope_is_frozen_and_hashable_with_list_tags() -> None:
    scope = profctx.Scope(3, ("train", "fwd"), {"batch": [1, 2], "meta": {"k": [3]}})
    same = profctx.Scope(3, ("train", "fwd"), {"meta": {"k": [3]}, "batch": [1, 2]})
    assert hash(scope) == hash(same) and scope == same and len({scope, same}) == 1
    assert profctx.Scope(3, ("train",), {"batch": [1, 3]}) != profctx.Scope(3, ("train",), {"batch": [1, 2]})
    for name, value in (("step", 4), ("roles", ()), ("new", 1)):
        with pytest.raises(AttributeError):
            setattr(scope, name, value)
    with pytest.raises(AttributeError):
        del scope.step
    with pytest.raises(TypeError):
        scope.tags["batch"] = 0  # type: ignore[index]


def test_statuses_and_record_kinds_are_literals() -> None:
    assert typing.get_origin(_manifest.Status) is typing.Literal
    assert set(get_args(_manifest.Status)) == {"ok", "failed", "skipped", "interrupted"}
    assert set(get_args(_manifest.Kind)) == {"step", "role", "engine", "remote"}
    assert set(get_args(_manifest.Event)) == {"started", "finished"}
    hints = typing.get_type_hints(_manifest.Record)
    assert hints["status"] == _manifest.Status and hints["kind"] == _manifest.Kind
    assert hints["event"] == _manifest.Event
    # The capture's own status follows the same vocabulary where it ends.
    source = inspect.getsource(importlib.import_module("profctx.process._capture"))
    ended = set(re.findall(r'_finished\(\s*"(\w+)"', source))
    assert ended and ended <= set(get_args(_manifest.Status))


PUBLIC = ("profctx", "profctx.manifest", "profctx.analysis", "profctx.backends", "profctx.engines", "profctx.ray",
          "profctx.testing", "profctx.testing.strategies", "profctx.integrations", "profctx.integrations.lightning",
          "profctx.integrations.transformers", "profctx.interop", "profctx.interop.verl", "profctx.interop.structured")


@pytest.mark.parametrize("name", PUBLIC)
def test_public_modules_declare_their_names(name: str) -> None:
    # Each public module says what it exports, and exports only what exists.
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # an optional framework (ray, lightning, transformers, hypothesis) is absent
        pytest.skip(str(exc))
    declared = module.__dict__.get("__all__")
    assert isinstance(declared, list), f"{name} has no __all__"
    assert [n for n in declared if not hasattr(module, n)] == []
    assert len(declared) == len(set(declared))
