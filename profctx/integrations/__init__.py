"""Integrations with training frameworks, each through the hooks its framework publishes.

- :mod:`profctx.integrations.transformers`: a ``TrainerCallback`` for the Hugging Face ``Trainer``
  and the TRL trainers built on it (needs ``transformers``);
- :mod:`profctx.integrations.lightning`: a Lightning ``Profiler`` (needs ``lightning``).

Each module imports its framework; ``import profctx`` imports none of them.
"""

__all__: list[str] = []  # the integrations are its submodules, imported by name
