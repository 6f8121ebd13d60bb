"""profctx util layer (see docs/architecture.md)."""
