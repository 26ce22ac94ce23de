"""Helpers the tests and benchmarks share (never shipped in the package)."""
