"""The benchmarks' and GPU checks' tools (each one's use: benchmarks/README.md)."""
