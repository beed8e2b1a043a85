"""Benchmarks of the ZodiacEdge paper: data set generators and measurement scripts."""
