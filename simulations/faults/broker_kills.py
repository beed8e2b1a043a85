"""Kill the broker with SIGKILL again and again while the cloud publishes bundles, and check that
recovery never storms: at most one full state per lost bundle, and every device converges.

    python -m simulations.faults.broker_kills --seconds 180 [--devices 3] [--seed 0]

What runs, all of it the product: a private Mosquitto (persistence on, saved every second), the
cloud's :class:`~cloud.publisher.Publisher` in this process, and ``--devices`` agents as
``python -m agent.cli run`` processes. The publisher sends each device a new
version of its ``base`` stream every ``--interval`` seconds; meanwhile the broker is killed at
random moments (after 0.5-6 s up, by default) and restarted 0.2-2 s later from its persistence
file. A kill loses what the broker acknowledged since its last save: bundles the cloud was told
were delivered, which the device then never receives. The next bundle is a version gap, the
device reports it, and the publisher must answer it with one full state, not one per status.

After ``--seconds`` the kills stop, each device gets one more bundle (a loss in the last
seconds shows up as a gap too) and the run waits until every device has applied its last
version. The agents are stopped and their state files read back (``zodiac-agent status``).

Counted, per device and in all:

* published: bundles the publisher signed and sent (difference bundles and full states);
* lost: bundles published that the device never received (no log line applied, refused or
  duplicate names their version: the agents log at debug level for this), and in how many
  runs of consecutive versions (a kill loses whatever the broker held for the device);
* full states: full-state bundles sent in answer to gap reports;
* gap refusals: bundles the devices refused as ``version_gap`` (several per loss: whatever
  arrives before the full state).

The run fails (exit status 1) when more full states were sent than bundles lost, for a device or
in all, or when a device did not converge to the publisher's last version.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.protocol.keys import generate_key_pair, load_private_key
from agent.protocol.messages import Bundle
from cloud.bundles import BundleCutter, Target
from cloud.publisher import Publisher
from simulations.mosquitto import Broker, mosquitto_available

REPO = Path(__file__).resolve().parents[2]
FARM = "farm1"
STREAM = "base"
KEY_ID = "cloud"
RULES = {"hot": "hot: <Hot>(X) :- <temp>(X, T) and COMP(T, >, 50) ."}


@dataclass
class Options:
    seconds: float = 180.0
    devices: int = 3
    interval: float = 0.2  # seconds between two bundles to one device
    seed: int = 0
    min_up: float = 0.5  # the broker runs this long at least between two kills...
    max_up: float = 6.0  # ... and at most
    min_down: float = 0.2  # and stays down this long at least...
    max_down: float = 3.0  # ... and at most
    settle: float = 90.0  # seconds the end waits for every device to converge
    directory: Path | None = None  # default: a temporary directory, removed afterwards


@dataclass
class DeviceResult:
    device: str
    published: int = 0
    full_states: int = 0
    lost: int = 0
    holes: int = 0  # runs of consecutive lost versions (one kill may lose several bundles)
    gap_refusals: int = 0
    last_version: int = 0  # the publisher's
    applied: int | None = None  # the device's state file, read after the run
    last_error: dict | None = None

    @property
    def converged(self) -> bool:
        return self.applied == self.last_version

    @property
    def ok(self) -> bool:
        return self.converged and self.full_states <= self.lost


@dataclass
class Result:
    seconds: float
    kills: int
    devices: list[DeviceResult] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(getattr(d, name) for d in self.devices)

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.devices) and self.total("full_states") <= self.total("lost")

    def as_dict(self) -> dict:
        return {
            "seconds": round(self.seconds, 1),
            "broker_kills": self.kills,
            "published": self.total("published"),
            "lost": self.total("lost"),
            "holes": self.total("holes"),
            "full_states": self.total("full_states"),
            "gap_refusals": self.total("gap_refusals"),
            "converged": all(d.converged for d in self.devices),
            "ok": self.ok,
            "devices": [
                {
                    "device": d.device,
                    "published": d.published,
                    "lost": d.lost,
                    "holes": d.holes,
                    "full_states": d.full_states,
                    "gap_refusals": d.gap_refusals,
                    "last_version": d.last_version,
                    "applied": d.applied,
                    "converged": d.converged,
                    "last_error": d.last_error,
                }
                for d in self.devices
            ],
        }

    def lines(self) -> list[str]:
        out = [
            f"{self.seconds:.0f} s, {self.kills} broker kills (kill -9, restarted from its file)",
            f"bundles published: {self.total('published')}",
            f"bundles lost (acknowledged by the broker, never received): {self.total('lost')}, "
            f"in {self.total('holes')} runs of consecutive versions",
            f"full states sent (answers to gap reports): {self.total('full_states')}",
            f"bundles refused as version gaps: {self.total('gap_refusals')}",
        ]
        for d in self.devices:
            state = "converged" if d.converged else "NOT converged"
            out.append(
                f"  {d.device}: published {d.published}, lost {d.lost} ({d.holes} runs), "
                f"full states {d.full_states}, gap refusals {d.gap_refusals}; publisher's last "
                f"version {d.last_version}, applied {d.applied}: {state}"
            )
        verdict = "OK" if self.ok else "FAILED"
        out.append(f"{verdict}: at most one full state per lost bundle, every device converged")
        return out


class CountingPublisher(Publisher):
    """The product's publisher, recording every bundle it sends (device, version, full)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[str, int, bool]] = []
        self.client.reconnect_delay_set(1, 2)  # the broker is back within seconds

    def publish(self, device: str, bundle: Bundle, *, correlation: bytes | None = None) -> None:
        super().publish(device, bundle, correlation=correlation)
        self.sent.append((device, bundle.version, bundle.full_state))


