"""Benchmarks: `rawgraph bench <name>` (timing helpers, result files, one module per bench)."""
