"""Wind-farm simulation harness and benchmarks (not part of the installed distribution)."""
