"""One way to touch a file: only the file-access modules open, create, list, rename or delete files.

Every module of the package is read with ``ast``. A call that opens, creates, lists, renames or
deletes a file by path — ``open(...)``, ``os.open``, ``os.unlink``/``remove``/``rmdir``,
``os.scandir``/``listdir``/``walk``, ``os.mkdir``/``makedirs``, ``os.replace``/``rename``,
``os.symlink``/``link``, ``shutil.rmtree``/``move``/``copy*``, ``tempfile`` files, and the
``Path`` methods ``mkdir``, ``write_text``/``write_bytes``, ``read_text``/``read_bytes``,
``unlink``, ``rmdir``, ``touch``, ``iterdir``, ``glob``/``rglob``, ``symlink_to``/``hardlink_to``
and ``open(mode)`` — may appear only in the file-access layer (:data:`LAYER`), which walks from
held folder descriptors (``profctx/util/_fs.py``), or where :data:`ALLOWED` names the module,
the call and why it is not a path inside a save path or run folder (or what remains to move).

``os.open(..., dir_fd=...)`` and friends with a ``dir_fd`` keyword are descriptor calls: they are
allowed anywhere, since the descriptor came from the layer's walk. ``os.fdopen`` wraps a
descriptor already opened and checked, and is allowed too.

The self-tests at the bottom show the checker catches each kind of call.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import profctx

PACKAGE = Path(profctx.__file__).parent

#: The file-access layer: every call is theirs to make.
LAYER: frozenset[str] = frozenset({
    "profctx/util/_fs.py",  # held folder descriptors: walk, create, list, remove, read
    "profctx/util/_files.py",  # temporaries, sweeps and working folders, on top of _fs
    "profctx/util/_untrusted.py",  # the CLI's reads of a run folder (its own checks; the reader side's module)
})

#: ``module -> {call: why}``: calls by path outside the layer, each with its reason.
ALLOWED: dict[str, dict[str, str]] = {
    "profctx/util/_identity.py": {"open": "reads /proc/PPID/stat: no run folder"},
    "profctx/core/_config.py": {
        "open": "reads the user's own config file, named by the user, outside any run folder",
        "Path.mkdir": "creates save_path itself (the user's path, which may be a link) before any walk",
        "Path.open": "the write probe of save_path itself (O_EXCL), before the run writes anything",
        "Path.unlink": "removes that probe from save_path itself (the user's folder, not one below it)",
    },
    "profctx/interop/_verl_input.py": {"Path.read_text": "reads the user's own verl config file"},
    "profctx/cli/verl_convert.py": {
        "Path.glob": "lists the YAML files of the user's verl config folder",
    },
    "profctx/cli/_common.py": {"os.open": "opens os.devnull after a broken pipe"},
    "profctx/cli/doctor.py": {
        "Path.mkdir": "doctor's write probe of save_path itself (the user's path), undone at once",
        "Path.rmdir": "removes the folders that probe created, only when empty",
        "tempfile.NamedTemporaryFile": "the probe file in save_path itself (O_EXCL, random name)",
    },
    "profctx/backends/_base.py": {"open": "reads version.py of an installed package"},
    "profctx/backends/npu.py": {
        "Path.glob": "lists the folders torch_npu's own exporter wrote: it names them by path only (its API)",
        "Path.iterdir": "lists the files in torch_npu's output folder, by the path torch_npu gives (a reader only)",
    },
    "profctx/testing/__init__.py": {
        "tempfile.TemporaryDirectory": "a test helper's own fresh private folder (not a user's run folder)",
    },
}

OS_CALLS = {"open", "unlink", "remove", "rmdir", "scandir", "listdir", "walk", "mkdir", "makedirs", "replace",
            "rename", "renames", "symlink", "link", "removedirs"}
SHUTIL_CALLS = {"rmtree", "move", "copy", "copy2", "copyfile", "copytree", "copyfileobj_path"}
TEMPFILE_CALLS = {"NamedTemporaryFile", "TemporaryFile", "mkstemp", "mkdtemp", "TemporaryDirectory"}
PATH_METHODS = {"mkdir", "write_text", "write_bytes", "read_text", "read_bytes", "unlink", "rmdir", "touch",
                "iterdir", "glob", "rglob", "symlink_to", "hardlink_to"}


def calls(source: str) -> list[tuple[int, str]]:
    """Return ``(line, name)`` of each call by path in ``source`` (see the module's docstring)."""
    return list(_calls(source))


@functools.cache
def _module_calls(path: Path) -> list[tuple[int, str]]:
    return calls(path.read_text(encoding="utf-8"))


def _calls(source: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        keywords = {k.arg for k in node.keywords}
        if isinstance(func, ast.Name) and func.id == "open":
            yield node.lineno, "open"
        elif isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if owner == "os" and func.attr in OS_CALLS:
                if not keywords & {"dir_fd", "src_dir_fd", "dst_dir_fd"}:
                    yield node.lineno, f"os.{func.attr}"
            elif owner == "shutil" and func.attr in SHUTIL_CALLS:
                yield node.lineno, f"shutil.{func.attr}"
            elif owner == "tempfile" and func.attr in TEMPFILE_CALLS:
                yield node.lineno, f"tempfile.{func.attr}"
            elif owner in ("os", "shutil", "tempfile", "sys", "json", "re"):
                continue
            elif func.attr in PATH_METHODS:
                yield node.lineno, f"Path.{func.attr}"
            elif func.attr == "open" and (keywords & {"mode", "encoding"} or any(
                    isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)):
                yield node.lineno, "Path.open"  # a mode given: a path's open, not a runtime's


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def test_only_the_file_access_layer_touches_files_by_path() -> None:
    found = []
    for path in modules():
        name = _name(path)
        if name in LAYER:
            continue
        allowed = ALLOWED.get(name, {})
        for line, call in _module_calls(path):
            if call not in allowed:
                found.append(f"{name}:{line}: {call}")
    assert found == [], "calls by path outside the file-access layer (go through profctx/util/_fs.py):\n" + \
        "\n".join(found)


def test_every_allowance_is_still_needed() -> None:
    # An allowance nothing uses any more would let a new call in silently: each must match a call.
    unused = []
    for name, allowed in ALLOWED.items():
        path = PACKAGE.parent / name
        assert path.is_file(), f"{name}: no such module (remove its allowance)"
        used = {call for _, call in _module_calls(path)}
        unused += [f"{name}: {call}" for call in allowed if call not in used]
    assert unused == []


def test_the_layer_modules_exist() -> None:
    for name in LAYER:
        assert (PACKAGE.parent / name).is_file(), name


@pytest.mark.parametrize(("source", "expected"), [
    ("open(p, 'rb')", "open"),
    ("os.open(p, flags)", "os.open"),
    ("os.unlink(p)", "os.unlink"),
    ("os.remove(p)", "os.remove"),
    ("os.rmdir(p)", "os.rmdir"),
    ("os.scandir(p)", "os.scandir"),
    ("os.listdir(p)", "os.listdir"),
    ("os.walk(p)", "os.walk"),
    ("os.mkdir(p)", "os.mkdir"),
    ("os.makedirs(p, exist_ok=True)", "os.makedirs"),
    ("os.replace(a, b)", "os.replace"),
    ("os.rename(a, b)", "os.rename"),
    ("os.symlink(a, b)", "os.symlink"),
    ("shutil.rmtree(p)", "shutil.rmtree"),
    ("shutil.move(a, b)", "shutil.move"),
    ("tempfile.NamedTemporaryFile(dir=p)", "tempfile.NamedTemporaryFile"),
    ("path.mkdir(parents=True)", "Path.mkdir"),
    ("(save / 'x').write_text('t')", "Path.write_text"),
    ("path.write_bytes(b'')", "Path.write_bytes"),
    ("path.read_text()", "Path.read_text"),
    ("path.read_bytes()", "Path.read_bytes"),
    ("path.unlink(missing_ok=True)", "Path.unlink"),
    ("path.rmdir()", "Path.rmdir"),
    ("path.touch()", "Path.touch"),
    ("path.iterdir()", "Path.iterdir"),
    ("path.glob('*.json')", "Path.glob"),
    ("path.rglob('*')", "Path.rglob"),
    ("path.open('xb')", "Path.open"),
    ("path.open(mode='w')", "Path.open"),
])
def test_the_checker_catches_each_kind_of_call(source: str, expected: str) -> None:
    assert [call for _, call in calls(source)] == [expected]


@pytest.mark.parametrize("source", [
    "os.open(name, flags, dir_fd=fd)",  # relative to a held descriptor
    "os.unlink(name, dir_fd=fd)",
    "os.replace(a, b, src_dir_fd=fd, dst_dir_fd=fd)",
    "os.stat(name, dir_fd=fd, follow_symlinks=False)",
    "os.fdopen(fd, 'rb')",  # a descriptor already opened and checked
    "rt.open(scope, True, False, None)",  # a runtime's open, not a file's
    "self.open()",
    "text.replace('a', 'b')",
])
def test_the_checker_lets_descriptor_calls_and_other_methods_through(source: str) -> None:
    assert list(calls(source)) == []


# -- the layer's own checks ----------------------------------------------------------------------


def test_a_walk_refuses_a_link_at_any_component_below_the_root(tmp_path: Path) -> None:
    from profctx.util._fs import walk

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / "a").mkdir(parents=True)
    (tmp_path / "root" / "a" / "b").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="a link where profctx's folder belongs"):
        walk(tmp_path / "root", "a/b/c")
    assert list((tmp_path / "elsewhere").iterdir()) == []  # nothing made through the link
    with pytest.raises(OSError):
        walk(tmp_path / "root", "../elsewhere")


