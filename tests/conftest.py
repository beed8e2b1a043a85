"""Shared test configuration.

Hypothesis profiles:

* ``ci`` (the default): no deadline (CI machines are slow and noisy), the default 100 examples,
  and no ``too_slow`` health check (engine-sized examples are legitimately slow to generate).
* ``quick``: 10 examples, for ``make test-quick``.
* ``thorough``: ten times the examples, for hunting bugs locally:
  ``HYPOTHESIS_PROFILE=thorough make test``.
* ``long``: 120 times the examples, for one file at a time, outside CI:
  ``HYPOTHESIS_PROFILE=long pytest tests/engine/test_incremental_differential.py``.

Tiers (markers, listed in pyproject.toml): ``spark`` (the test uses Spark; the tests of the
``spark`` fixture run in one xdist group, so one JVM serves them all), ``process`` (the test starts
an OS process: a broker, an agent, a CLI, a container) and ``slow`` (longer than about five
seconds). ``spark`` and ``process`` are set here from the fixtures a test uses and from its
module's ``pytestmark``; a test that starts a process without either mark fails, so that the
quick tier (``make test-quick``: ``-m "not spark and not process and not slow"``) really
starts none.

Fixtures: private MQTT brokers (``broker``, ``make_broker``), a small real filesystem that
fills up (``small_disk``, a tmpfs) and the one SparkSession of the
pytest session (``spark``; one per pytest-xdist worker that needs it), shared by the Spark job's
tests and the Spark benchmark's smoke test.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support.broker import Broker, DeployedBroker, mosquitto_available

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
)
# The edit loop (make test-quick): a tenth of the examples.
settings.register_profile("quick", parent=settings.get_profile("ci"), max_examples=10)
settings.register_profile("thorough", parent=settings.get_profile("ci"), max_examples=1000)
# For a long hunt outside CI (hours): the stateful machines then run 3,600-7,200 examples each.
settings.register_profile("long", parent=settings.get_profile("ci"), max_examples=12000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")


# ------------------------------------------------------------------------- tiers
# Fixtures whose tests start processes or Spark: the marks follow from them.
PROCESS_FIXTURES = {"broker", "make_broker", "make_deployed_broker", "small_disk"}
SPARK_FIXTURES = {"spark"}
# The events an audit hook sees when Python starts a process (sys.addaudithook).
PROCESS_EVENTS = {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                  "os.system", "os.exec"}  # fmt: skip
_running: dict[str, object] = {"item": None, "started": []}


def pytest_configure(config: pytest.Config) -> None:
    # The tests' JVMs run short jobs on tiny data: the optimising JIT compiler (C2) never pays
    # back its compile time there, and stopping at C1 makes the Spark tests about 1.5x faster
    # (the aggregates' golden case: 22-30 s -> 16-19 s for its first run in a fresh JVM).
    # SPARK_SUBMIT_OPTS reaches every driver: the fixture's session, the CLI and spark-submit.
    os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    sys.addaudithook(_audit_processes)


def _audit_processes(event: str, args: tuple) -> None:
    """Refuse a process started by a test marked neither ``process`` nor ``spark``."""
    item = _running["item"]
    if item is None or event not in PROCESS_EVENTS:
        return
    _running["started"].append(f"{event} {str(args[:2])[:200]}")
    raise RuntimeError(
        f"{item.nodeid} starts a process ({event}) but is not marked `process`: "
        "add `pytestmark = pytest.mark.process` to its module (or mark the test)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark by fixtures; put the Spark group first and the slow tests next, so that the
    longest work units start early on the two workers (the scheduler hands them out in
    collection order)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & SPARK_FIXTURES:  # the session's SparkSession: one worker, one JVM
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.xdist_group("spark"))
        if names & PROCESS_FIXTURES:
            item.add_marker(pytest.mark.process)

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("xdist_group") is not None:
            return 0
        long = any(item.get_closest_marker(name) for name in ("slow", "spark"))
        return 1 if long else 2

    items.sort(key=rank)  # stable: the order within each rank is the collection's


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    allowed = any(item.get_closest_marker(name) for name in ("process", "spark"))
    _running["item"] = None if allowed else item
    _running["started"] = []
    yield
    _running["item"] = None


@pytest.fixture(autouse=True)
def _no_unmarked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that started a process without its mark, even where the code under test
    caught the guard's error."""
    yield
    started = _running["started"]
    if started and _running["item"] is request.node:
        pytest.fail(
            f"not marked `process` but started: {'; '.join(started[:3])}", pytrace=False
        )