class AgentProcess:
    """``python -m agent.cli run --config CONFIG``, its log in a file."""

    def __init__(self, directory: Path, device: str, broker: Broker, keys: Path) -> None:
        self.device = device
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "agent.toml"
        self.log = directory / "agent.log"
        # Debug level: a duplicate after the first is logged there only, and the run counts
        # every bundle a device received.
        self.config.write_text(
            f"""device = "{device}"
farm = "{FARM}"
database = "{device}.db"

[broker]
host = "{broker.host}"
port = {broker.port}
keepalive = 5
reconnect_min_delay = 2
reconnect_max_delay = 8

[keys]
trusted_keys = "{keys}"

[log]
level = "DEBUG"
format = "json"
"""
        )
        self.process: subprocess.Popen | None = None

    def start(self) -> AgentProcess:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agent.cli",
                    "run",
                    "--config",
                    str(self.config),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
        return self

    def stop(self, timeout: float = 20) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def received_versions(self) -> tuple[set[int], int]:
        """The versions of ``base`` this agent received (applied, refused or duplicate), and
        how many it refused as version gaps."""
        received: set[int] = set()
        gaps = 0
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("message") not in ("applied", "refused", "duplicate"):
                continue
            version = _version_of(entry)
            if entry.get("stream") != STREAM or version is None:
                continue
            received.add(version)
            gaps += entry.get("reason") == "version_gap"
        return received, gaps

    def saved_state(self) -> dict:
        """``zodiac-agent status`` of the stopped agent: what its file holds."""
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "agent.cli",
                "status",
                "--config",
                str(self.config),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        try:
            return json.loads(result.stdout)
        except json.JSONDecodeError:
            return {"healthy": False, "error": result.stderr.strip()}


def _version_of(entry: dict) -> int | None:
    """The bundle version a log line is about: its ``version``, or else the version in the
    cutter's bundle id (``<device>:<stream>:<version>:<hex>``; an agent that does not log the
    version still names the bundle)."""
    version = entry.get("version")
    if isinstance(version, int):
        return version
    parts = str(entry.get("bundle_id") or "").split(":")
    return int(parts[-2]) if len(parts) >= 4 and parts[-2].isdigit() else None


