"""One HTTP port for ``/metrics``, ``/healthz`` and ``/readyz`` (agent and cloud service).

A small ``http.server`` rather than prometheus_client's own server, so that the health
endpoints share the port. Each request runs on its own daemon thread: a scrape never blocks
the agent's loop, and a stuck loop does not stop ``/healthz`` from saying so."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent.config import ConfigError
from agent.observability.health import Verdict

log = logging.getLogger("zodiac.metrics")

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ObservabilityServer:
    """Serves ``metrics()`` (Prometheus text) and the two verdicts (JSON, 200 or 503)."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        metrics: Callable[[], bytes],
        alive: Callable[[], Verdict],
        ready: Callable[[], Verdict],
        option: str = "metrics.listen",
    ) -> None:
        routes = {
            "/metrics": lambda: (200, METRICS_TYPE, metrics()),
            "/healthz": lambda: _verdict(alive()),
            "/readyz": lambda: _verdict(ready()),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    code, kind, body = (
                        404,
                        "text/plain",
                        b"not found: /metrics, /healthz, /readyz\n",
                    )
                else:
                    try:
                        code, kind, body = route()
                    except Exception as error:  # noqa: BLE001 - answer, never kill the server
                        log.exception("metrics endpoint failed")
                        code, kind, body = 500, "text/plain", f"{error}\n".encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:  # noqa: A002
                log.debug("http " + format % args)

        host, port = address
        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as error:
            raise ConfigError(
                f"{option} {host}:{port}: cannot listen there ({error.strerror or error})"
            ) from None
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> ObservabilityServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _verdict(verdict: Verdict) -> tuple[int, str, bytes]:
    body = json.dumps(verdict.as_dict()).encode() + b"\n"
    return (200 if verdict.ok else 503), "application/json", body
