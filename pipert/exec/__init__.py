"""The action interpreter: runs one rank's program on real units (docs/architecture.md)."""
