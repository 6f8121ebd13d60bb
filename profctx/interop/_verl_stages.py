"""Name the stages verl profiles, per verl version, and pick the version a conversion follows.

The names are those verl's workers pass to ``DistProfiler.annotate(role=...)``; profctx's role
filter matches the names a user gives ``profile_step(role=...)``, so a converted config selects
verl's stages by these names. They changed between versions (the ``fsdp_workers.py`` /
``megatron_workers.py`` of 0.8 against the ``engine_workers.py`` of 0.9), and a test checks
the 0.9 table against the annotations in the installed verl wheel.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final

from .._errors import ConfigError, one_of

#: The verl versions whose stage names are known: 0.8 (legacy workers, January 2026) and 0.9
#: (engine workers; 0.9.0, 0.9.1 and the 0.10 development line).
VERSIONS: Final = ("0.8", "0.9")
#: The version a conversion follows when none is given and no verl is installed.
LATEST: Final = "0.9"

#: version -> verl role -> the stages annotated in that role's worker. ``ref`` is the reference
#: model's stage, which in verl's default (hybrid) setup runs inside the actor's worker.
STAGES: Final[Mapping[str, Mapping[str, tuple[str, ...]]]] = {
    "0.8": {
        # fsdp_workers.py / megatron_workers.py: the hybrid worker annotates rollout_generate too.
        "actor": ("actor_update", "actor_compute_log_prob", "rollout_generate"),
        "ref": ("ref_compute_log_prob",),
        "critic": ("compute_values", "critic_update"),
        "reward_model": ("compute_rm_score",),
        "sft": ("train_batch",),
    },
    "0.9": {
        # engine_workers.py: the critic is a TrainingWorker, whose only annotated method is train_batch.
        "actor": ("actor_compute_log_prob", "actor_update"),
        "ref": ("ref_compute_log_prob",),
        "critic": ("train_batch",),
        "sft": ("train_batch",),
    },
}
#: The profctx role under which rollout engines are driven (``engines.roles``).
ROLLOUT_ROLE: Final = "rollout"


def resolve_version(requested: object) -> str:
    """Return the stage table key for ``requested`` (a version string, or ``None``: the installed verl's).

    An installed verl older than 0.9 follows 0.8's names and a newer one 0.9's. Raise
    :class:`ConfigError` (field ``verl_version``) for a requested version that is not a version
    string, or not one of :data:`VERSIONS`.
    """
    if requested is None:
        installed = installed_version()
        if installed is None:
            return LATEST
        number = _major_minor(installed)
        return "0.8" if number is not None and number < (0, 9) else "0.9"
    allowed = f"a verl version whose stage names profctx knows: {one_of(VERSIONS)} (or 0.10)"
    if not isinstance(requested, str):
        raise ConfigError("verl_version", requested, allowed)
    number = _major_minor(requested)
    if number == (0, 8):
        return "0.8"
    if number in ((0, 9), (0, 10)):  # the development line after 0.9 keeps 0.9's workers
        return "0.9"
    raise ConfigError("verl_version", requested, allowed)


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.strip().split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


@functools.cache
def installed_version() -> str | None:
    """Return the installed verl distribution's version, or ``None`` when verl is not installed (read once)."""
    from importlib import metadata

    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return None
