"""Durations as short texts (``850 us``, ``12.3 ms``, ``1.2 s``), for the tables people read."""

from __future__ import annotations

__all__ = ["seconds_text"]


def seconds_text(seconds: float) -> str:
    """Return ``seconds`` in us below a millisecond, in ms below a second, else in s (3 significant digits)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"
