"""What ``profctx.reset()`` ends besides the owner: resets that stateful modules register themselves.

A module with process-wide state of its own (the engines' loop and exit hook, a backend's watch)
registers its reset here when it is imported, so ``profctx.reset()`` ends exactly the modules
that were loaded, without knowing them by name (a module never imported has nothing to end).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

_Reset = TypeVar("_Reset", bound=Callable[[], None])

#: The registered resets, in the order their modules registered them. Registration is wiring
#: (like the backend registry), so ``profctx.reset()`` keeps the list.
_RESETS: Final[list[Callable[[], None]]] = []


def on_reset(reset: _Reset) -> _Reset:
    """Make ``profctx.reset()`` call ``reset`` (once, however often it is registered); return it (a decorator).

    ``reset`` returns the module's state to a fresh process's value; it must not raise.
    """
    if reset not in _RESETS:
        _RESETS.append(reset)
    return reset


def run_resets() -> None:
    """Call every registered reset, in registration order (``process/_api.reset``)."""
    for reset in tuple(_RESETS):
        reset()