# ------------------------------------------------------------------------- private MQTT brokers
# Real mosquitto processes on free ports of 127.0.0.1 (see tests/support/broker.py); the system
# broker on 1883 is never used, so tests can restart, crash and reconfigure theirs.


def _require_mosquitto() -> None:
    if not mosquitto_available():
        # A failure, not a skip: a suite that silently skips the broker tests proves nothing.
        pytest.fail("mosquitto / mosquitto_passwd not installed (apt-get install mosquitto)")


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One plain private broker for the whole session: anonymous clients, persistence on.

    Shared, so tests must use their own client ids and topics (don't restart it: use
    ``make_broker`` for that).
    """
    _require_mosquitto()
    with Broker(tmp_path_factory.mktemp("broker")) as shared:
        yield shared


@pytest.fixture
def make_broker(
    tmp_path: Path,
) -> Iterator[Callable[..., Broker]]:
    """Factory for started private brokers with special settings, all stopped at teardown.

    ``make_broker(users={"dev1": "pw"}, persistence=False)`` accepts `Broker`'s keyword
    arguments; each broker gets its own directory under the test's ``tmp_path``.
    """
    _require_mosquitto()
    yield from started_brokers(Broker, tmp_path, "broker")


@pytest.fixture
def make_deployed_broker(tmp_path: Path) -> Iterator[Callable[..., DeployedBroker]]:
    """Like ``make_broker``, for brokers of the shipped configuration (``deploy/mosquitto/``):
    ``make_deployed_broker(farms={"farm1": ["t1", "t2"]})`` (`DeployedBroker`)."""
    _require_mosquitto()
    yield from started_brokers(DeployedBroker, tmp_path, "deployed")


def started_brokers(kind, tmp_path: Path, prefix: str) -> Iterator[Callable[..., object]]:
    """The body of a broker-factory fixture: ``kind(tmp_path / prefixN, **kwargs)`` started
    on demand, every one stopped at teardown (Mosquitto or the embedded broker)."""
    made: list = []

    def make(**kwargs: object):
        made_broker = kind(tmp_path / f"{prefix}{len(made)}", **kwargs)
        made.append(made_broker)
        return made_broker.start()

    yield make
    for made_broker in made:
        made_broker.stop()


# ------------------------------------------------------------------------- a small real disk
class SmallDisk:
    """A tmpfs of a few MiB: a real filesystem that runs out of space (ENOSPC, which SQLite
    reports as "database or disk is full"), filled and freed by the test."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.filler = mount / ".filler"

    def fill(self) -> None:
        """Take every free byte, down to the last page (a file of zeros grown until ENOSPC)."""
        with open(self.filler, "ab", buffering=0) as filler:
            for chunk in (1 << 16, 4096, 512):
                try:
                    while True:
                        filler.write(bytes(chunk))
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
        assert shutil.disk_usage(self.mount).free < 4096

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A private 8 MiB tmpfs under the test's ``tmp_path`` (``mount -t tmpfs``: root, as in
    the project's containers). A failure, not a skip, where it cannot be mounted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs for the full-disk tests: {done.stderr.strip()}")
    try:
        yield SmallDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# ------------------------------------------------------------------------- Spark
@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The session's one SparkSession (local mode): a JVM and Python workers take seconds to
    start, so every test that needs Spark shares it. Fails (no skip) without pyspark.

    One shuffle partition, no adaptive query execution and no whole-stage code generation: the
    tests' data is tiny, and every Spark job's fixed cost (a task per partition, re-planning
    after each stage, compiling generated Java for each new plan) is most of their time. The
    job's own defaults (several partitions, generated code) run in the CLI tests and the
    standalone cluster test."""
    try:
        from cloud.spark.session import local_session, require_pyspark

        require_pyspark()
    except ImportError as error:
        pytest.fail(f"the Spark tests cannot run: {error}", pytrace=False)
    session = local_session(
        "local[2]",
        app_name="zodiac-cloud-tests",
        shuffle_partitions=1,
        extra={"spark.sql.adaptive.enabled": "false", "spark.sql.codegen.wholeStage": "false"},
    )
    yield session
    session.stop()