def test_remove_deletes_only_checked_regular_files(tmp_path: Path) -> None:
    import re

    from profctx.util._fs import walk

    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    root = tmp_path / "root"
    root.mkdir()
    (root / "link.json").symlink_to(outside)
    (root / "folder.json").mkdir()
    (root / "mine.json").write_text("{}")
    (root / "other.txt").write_text("")
    pattern = re.compile(r".*\.json")
    with walk(root) as folder:
        gone = {e.name: folder.remove(e.name, pattern) for e in folder.entries()}
    assert gone == {"link.json": False, "folder.json": False, "mine.json": True, "other.txt": False}
    assert outside.is_file() and (root / "link.json").is_symlink()


def test_open_read_refuses_links_fifos_and_hard_links(tmp_path: Path) -> None:
    from profctx.util._fs import walk

    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    root = tmp_path / "root"
    root.mkdir()
    (root / "soft").symlink_to(outside)
    os.link(outside, root / "hard")
    os.mkfifo(root / "fifo")
    (root / "plain").write_bytes(b"ok")
    with walk(root) as folder:
        assert folder.read("plain", 10) == b"ok"
        for name, why in (("soft", "link"), ("hard", "more than one link"), ("fifo", "not a regular file")):
            with pytest.raises(OSError) as caught:
                folder.read(name, 10)
            assert why in str(caught.value) or caught.value.errno == 40, name  # ELOOP for the link
