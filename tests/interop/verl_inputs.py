"""The real verl inputs: verl's shipped trainer configs composed as its entry point composes them,
and the profiler overrides of verl's example scripts and profiling docs (fixtures/verl_0.9, copies
named in their headers). Also verl's effective behaviour, read through verl's own code."""

from __future__ import annotations

import copy
import functools
import re
import shlex
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "verl_0.9"
#: The verl release the tests run against (installed with --no-deps by the session fixture).
VERL_VERSION = "0.9.1"
#: What the example scripts' ``$HOME`` stands for here (the shell expands it before verl sees it).
HOME = "/home/user"
#: Override keys an example script sets that matter to profiling (the others set model, data, batch sizes).
_KEYS = re.compile(r"(profil|rollout\.name$|rollout\.(tensor|data|pipeline)_model_parallel_size$|lora)")


@dataclass(frozen=True)
class Input:
    """One real verl input: a trainer config name and the overrides applied to it, or a dump file."""

    name: str
    config: str
    overrides: tuple[str, ...] = ()
    yaml: Mapping[str, Any] | None = None  # a documented YAML snippet, merged onto the config
    dump: Path | None = None  # one of verl's _generated_* dumps, loaded as is
    tags: frozenset[str] = field(default_factory=frozenset)


def config_dir() -> Path:
    """Return the installed verl's ``trainer/config`` folder."""
    import verl

    return Path(verl.__file__).parent / "trainer" / "config"


def compose(item: Input) -> Any:
    """Return ``item`` as verl builds it: Hydra composition with overrides, then documented YAML merged.

    Compositions are cached (Hydra takes a good fraction of a second each); each call returns a copy.
    """
    import json

    from omegaconf import OmegaConf

    if item.dump is not None:
        return OmegaConf.load(item.dump)
    cfg = copy.deepcopy(_composed(item.config, item.overrides))
    if item.yaml is not None:
        cfg = OmegaConf.merge(cfg, json.loads(json.dumps(item.yaml)))  # struct mode, as verl's: unknown keys refused
    return cfg


@functools.cache
def _composed(config: str, overrides: tuple[str, ...]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        return hydra_compose(config_name=config, overrides=list(overrides))


def shipped_configs() -> list[Input]:
    """Return every top-level trainer config verl ships whose composition holds a profiler, and every dump."""
    out: list[Input] = []
    for path in sorted(config_dir().glob("*.yaml")):
        if path.name.startswith("_generated_"):
            item = Input(path.stem, path.stem, dump=path)
        else:
            item = Input(path.stem, path.stem)
        cfg = compose(item)
        if "global_profiler" in cfg or "profiler" in cfg:
            out.append(item)
    return out


def script_overrides(text: str, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Return the profiling overrides of one of verl's example scripts, with its defaults (or ``env``) filled in.

    ``$HOME`` is :data:`HOME`, so the result does not depend on this machine.
    """
    env = dict(env or {})
    values: dict[str, str] = {}
    for match in re.finditer(r"^(\w+)=\$\{(\w+):-(.*)\}\s*$", text, re.M):
        name, var, default = match.groups()
        raw = env.get(var, default).replace("$HOME", HOME)
        values[name] = shlex.split(raw)[0] if raw.strip() else raw
    out: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#") or "=" not in line or line.startswith(("python", "export")):
            continue
        key, _, value = line.partition("=")
        if not re.fullmatch(r"[\w.]+", key) or "." not in key or not _KEYS.search(key):
            continue
        value = re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), value)
        parts = shlex.split(value, comments=True)
        out.append(f"{key}={parts[0] if parts else 'null'}")
    return tuple(out)


def script_inputs() -> list[Input]:
    """Return each example script with its defaults, and with each mode its header offers (discrete, rollout off)."""
    out: list[Input] = []
    variants: dict[str, list[dict[str, str]]] = {
        "run_qwen2_5_7b_torch_profile": [{}, {"PROFILE_DISCRETE": "True"}, {"PROFILE_ROLLOUT": "False"},
                                         {"PROFILE_RANKS_ALL": "True"}, {"PROFILE_SCHED_ACTIVE": "2"},
                                         {"PROFILE_ROLLOUT_TOKEN_START": "10", "PROFILE_ROLLOUT_TOKEN_END": "40"}],
        "run_qwen2_5_vl_7b_torch_memory": [{}],
        "run_qwen3_8b_npu_profile_discrete": [{}, {"PROFILE_DISCRETE": "False"}],
        "run_qwen3_8b_npu_profile_e2e": [{}, {"PROFILE_DISCRETE": "True"}],
    }
    for stem, envs in variants.items():
        text = (FIXTURES / f"{stem}.sh").read_text(encoding="utf-8")
        for env in envs:
            suffix = "".join(f"-{k.lower()}={v}" for k, v in env.items())
            out.append(Input(f"{stem}{suffix}", "ppo_trainer", script_overrides(text, env), tags=frozenset({"script"})))
    return out


def _blocks(text: str) -> Iterator[tuple[str, str]]:
    """Yield (language, body) of every code block of a Markdown or reStructuredText page."""
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        yield match.group(1), match.group(2)
    for match in re.finditer(r"^( *)\.\. code(?:-block)?:: (\w+)\n\n((?:\1 +\S.*\n|[ \t]*\n)+)", text, re.M):
        yield match.group(2), textwrap.dedent(match.group(3))


def doc_inputs() -> list[Input]:
    """Return every profiler example of verl's profiling docs: YAML snippets and Hydra override lists."""
    import yaml

    out: list[Input] = []
    for page in ("nsight_profiling.md", "torch_profiling.md", "ascend_profiling_en.rst"):
        text = (FIXTURES / page).read_text(encoding="utf-8")
        for index, (lang, body) in enumerate(_blocks(text)):
            if "profil" not in body:
                continue
            name = f"{page.split('.')[0]}#{index}"
            if lang == "yaml":
                try:
                    data = yaml.safe_load(body)
                except yaml.YAMLError:
                    data = None
                if isinstance(data, dict):
                    out.append(Input(name, "ppo_trainer", yaml=data, tags=frozenset({"doc", "yaml"})))
                continue
            overrides = []
            for line in body.splitlines():
                parts = shlex.split(line.rstrip("\\ "), comments=True)
                overrides += [p for p in parts if "=" in p and re.fullmatch(r"[\w.]+", p.partition("=")[0])
                              and "." in p.partition("=")[0]]
            if overrides:
                out.append(Input(name, "ppo_trainer", tuple(overrides), tags=frozenset({"doc"})))
    return out


def all_inputs() -> list[Input]:
    """Return every real verl input the tests convert."""
    return shipped_configs() + script_inputs() + doc_inputs()


def require_verl() -> None:
    """Skip unless the real verl wheel is importable (the session fixture installs it)."""
    pytest.importorskip("verl.utils.profiler")