class BrokerKills:
    """One run (see the module docstring)."""

    def __init__(self, options: Options, directory: Path, say=print) -> None:
        self.options = options
        self.directory = directory
        self.say = say
        self.rng = random.Random(options.seed)
        self.devices = [f"t{i + 1}" for i in range(options.devices)]
        self.broker = Broker(
            directory / "broker", log_types=("error", "warning", "notice", "information")
        )
        keys = directory / "keys"
        private, _ = generate_key_pair(keys, KEY_ID)
        key_file = directory / f"{KEY_ID}.key"
        private.rename(key_file)  # not among the keys the devices trust
        self.keys = keys
        self.private_key = load_private_key(key_file)
        self.stop_publishing = threading.Event()
        self.counter = 0
        self.kills = 0

    def run(self) -> Result:
        self.broker.start()
        publisher = CountingPublisher(
            FARM,
            BundleCutter(self.directory / "cloud.db", FARM),
            {STREAM: RULES},
            self.private_key,
            KEY_ID,
            host=self.broker.host,
            port=self.broker.port,
            client_id="zodiac-cloud-broker-kills",
        )
        self.publisher = publisher.start()
        elapsed = 0.0
        agents = [
            AgentProcess(self.directory / d, d, self.broker, self.keys).start()
            for d in self.devices
        ]
        try:
            self._wait(lambda: all(self._online(d) for d in self.devices), 60, "agents online")
            for device in self.devices:
                self._send(device)
            started = time.monotonic()
            sender = threading.Thread(target=self._publish_continually, daemon=True)
            sender.start()
            self._kill_continually(started + self.options.seconds)
            self.stop_publishing.set()
            sender.join()
            elapsed = time.monotonic() - started
            self.say(f"kills stopped after {elapsed:.0f} s ({self.kills}); settling")
            self._settle()
        finally:
            for agent in agents:
                agent.stop()
            publisher.stop()
            self.broker.stop()
        return self._result(agents, elapsed)

    # ------------------------------------------------------------------ faults and load
    def _publish_continually(self) -> None:
        while not self.stop_publishing.is_set():
            for device in self.devices:
                self._send(device)
            self.stop_publishing.wait(self.options.interval)

    def _send(self, device: str) -> None:
        self.counter += 1
        target = Target(rules=dict(RULES), facts={("temp", device, self.counter)})
        self.publisher.send(device, STREAM, target)

    def _kill_continually(self, until: float) -> None:
        options = self.options
        while True:
            up = self.rng.uniform(options.min_up, options.max_up)
            if time.monotonic() + up >= until:
                time.sleep(max(0.0, until - time.monotonic()))
                return
            time.sleep(up)
            self.broker.kill()
            self.kills += 1
            time.sleep(self.rng.uniform(options.min_down, options.max_down))
            self.broker.start()
            if self.kills % 10 == 0:
                self.say(f"{self.kills} kills, {len(self.publisher.sent)} bundles published")

    # ------------------------------------------------------------------ the end
    def _settle(self) -> None:
        """Everyone reconnected, one more bundle each (a loss at the very end becomes a gap
        too), then wait until every device reports the publisher's last version."""
        self._wait(lambda: self.publisher.client.is_connected(), 30, "publisher reconnected")
        time.sleep(3)  # the agents reconnect (back-off up to 2 s) and resume their sessions
        for device in self.devices:
            self._send(device)
        self._wait(self._converged, self.options.settle, "devices converged", fail=False)

    def _converged(self) -> bool:
        return all(
            self._applied(device) == self.publisher.cutter.version(device, STREAM)
            for device in self.devices
        )

    def _applied(self, device: str) -> int | None:
        status = self.publisher.statuses.get(device)
        return None if status is None else status.applied.get(STREAM)

    def _online(self, device: str) -> bool:
        status = self.publisher.statuses.get(device)
        return status is not None and status.online

    def _wait(self, condition, timeout: float, what: str, *, fail: bool = True) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.publisher.lock:
                if condition():
                    return True
            time.sleep(0.1)
        if fail:
            raise RuntimeError(f"timed out waiting for {what}")
        self.say(f"timed out waiting for {what}")
        return False

    def _result(self, agents: list[AgentProcess], elapsed: float) -> Result:
        result = Result(seconds=elapsed, kills=self.kills)
        for agent in agents:
            device = agent.device
            sent = [(v, full) for d, v, full in self.publisher.sent if d == device]
            received, gaps = agent.received_versions()
            saved = agent.saved_state()
            error = saved.get("last_error")
            lost = {v for v, _ in sent} - received
            result.devices.append(
                DeviceResult(
                    device=device,
                    published=len(sent),
                    full_states=sum(full for _, full in sent),
                    lost=len(lost),
                    holes=sum(1 for v in lost if v - 1 not in lost),
                    gap_refusals=gaps,
                    last_version=self.publisher.cutter.version(device, STREAM),
                    applied=(saved.get("applied") or {}).get(STREAM),
                    last_error=error if isinstance(error, dict) else None,
                )
            )
        return result


def run(options: Options, say=print) -> Result:
    """One run in ``options.directory`` (or a temporary directory, removed afterwards)."""
    if options.directory is not None:
        options.directory.mkdir(parents=True, exist_ok=True)
        return BrokerKills(options, options.directory.resolve(), say).run()
    with tempfile.TemporaryDirectory(prefix="zodiac-broker-kills-") as directory:
        return BrokerKills(options, Path(directory), say).run()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.faults.broker_kills",
        description="Kill -9 the MQTT broker at random moments while the cloud publisher sends "
        "bundles to real agent processes; check that at most one full state is sent per lost "
        "bundle and that every device converges. Exit 1 if not.",
    )
    parser.add_argument("--seconds", type=float, default=180.0, help="how long to kill (180)")
    parser.add_argument("--devices", type=int, default=3, help="agent processes (3)")
    parser.add_argument(
        "--interval", type=float, default=0.2, help="seconds between bundles to a device (0.2)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill times (0)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="keep the run's files here (default: temporary)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.seconds <= 0 or args.devices < 1 or args.interval <= 0:
        print("broker_kills: --seconds, --devices and --interval must be positive", file=sys.stderr)
        return 2
    if not mosquitto_available():
        print(
            "broker_kills: mosquitto is not installed (apt-get install mosquitto)", file=sys.stderr
        )
        return 2
    options = Options(
        seconds=args.seconds,
        devices=args.devices,
        interval=args.interval,
        seed=args.seed,
        directory=args.dir,
    )
    say = (lambda _line: None) if args.json else (lambda line: print(line, flush=True))
    result = run(options, say)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print("\n".join(result.lines()))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
