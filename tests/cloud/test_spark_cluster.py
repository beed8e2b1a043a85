"""The cloud job on a real Spark standalone cluster, not only in local mode.

A master and two one-core workers run on loopback (``tests/support/spark_cluster.py``, from the
installed pyspark), and the job is submitted as docs/cloud.md says:
``spark-submit --master spark://... cloud/zodiac_cloud_cli.py materialise ...``. The program
has every kind of hyper-node the job evaluates differently (a symmetric-transitive closure,
aggregates whose UDFs run in the workers' Python processes, a comparison and a bind), and its
result must be the engine's, fact for fact. The test also checks that the work really ran on
the workers: each of them started an executor for the application.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.engine import Reasoner
from agent.engine.program.rdf import read_facts
from tests.support.spark_cluster import StandaloneCluster, spark_home

pytestmark = [pytest.mark.spark, pytest.mark.process, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "tests" / "golden" / "rs1_ds1_12"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> StandaloneCluster:
    started = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    yield started
    started.stop()


def test_the_job_on_a_standalone_cluster_gives_the_engines_model(cluster, tmp_path: Path):
    out = tmp_path / "out"
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master", cluster.url,
        "--conf", "spark.driver.host=127.0.0.1",
        "--executor-memory", "1g",
        "--conf", f"spark.executor.extraJavaOptions={os.environ.get('SPARK_SUBMIT_OPTS', '')}",
        str(ROOT / "cloud" / "zodiac_cloud_cli.py"), "materialise",
        "--rules", str(CASE / "program.rules"),
        "--facts", str(CASE / "facts.nt"),
        "--out", str(out),
        "--quiet",
        "--local-below", "0",  # every hyper-node in Spark jobs, on the workers
        "--spark", "always",  # (a small input: auto would run it on the engine)
    ]  # fmt: skip
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("SPARK_HOME", None)
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:] + cluster.logs()

    reasoner = Reasoner()
    reasoner.add_rules(CASE / "program.rules")
    reasoner.add_facts(CASE / "facts.nt")
    wanted = {fact for fact in reasoner.facts() if len(fact) == 3}
    got = set(read_facts(out / "facts.nt"))
    assert got == wanted, f"missing {sorted(wanted - got)[:5]}, extra {sorted(got - wanted)[:5]}"

    # Both workers ran an executor of this application (their work directories say so).
    for n in range(cluster.workers):
        executors = list((cluster.directory / f"worker{n}").glob("app-*/*"))
        assert executors, f"worker {n} ran no executor: {cluster.logs()}"
    finished = cluster.state().get("completedapps", [])
    assert any(app.get("name") == "zodiac-cloud" for app in finished), finished
