"""The simulated farm: where the turbines stand, what their sensors read, and what goes wrong.

Everything here is deterministic for a given seed, so a run can be repeated and a test can
predict the right diagnosis.

Layout. Turbines stand on a grid (``columns`` per row, default the square root of N rounded
up), ids ``wt001``.. in row order. The layout facts the cloud's program
(``rules/windfarm/farm.rules``) starts from are ``adjacentTo(a, b)`` for grid neighbours to the
right and below, ``partOfFarm(t, farm)`` and the farm's forecast temperature; the program makes
turbines at most two grid steps apart neighbours.

Sensors. Every turbine reports, each reading period, its ambient temperature (the forecast plus
a fixed per-turbine offset in [-0.3, 0.3] plus noise in [-0.15, 0.15], rounded to 0.1), wind
speed, power output (from a power curve) and nacelle temperature. Noise is bounded (a clipped
Gaussian) so that the scenario's thresholds decide the same way on every run.

Scenario (ZodiacEdge section 3): at ``fault_at`` the *broken* turbine's ambient sensor fails
(``stuck``: it reads 85.0 degrees, the power-on value of a common digital sensor, from then on;
``drift``: its error grows by 0.5 degree per second up to 25; ``frozen``: it repeats the value
it read when it froze, within the forecast's band). Two seconds later a warm air mass
reaches the *warm* turbine's corner of the farm over five seconds: +3 degrees on every turbine
within two grid steps of it, +4.8 on the warm turbine itself (it stands in a sheltered hollow).
Only the two turbines deviate from the forecast by more than 4 degrees (base rule b1): both
become suspicious (a frozen sensor does not: only the window rules of the ``windows`` stream,
one value over 20 readings in 30 s, diagnose it, as FrozenSensorWindTurbine). The neighbours'
median tells them apart: the broken reading is far from it
(SensorAnomalyWindTurbine), the warm turbine's is close to it while the neighbours are warmer
than forecast too (AmbientTemperatureChangeConfirmed).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

FARM_ID = "north-sea-1"
FORECAST = 12.0  # degrees Celsius: the farm's forecast ambient temperature
STUCK_VALUE = 85.0
DRIFT_RATE = 0.5  # degrees per second
DRIFT_MAX = 25.0
WARM_PLATEAU = 3.0  # degrees added within two grid steps of the warm turbine
WARM_PEAK = 4.8  # degrees added at the warm turbine itself
WARM_RAMP = 5.0  # seconds for the warm air mass to arrive fully
WARM_DELAY = 2.0  # seconds between the sensor fault and the warm air mass
SUSPICIOUS_DEVIATION = 4.0  # degrees from the forecast: base rule b1's threshold

TEMPERATURE = "hasAirTemperatureMesurement"
WIND = "hasWindSpeed"
POWER = "hasPowerOutput"
NACELLE = "hasNacelleTemperature"
SUSPICION = "AmbientTemperatureSuspicion"
SENSOR_ANOMALY = "SensorAnomalyWindTurbine"
FROZEN_SENSOR = "FrozenSensorWindTurbine"  # rules/windfarm/streams/windows.rules
FROZEN_WINDOW = 30.0  # seconds: that stream's window of ambient readings
FROZEN_READINGS = 20  # the readings of one value in it that make a sensor frozen
CHANGE_CONFIRMED = "AmbientTemperatureChangeConfirmed"
ANOMALY_STREAM = "anomaly/ambient-temperature"


def bounded_noise(rng: random.Random, sigma: float, limit: float) -> float:
    """Gaussian noise clipped to [-limit, limit]: realistic jitter, predictable extremes."""
    return max(-limit, min(limit, rng.gauss(0.0, sigma)))


@dataclass(frozen=True)
class Turbine:
    id: str
    row: int
    column: int

    def steps_to(self, other: Turbine) -> int:
        """Grid steps (Manhattan distance): the neighbour relation's notion of distance."""
        return abs(self.row - other.row) + abs(self.column - other.column)


