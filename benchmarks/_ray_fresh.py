"""A user's actor class for the registration benchmark: imports ``profctx`` (for ``@profiled``), not ``profctx.ray``.

Kept apart from ``_ray_actors`` on purpose: that module's ``Probe`` loads profctx's worker side in its
``__init__`` (to count control calls), so a join to it would find that work already done.
"""

from __future__ import annotations

import sys
from typing import Any

import profctx


class Fresh:
    """What a user's worker looks like to profctx: one ``@profiled`` method."""

    @profctx.profiled(role="work")
    def work(self) -> int:
        return 1


def nothing(actor: Any) -> None:
    """A call that does nothing: one Ray round trip to the actor (its floor)."""


def modules(actor: Any) -> list[str]:
    """The modules this actor process has imported."""
    return sorted(sys.modules)
