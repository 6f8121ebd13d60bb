"""profctx core layer (see docs/architecture.md)."""
