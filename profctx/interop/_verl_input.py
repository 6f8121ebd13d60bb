"""Read a verl config into a plain dict, and check the shape of the verl values read from it.

The input is a mapping, an OmegaConf ``DictConfig`` or a path to a YAML file. OmegaConf is
imported only when the input is one of its nodes or holds an interpolation (``${...}``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..util._errors import ConfigError


def plain(cfg: object) -> dict[str, Any]:
    """Return verl config ``cfg`` as a plain dict with its interpolations resolved.

    Raise :class:`ConfigError` (field ``verl``) when ``cfg`` is none of the accepted forms, the
    YAML file cannot be read or is not a mapping, or an interpolation does not resolve.
    """
    if isinstance(cfg, (str, os.PathLike)):
        cfg = _read_yaml(Path(cfg))
    if type(cfg).__module__.startswith("omegaconf"):
        return _resolve(cfg)
    if isinstance(cfg, Mapping) or _is_dataclass(cfg):
        data = _to_plain(cfg)
        assert isinstance(data, dict)
        return _resolve(data) if _has_interpolation(data) else data
    raise ConfigError("verl", cfg, "a verl config: a mapping, an OmegaConf DictConfig, verl's ProfilerConfig "
                      "or a path to a YAML file")


def as_mapping(path: str, value: object) -> Mapping[str, Any]:
    """Return ``value``; raise :class:`ConfigError` naming verl field ``path`` unless it is a mapping."""
    if not isinstance(value, Mapping):
        raise ConfigError(path, value, "a mapping")
    return value


def as_flag(path: str, value: object) -> bool:
    """Return ``value``; raise :class:`ConfigError` naming verl field ``path`` unless it is a bool."""
    if isinstance(value, bool):
        return value
    raise ConfigError(path, value, "true or false")


def _is_dataclass(value: object) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _to_plain(value: object) -> object:
    """Return ``value`` with every mapping (verl's ``BaseConfig`` dataclasses included) a dict, sequences lists."""
    if type(value).__module__.startswith("omegaconf"):
        return _resolve(value)
    if isinstance(value, Mapping):
        return {str(k): _to_plain(v) for k, v in value.items()}
    if _is_dataclass(value):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)  # type: ignore[arg-type]
                if not f.name.startswith("_")}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    from ..util._yaml import BoundedSafeLoader

    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=BoundedSafeLoader)  # a SafeLoader
    except (OSError, yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: a NUL byte in the path
        raise ConfigError("verl", str(path), f"a readable verl YAML file ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError("verl", str(path), "a YAML mapping (a verl trainer config or its profiler blocks)")
    return data


def _has_interpolation(value: object) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, Mapping):
        return any(_has_interpolation(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_interpolation(v) for v in value)
    return False


def _resolve(cfg: object) -> dict[str, Any]:
    try:
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError("verl", "${...}", "verl's interpolations need omegaconf: pip install 'profctx[omegaconf]'") \
            from None
    try:
        node = cfg if type(cfg).__module__.startswith("omegaconf") else OmegaConf.create(cfg)  # type: ignore[arg-type]
        container = OmegaConf.to_container(node, resolve=True)  # type: ignore[call-overload]
    except Exception as exc:  # noqa: BLE001 - omegaconf raises several unrelated types
        raise ConfigError("verl", type(cfg).__name__, f"a config whose interpolations resolve ({exc})") from None
    if not isinstance(container, dict):
        raise ConfigError("verl", container, "a mapping (a verl trainer config or its profiler blocks)")
    return {str(k): v for k, v in container.items()}
