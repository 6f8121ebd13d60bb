"""``profctx verl-convert``: print the profctx config for a verl config, and what does not carry over."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from ..core._config import MAX_YAML_BYTES, EngineConfig, ProfilerConfig
from ..util._errors import ConfigError
from ..util._untrusted import open_regular

OK = 0
USAGE = 2


def register(subparsers: Any) -> None:
    """Add the ``verl-convert`` subcommand."""
    parser = subparsers.add_parser(
        "verl-convert",
        help="convert a verl profiler config into a profctx config and report what does not carry over",
        description="Print the profctx YAML config equivalent to a verl config, then the conversion report "
                    "as comment lines (one per verl field not carried over exactly, with the reason). CONFIG "
                    "is a verl YAML file (e.g. the .hydra/config.yaml of a verl run) or, with verl installed, "
                    "the name of one of its trainer configs (ppo_trainer, sft_trainer_engine...), composed "
                    "with Hydra as verl's entry point does. OVERRIDES are verl's key=value overrides; "
                    "@FILE reads them from FILE, one per line ('#' lines are comments).",
    )
    parser.add_argument("config", metavar="CONFIG", help="a verl YAML file, or a verl trainer config name")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="verl overrides, e.g. global_profiler.steps=[1,2], or @FILE")
    parser.add_argument("--verl-version", help="the verl version whose stage names to use (default: installed)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the converted config and its report; return 2 when the verl config cannot be read or converted."""
    from ..interop.verl import convert

    try:
        cfg = load(args.config, expand(list(args.overrides)))
        conversion = convert(cfg, args.verl_version)
    except (ConfigError, ValueError) as exc:
        print(f"profctx verl-convert: {exc}", file=sys.stderr)
        return USAGE
    print(render(conversion.config), end="")
    if conversion.notes:
        print("# not carried over exactly (verl field = value: why):")
        for note in conversion.notes:
            print(f"# - {note}")
    else:
        print("# every verl profiler field carried over exactly")
    return OK


def expand(overrides: list[str]) -> list[str]:
    """Return ``overrides`` with each ``@FILE`` replaced by FILE's lines (blank and ``#`` lines skipped).

    Each FILE is read as ``configure()`` reads a YAML file: a regular file (a FIFO or a device is
    refused, never waited on) of at most ``MAX_YAML_BYTES``, all FILEs together too. Raise
    :class:`ConfigError` (field ``overrides``) when FILE cannot be read or is over the cap.
    """
    out: list[str] = []
    left = MAX_YAML_BYTES
    for item in overrides:
        if not item.startswith("@"):
            out.append(item)
            continue
        text = read_capped(item[1:], "overrides", item, left,
                           "@FILE naming a readable file of overrides (all @FILEs together)")
        left -= len(text.encode("utf-8", "surrogatepass"))
        out += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return out


def read_capped(path: str, field: str, shown: str, limit: int, wanted: str) -> str:
    """Return the UTF-8 text of the regular file ``path``, refusing one over ``limit`` bytes (cap named).

    Opened without blocking and checked to be a regular file (:func:`profctx.util._untrusted.open_regular`),
    then read only up to the cap. Raise :class:`ConfigError` (``field``, ``shown``) saying ``wanted``.
    """
    try:
        with open_regular(path) as handle:
            raw = handle.read(limit + 1)
    except (OSError, ValueError) as exc:
        raise ConfigError(field, shown, f"{wanted} ({exc})") from None
    if len(raw) > limit:
        raise ConfigError(field, shown, f"{wanted} of at most {MAX_YAML_BYTES // 2**20} MiB "
                          "(MAX_YAML_BYTES, the cap configure() puts on a YAML file)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, shown, f"{wanted}, in UTF-8 ({exc})") from None


def load(source: str, overrides: list[str]) -> Any:
    """Return the verl config ``source`` with ``overrides`` applied, as an OmegaConf node.

    ``source`` is a YAML file, or the name of a trainer config of the installed verl composed with
    Hydra. Raise :class:`ConfigError` (field ``verl``) when neither works.
    """
    try:
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError("verl", source, "verl configs need omegaconf: pip install 'profctx[omegaconf]'") from None
    path = Path(source)
    try:
        if (path.exists() or path.is_symlink()) and not path.is_dir():
            from ..util._yaml import check_aliases

            # Read once, capped as configure() caps a YAML file, and never blocking (a FIFO, /dev/zero).
            text = read_capped(source, "verl", source, MAX_YAML_BYTES, "a verl YAML file")
            check_aliases(text)  # OmegaConf would expand an alias bomb for ever
            cfg = OmegaConf.create(text)
            if overrides:
                cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
            return cfg
        return _compose(source, overrides)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - OmegaConf and Hydra raise many unrelated types
        raise ConfigError("verl", source, f"a verl config that loads with these overrides ({exc})") from None


def _compose(name: str, overrides: list[str]) -> Any:
    try:
        import verl
        from hydra import compose, initialize_config_dir
    except ImportError:
        raise ConfigError("verl", name, "a verl YAML file, or a trainer config name with verl and hydra-core "
                          "installed") from None
    folder = Path(verl.__file__).parent / "trainer" / "config"
    if not (folder / f"{name}.yaml").is_file():
        names = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError("verl", name, f"a YAML file or one of verl's trainer configs: {', '.join(names)}")
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        return compose(config_name=name, overrides=overrides)


def render(config: ProfilerConfig) -> str:
    """Return ``config`` as YAML: the fields that differ from profctx's defaults (``profctx.configure`` reads it)."""
    import yaml

    data = _changed(config, ProfilerConfig(enable=False))
    if "engines" in data:
        data["engines"] = _changed(config.engines, EngineConfig())
    text: str = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    return text


def _changed(value: Any, default: Any) -> dict[str, Any]:
    full = value.to_dict() if isinstance(value, ProfilerConfig) else {
        f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    base = default.to_dict() if isinstance(default, ProfilerConfig) else {
        f.name: getattr(default, f.name) for f in dataclasses.fields(default)}
    out: dict[str, Any] = {}
    for key, item in full.items():
        if item != base.get(key) or key in ("enable", "steps"):
            out[key] = list(item) if isinstance(item, tuple) else (dict(item) if isinstance(item, dict) else item)
    return out
