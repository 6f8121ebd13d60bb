"""``profctx demo``: a miniature PPO-shaped loop on a local Ray cluster, profiled by profctx.

:func:`run` starts Ray, runs the loop and returns the captures read back from the manifest.
"""

from ._loop import DemoOptions, run

__all__ = ["DemoOptions", "run"]
