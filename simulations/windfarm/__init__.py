"""The wind-farm simulation: many edge agents, one cloud, one broker, the ambient-temperature
anomaly scenario of the ZodiacEdge paper end to end, with a Markdown report and plots.

    python -m simulations.windfarm --turbines 30 --duration 60

See ``simulations/windfarm/run.py`` for the order of a run and ``farm.py`` for the scenario.
"""