@dataclass
class Farm:
    """The turbines, their layout facts, and the scenario's two protagonists."""

    turbines: list[Turbine]
    columns: int
    broken: str  # the turbine whose ambient sensor fails
    warm: str  # the turbine that sees a real local change of temperature
    farm_id: str = FARM_ID

    @classmethod
    def grid(cls, n: int, columns: int | None = None) -> Farm:
        if n < 5:
            raise ValueError("a farm needs at least 5 turbines (a median of 3 neighbours)")
        columns = columns or math.ceil(math.sqrt(n))
        width = len(str(n))
        turbines = [
            Turbine(f"wt{i + 1:0{max(3, width)}d}", i // columns, i % columns) for i in range(n)
        ]
        # The warm turbine: one step in from the first corner (so that its neighbourhood is
        # full); the broken one: the turbine farthest from it.
        warm = min(turbines, key=lambda t: (abs(t.row - 1) + abs(t.column - 1), t.id))
        broken = max(turbines, key=lambda t: (t.steps_to(warm), t.id))
        return cls(turbines, columns, broken.id, warm.id)

    def by_id(self, turbine_id: str) -> Turbine:
        return next(t for t in self.turbines if t.id == turbine_id)

    def layout_facts(self) -> list[tuple]:
        """What the cloud knows before reasoning, from two sources that name a turbine
        differently: the SCADA system (its device id: adjacency in the layout grid, the serial
        number) and the asset registry (``registry_name``: farm membership, the serial
        number). The farm program's key rule on the serial number merges the two names."""
        at = {(t.row, t.column): t for t in self.turbines}
        facts: list[tuple] = [("hasForecastAirTemperature", self.farm_id, FORECAST)]
        for number, t in enumerate(self.turbines, start=1):
            serial = f"SN-{self.farm_id}-{number:05d}"
            facts.append(("hasSerial", t.id, serial))
            facts.append(("hasSerial", self.registry_name(t.id), serial))
            facts.append(("partOfFarm", self.registry_name(t.id), self.farm_id))
            for dr, dc in ((0, 1), (1, 0)):
                other = at.get((t.row + dr, t.column + dc))
                if other is not None:
                    facts.append(("adjacentTo", t.id, other.id))
        return facts

    @staticmethod
    def registry_name(turbine_id: str) -> str:
        """The asset registry's name of a turbine (``wt003`` -> ``registry:WT-003``)."""
        return f"registry:WT-{turbine_id.removeprefix('wt')}"

    def reading_name(self, turbine_id: str) -> str:
        """The name a turbine's controller gives its readings: every third turbine's
        controller was configured from the asset registry and uses its registry name, the
        others their device id; owl:sameAs makes both reach the same reasoning."""
        index = next(i for i, t in enumerate(self.turbines) if t.id == turbine_id)
        return self.registry_name(turbine_id) if index % 3 == 2 else turbine_id

    def merged_names(self) -> int:
        """How many turbine names the farm graph merges (two per turbine)."""
        return 2 * len(self.turbines)

    def neighbours(self, turbine_id: str) -> list[str]:
        """Turbines at most two grid steps away (what farm.rules derives; used for checks)."""
        me = self.by_id(turbine_id)
        return [t.id for t in self.turbines if t.id != me.id and t.steps_to(me) <= 2]


@dataclass
class SensorModel:
    """Readings of every turbine at a given scenario time (seconds since readings began)."""

    farm: Farm
    fault_at: float
    sensor_fault: str = "stuck"  # or "drift"
    seed: int = 0
    offsets: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.offsets = {t.id: rng.uniform(-0.3, 0.3) for t in self.farm.turbines}
        self.rngs = {t.id: random.Random(f"{self.seed}:{t.id}") for t in self.farm.turbines}

    @property
    def warm_at(self) -> float:
        return self.fault_at + WARM_DELAY

    def true_temperature(self, turbine_id: str, t: float) -> float:
        """The air temperature at the turbine (no sensor noise, no sensor fault)."""
        temperature = FORECAST + self.offsets[turbine_id]
        if t <= self.warm_at:
            return temperature
        ramp = min(1.0, (t - self.warm_at) / WARM_RAMP)
        warm = self.farm.by_id(self.farm.warm)
        steps = self.farm.by_id(turbine_id).steps_to(warm)
        if steps == 0:
            return temperature + WARM_PEAK * ramp
        if steps <= 2:
            return temperature + WARM_PLATEAU * ramp
        return temperature

    def temperature_reading(self, turbine_id: str, t: float, rng: random.Random) -> float:
        """What the ambient sensor reports: the truth plus noise, or the fault's value."""
        value = self.true_temperature(turbine_id, t) + bounded_noise(rng, 0.07, 0.15)
        if turbine_id == self.farm.broken and t >= self.fault_at:
            if self.sensor_fault == "stuck":
                return STUCK_VALUE
            if self.sensor_fault == "frozen":
                return self.frozen_value()
            value += min(DRIFT_MAX, DRIFT_RATE * (t - self.fault_at + 1.0))
        return round(value, 1)

    def readings(self, turbine_id: str, t: float) -> list[tuple]:
        """One reading message: the four sensors of one turbine at time ``t``."""
        rng = self.rngs[turbine_id]
        wind = max(0.0, 9.5 + 2.0 * math.sin(t / 20.0) + bounded_noise(rng, 0.6, 1.8))
        power = power_curve(wind) * (1.0 + bounded_noise(rng, 0.02, 0.05))
        ambient = self.temperature_reading(turbine_id, t, rng)
        nacelle = self.true_temperature(turbine_id, t) + 25.0 + bounded_noise(rng, 0.3, 1.0)
        name = self.farm.reading_name(turbine_id)
        return [
            (TEMPERATURE, name, ambient),
            (WIND, name, round(wind, 1)),
            (POWER, name, round(power)),
            (NACELLE, name, round(nacelle, 1)),
        ]

    def frozen_value(self) -> float:
        """What a frozen sensor repeats: the air's temperature when it froze, to 0.1 degree
        (the broken turbine is far from the warm air: within the forecast's band)."""
        return round(self.true_temperature(self.farm.broken, self.fault_at), 1)

    @staticmethod
    def suspicious(ambient: float) -> bool:
        """Whether base rule b1 makes a turbine reading ``ambient`` suspicious."""
        return abs(ambient - FORECAST) > SUSPICIOUS_DEVIATION

    def expected_findings(self) -> dict[str, str]:
        """The right diagnosis per suspicious turbine (the check of the report)."""
        broken = FROZEN_SENSOR if self.sensor_fault == "frozen" else SENSOR_ANOMALY
        return {self.farm.broken: broken, self.farm.warm: CHANGE_CONFIRMED}


def power_curve(wind: float) -> float:
    """kW of a 3 MW turbine: cut-in 3 m/s, rated 12 m/s, cut-out 25 m/s."""
    if wind < 3.0 or wind > 25.0:
        return 0.0
    if wind >= 12.0:
        return 3000.0
    return 3000.0 * ((wind - 3.0) / 9.0) ** 3
