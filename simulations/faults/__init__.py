"""Fault runs: the real agent processes, the real cloud publisher and a real Mosquitto, with
one kind of fault injected again and again, and a verdict at the end.

    python -m simulations.faults.broker_kills --seconds 180

See each module's docstring for its fault and what it checks.
"""
