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

from ..util._errors import ConfigError

#: The verl release lines whose stage names are known, by the first release of each: 0.6 (0.5 and
#: 0.6: ``fsdp_workers.py``, the critic's stages unnamed), 0.7 (the same workers, every stage named)
#: and 0.8 (0.8.0, 0.9.x and the 0.10 development line: ``engine_workers.py``).
VERSIONS: Final = ("0.6", "0.7", "0.8")
#: The version a conversion follows when none is given and no verl is installed.
LATEST: Final = "0.8"

#: version -> verl role -> the stages annotated in that role's worker (a test reads them back from
#: each release's wheel). ``ref`` is the reference model's stage, which in verl's default (hybrid)
#: setup runs inside the actor's worker.
STAGES: Final[Mapping[str, Mapping[str, tuple[str, ...]]]] = {
    "0.6": {
        # The hybrid worker annotates rollout_generate too. Annotations that give no role are named
        # after the method by verl's backends: the critic's and reward model's, and every Megatron
        # worker stage (update_actor, compute_log_prob, ...), listed with the FSDP names.
        "actor": ("actor_update", "actor_compute_log_prob", "rollout_generate", "update_actor", "compute_log_prob",
                  "generate_sequences"),
        "ref": ("ref_compute_log_prob", "compute_ref_log_prob"),
        "critic": ("compute_values", "update_critic"),
        "reward_model": ("compute_rm_score",),
        "sft": ("train_batch",),
    },
    "0.7": {
        "actor": ("actor_update", "actor_compute_log_prob", "rollout_generate"),
        "ref": ("ref_compute_log_prob",),
        "critic": ("compute_values", "critic_update"),
        "reward_model": ("compute_rm_score",),
        "sft": ("train_batch",),
    },
    "0.8": {
        # The critic is a TrainingWorker, whose only annotated method is train_batch; there is no
        # reward-model worker to profile.
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

    0.5 and 0.6 follow 0.6's names, 0.7 its own, 0.8 and later 0.8's. Raise :class:`ConfigError`
    (field ``verl_version``) for a requested value that is not such a version.
    """
    if requested is None:
        installed = installed_version()
        number = _major_minor(installed) if installed is not None else None
        found = _key(number) if number is not None else None
        return found or LATEST
    allowed = f"a verl version, 0.5 or newer (stage names known for {', '.join(VERSIONS)} and later)"
    number = _major_minor(requested) if isinstance(requested, str) else None
    key = _key(number) if number is not None else None
    if key is None:
        raise ConfigError("verl_version", requested, allowed)
    return key


def _key(number: tuple[int, int]) -> str | None:
    if number < (0, 5):
        return None
    if number < (0, 7):
        return "0.6"
    return "0.7" if number < (0, 8) else "0.8"


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
