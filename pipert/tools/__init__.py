"""Measurement beside the runtime: reference step, profiles, fidelity, link checks (docs/architecture.md)."""
