"""Bridges from other configuration systems: verl's profiler config, Hydra/OmegaConf structured configs.

``profctx.interop.verl`` converts a verl trainer config (or its profiler blocks) into a
:class:`profctx.ProfilerConfig` and reports every verl field it could not carry over exactly.
``profctx.interop.structured`` holds the dataclass schema for ``OmegaConf.structured`` and Hydra.
Both are imported on demand: importing ``profctx`` does not import them.
"""

__all__: list[str] = []  # the bridges are its submodules, imported by name
