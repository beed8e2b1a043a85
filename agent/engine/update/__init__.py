"""The update driver: what one update does (net changes), the hyper-node transitions of a rule
change, cost estimates, maintenance in topological order, and freeing what an update dropped."""
