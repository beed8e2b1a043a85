"""Shared test configuration.

Hypothesis profiles:

* ``ci`` (the default): no deadline (CI machines are slow and noisy), the default 100 examples,
  and no ``too_slow`` health check (engine-sized examples are legitimately slow to generate).
* ``thorough``: ten times the examples, for hunting bugs locally:
  ``HYPOTHESIS_PROFILE=thorough make test``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", parent=settings.get_profile("ci"), max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")
