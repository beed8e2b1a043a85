"""Helpers the tests share: the reference evaluator, strategies, brokers, agent processes, Spark
clusters."""
