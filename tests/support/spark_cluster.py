"""A real Spark standalone cluster on loopback, from the installed pyspark: one master and
some workers, each its own JVM, started with pyspark's ``bin/spark-class`` and stopped again.

pyspark's wheel ships the standalone Master and Worker classes and the launch scripts, so no
separate Spark download is needed. Ports are free ones picked here; every daemon writes its
log and work files under the given directory, and nothing is left running after ``stop``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT = 90.0  # seconds for the master to listen and every worker to register


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class StandaloneCluster:
    """``start()`` a master and ``workers`` workers of ``cores`` cores each; ``url`` is the
    ``spark://`` address to hand to ``spark-submit --master``."""

    directory: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.directory / "logs"),
            PYSPARK_PYTHON=sys.executable,
            # Short-lived daemons on tiny jobs: no optimising JIT (see tests/conftest.py).
            SPARK_DAEMON_JAVA_OPTS=os.environ.get("SPARK_SUBMIT_OPTS", ""),
        )
        return env

    def launch(self, name: str, *arguments: str) -> None:
        log = open(self.directory / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *arguments],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,
        )
        log.close()
        self.processes.append(process)

    def start(self) -> StandaloneCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        master = "org.apache.spark.deploy.master.Master"
        self.launch(
            "master", master, "--host", "127.0.0.1", "--port", str(self.port),
            "--webui-port", str(self.ui_port),
        )  # fmt: skip
        for n in range(self.workers):
            work = self.directory / f"worker{n}"
            work.mkdir(exist_ok=True)
            self.launch(
                f"worker{n}", "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
                "--webui-port", str(free_port()), "--work-dir", str(work), self.url,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while time.monotonic() < deadline:
                self.check_alive()
                if len(self.alive_workers()) == self.workers:
                    return self
                time.sleep(0.5)
        except BaseException:
            self.stop()  # (no Spark processes left behind by a failed start)
            raise
        self.stop()
        raise RuntimeError(f"the cluster did not start in {START_TIMEOUT:.0f} s: {self.logs()}")

    def state(self) -> dict:
        """The master's status page as JSON (workers, applications)."""
        address = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(address, timeout=5) as response:
            return json.load(response)

    def alive_workers(self) -> list[dict]:
        try:
            workers = self.state().get("workers", [])
        except (OSError, ValueError):  # not up yet: refused, or not yet the JSON page (a
            return []  # starting master once answered /json/ with its HTML page)
        return [worker for worker in workers if worker.get("state") == "ALIVE"]

    def check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                self.stop()
                raise RuntimeError(f"a cluster daemon exited early: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.directory.glob("*.log"))
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()
