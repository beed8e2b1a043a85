"""What an operator watches on a running agent (docs/operations.md): Prometheus metrics
(``metrics.py``), the health verdicts (``health.py``) and the HTTP port serving both
(``server.py``). Off unless ``[metrics] listen`` is set; ``prometheus_client`` is imported only
then."""
