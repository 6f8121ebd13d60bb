"""profctx records layer (see docs/architecture.md)."""
