"""The wind-farm simulation, its brokers, the benchmarks' smoke runs and data generators."""
