"""Streams, events, queues and pinned host memory of one device (docs/architecture.md)."""
