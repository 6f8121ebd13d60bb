"""The backend protocol: how profctx drives one device profiler."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from ..util._fs import Folder
from ..util._identity import Identity

if TYPE_CHECKING:
    from ..core._config import ProfilerConfig

#: What ``Backend.stop`` returns: a function that writes the files and returns their final paths.
#: profctx runs it off the training thread; it must not touch the profiler's start/stop state.
Finish = Callable[[], Sequence[Path]]


@dataclass
class CaptureSpec:
    """Everything a backend needs to run one capture.

    ``folder`` exists and is absolute; files go into it named from ``stem``. ``at``, when given,
    holds ``folder`` open (profctx walked to it from the save path without following a link):
    write through it (``at.write``, ``at.replacing``, ``working_folder(at)``), never by the path,
    so the folder renamed and replaced by a link during the step redirects nothing. profctx
    closes it once the capture's files are written.
    ``metadata`` is the identity to embed in the trace. A backend appends to ``notes``
    anything the user should read in the manifest (an option it could not honour).
    """

    capture_id: str
    steps: tuple[int, ...]
    roles: tuple[str, ...]
    folder: Path
    stem: str
    identity: Identity
    run_id: str
    contents: tuple[str, ...]
    options: Mapping[str, Any]
    compress: bool
    metadata: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    at: Folder | None = None


@runtime_checkable
class Backend(Protocol):
    """A device profiler. One instance per process; at most one capture live at a time.

    ``start`` and ``stop`` are called on the same thread. ``range`` is only called while a
    capture is live. Errors raised by any method are caught by profctx, logged once and
    recorded in the manifest.
    """

    name: ClassVar[str]

    def prepare(self) -> None:
        """Do one-time expensive set-up (imports, warm-up) outside any profiled step."""

    def start(self, spec: CaptureSpec) -> None:
        """Start capturing into ``spec.folder``."""

    def stop(self) -> Finish:
        """Stop capturing; return the function that writes the files."""

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Return a context manager marking a named range in the live capture."""

    def step(self) -> None:
        """Mark a sub-step boundary (for backends with schedules); may do nothing."""


def check_config(backend_cls: type[Any], config: ProfilerConfig) -> None:
    """Call the backend class's optional ``check_config(config)``; it raises ``ConfigError``."""
    check = getattr(backend_cls, "check_config", None)
    if check is not None:
        check(config)


def named_unselected(config: ProfilerConfig) -> bool:
    """Whether ``config`` names this process (its ``rank``, and ``group`` if any) as one that never captures.

    Such a process (a group member the driver's selection leaves out) needs no device profiler:
    a backend's ``check_config`` skips its environment checks there (is the tool installed, can
    it record) and checks only the values. Where the rank is not in the config it is not known
    yet, and everything is checked.
    """
    return config.rank is not None and not config.selects(config.group, config.rank)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it (or its parent package's code)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def torch_cuda_built() -> bool | None:
    """Whether the installed torch is a CUDA (or ROCm) build; ``None`` when torch is not installed.

    A torch already imported answers itself; otherwise the build is read from ``torch/version.py``
    without importing torch (seconds and about 200 MB), so a process that cannot capture checks a
    config for free. Where that file cannot be read, torch is imported.
    """
    module: Any = sys.modules.get("torch")
    if module is None:
        built = _built_from_version_file()
        if built is not None:
            return built
        try:
            module = importlib.import_module("torch")
        except ImportError:
            return None
    return bool(module.backends.cuda.is_built())


def torch_version() -> str:
    """Return the installed torch's version, read without importing it (``"?"`` when unknown)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(getattr(torch, "__version__", "?"))
    import importlib.metadata  # tens of milliseconds: only for the message of a refused config

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _built_from_version_file() -> bool | None:
    import ast  # only the nsys and torch_memory checks read the file

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or ())
    if not locations:
        return None
    try:
        with open(Path(locations[0]) / "version.py", encoding="utf-8") as file:
            tree = ast.parse(file.read())
    except (OSError, SyntaxError, ValueError):
        return None
    found: dict[str, object] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            found[target.id] = value.value
    if "cuda" not in found:
        return None
    return found.get("cuda") is not None or found.get("hip") is not None


def no_files() -> Sequence[Path]:
    """A :data:`Finish` for backends that write nothing."""
    return ()
