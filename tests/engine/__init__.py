"""The engine (agent/engine): language, evaluation, incremental maintenance, the zodiac-edge
command line; differential tests against tests/support/reference.py."""
