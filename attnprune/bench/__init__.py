"""Benchmarks: one module per target, each a command (``attnprune bench <target>``)."""
