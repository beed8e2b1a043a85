"""zodiac-edge agent: the Datalog engine and the edge runtime a turbine runs."""

__version__ = "0.1.0"
