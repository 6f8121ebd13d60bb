"""profctx process layer (see docs/architecture.md)."""
