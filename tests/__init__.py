"""The test suite: one folder per area (engine, agent, cloud, simulation, docs),
helpers in support/; tests/conftest.py holds the shared fixtures and markers."""
