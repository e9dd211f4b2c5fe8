"""Helpers shared by the test suites and the benchmarks (not shipped in the wheel)."""
