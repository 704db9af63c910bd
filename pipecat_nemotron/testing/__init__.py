"""Real protocol peers on loopback for tests and benchmarks (no pytest needed)."""
