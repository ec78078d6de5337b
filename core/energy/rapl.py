"""CPU package energy from RAPL through Linux powercap (/sys/class/powercap/intel-rapl:N).

Only top-level *package* zones are summed: RAPL domains nest (psys contains package contains core/uncore),
so adding them over-counts. The counter `energy_uj` wraps at `max_energy_range_uj`; a thread polls it
often enough to see every wrap. Since CVE-2020-8694 most distributions make `energy_uj` root-only; the
meter then reports unavailable with the fix instead of failing.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from core.energy.counters import Sample, energy_from_counter, sum_readings
from core.energy.reading import EnergyReading, unavailable

POWERCAP_ROOT = Path("/sys/class/powercap")
# Top-level zones only: intel-rapl:0 is a package, intel-rapl:0:0 its core subzone. AMD CPUs appear under
# the same intel-rapl name.
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")
# The hardware refreshes the energy status roughly every millisecond (Intel SDM, RAPL energy status MSRs).
RAPL_UPDATE_PERIOD_S = 0.001
METHOD = "RAPL package energy counter (powercap energy_uj)"


@dataclass
class _Zone:
    path: Path
    name: str
    max_range_uj: float
    series: list[Sample] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.path.name} ({self.name})"

    def read(self) -> float:
        return float((self.path / "energy_uj").read_text().strip())


def _permission_reason(path: Path) -> str:
    return (
        f"permission denied reading {path} (root-only since CVE-2020-8694); "
        f"fix: sudo chmod a+r {path.parent.parent}/intel-rapl:*/energy_uj"
    )


def find_package_zones(root: Path = POWERCAP_ROOT) -> tuple[list[_Zone], str | None]:
    """Package zones under `root`, or ([], reason)."""
    if not root.is_dir():
        return [], f"no RAPL powercap interface at {root} (not Linux on Intel/AMD, or no RAPL driver)"
    zones: list[_Zone] = []
    for zone_dir in sorted(root.iterdir()):
        if not _PACKAGE_ZONE.match(zone_dir.name):
            continue
        try:
            name = (zone_dir / "name").read_text().strip()
            if not name.startswith("package"):
                continue  # psys, dram or other top-level domains overlap with or differ from packages
            max_range = float((zone_dir / "max_energy_range_uj").read_text().strip())
        except PermissionError:
            return [], _permission_reason(zone_dir / "max_energy_range_uj")
        except (OSError, ValueError) as exc:
            return [], f"cannot read RAPL zone {zone_dir}: {exc}"
        zones.append(_Zone(zone_dir, name, max_range))
    if not zones:
        return [], f"no RAPL package zones under {root}"
    return zones, None


class RaplEnergyMeter:
    """Sum of CPU package energy over the window. `root` can point at a fake powercap tree in tests.

    `poll_interval_s` must be shorter than the time a package takes to wrap its counter (often about a
    minute at full load for a 2^32 uJ range); None disables polling (then at most one wrap is seen).
    """

    def __init__(
        self,
        root: Path = POWERCAP_ROOT,
        *,
        poll_interval_s: float | None = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self._poll_interval_s = poll_interval_s
        self._clock = clock
        self._zones: list[_Zone] = []
        self._failure: str | None = None
        self._start_s: float | None = None
        self._stop_polling = threading.Event()
        self._poller: threading.Thread | None = None

    def probe(self) -> str | None:
        """None when every package counter is readable, else the reason."""
        zones, reason = find_package_zones(self.root)
        if reason is not None:
            return reason
        for zone in zones:
            try:
                zone.read()
            except PermissionError:
                return _permission_reason(zone.path / "energy_uj")
            except (OSError, ValueError) as exc:
                return f"cannot read {zone.path / 'energy_uj'}: {exc}"
        return None

    def _sample_all(self, strict: bool) -> None:
        """Append one reading per zone; at the window's ends (strict) a failed read is recorded as None."""
        now = self._clock()
        for zone in self._zones:
            try:
                zone.series.append((now, zone.read()))
            except (OSError, ValueError):
                if strict:
                    zone.series.append((now, None))
                # A failed poll in the middle only loses wrap detection for one interval: skip it.

    def start(self) -> None:
        self._start_s = self._clock()
        self._failure = self.probe()
        if self._failure is not None:
            return
        self._zones, _ = find_package_zones(self.root)
        self._sample_all(strict=True)
        self._start_s = self._zones[0].series[0][0]
        if self._poll_interval_s is not None:
            self._stop_polling.clear()
            self._poller = threading.Thread(target=self._poll, name="rapl-poller", daemon=True)
            self._poller.start()

    def _poll(self) -> None:
        while not self._stop_polling.wait(self._poll_interval_s):
            self._sample_all(strict=False)

    def stop(self) -> EnergyReading:
        if self._poller is not None:
            self._stop_polling.set()
            self._poller.join()
            self._poller = None
        if self._failure is not None:
            window_s = self._clock() - self._start_s if self._start_s is not None else 0.0
            return unavailable(self._failure, method=METHOD, window_s=window_s, device="CPU packages")
        self._sample_all(strict=True)
        readings = [
            energy_from_counter(
                zone.series,
                joules_per_unit=1e-6,
                update_period_s=RAPL_UPDATE_PERIOD_S,
                wrap_range=zone.max_range_uj,
                method=METHOD,
                device=zone.label,
            )
            for zone in self._zones
        ]
        device = "CPU packages: " + ", ".join(zone.label for zone in self._zones)
        return sum_readings(readings, method=METHOD, device=device)
