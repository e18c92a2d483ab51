"""The job's clock: elapsed time that survives rounds and means the same in every process.

A job outlives its processes (Lambda rounds, a resumed local run), so its elapsed time
is carried: the time of the rounds before this one plus wall time since this round
began. Wall time, not a monotonic clock, because the numbers are compared across
processes and machines (the tuner's intervals, ``max_seconds``, the budget, message
timestamps). Durations measured inside one process (a step's phases) use
``time.perf_counter`` where they are taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ebb.engine.fleet_clock import FleetTimeline, Links
from ebb.engine.state import FleetTime
from ebb.spec import JobSpec


def wall() -> float:
    """Wall-clock seconds since the epoch: the one timestamp that crosses processes."""
    return time.time()


class JobClock:
    """Elapsed job seconds: ``before`` (earlier rounds) + wall time since this round began."""

    def __init__(self, before: float = 0.0, now: Callable[[], float] = wall):
        self._now = now
        self.before = float(before)
        self.round_started = now()
        self._stopped_at: float | None = None

    def elapsed(self) -> float:
        return self.before + self.round_elapsed()

    def round_elapsed(self) -> float:
        end = self._stopped_at if self._stopped_at is not None else self._now()
        return max(0.0, end - self.round_started)

    def stop(self) -> None:
        """Freeze the clock (the job's training ended): wall time, cost and Perf/$ agree."""
        if self._stopped_at is None:
            self._stopped_at = self._now()


class JobTime:
    """The job's time: the fleet clock's with ``clock.kind: fleet`` (docs/ARCHITECTURE.md,
    "Fleet clock"), else this host's. Host time always runs beside it: it decides what
    belongs to the process running the round (its end, liveness) and is reported."""

    def __init__(self, spec: JobSpec, *, host_before: float, fleet_before: FleetTime | None, slack: int):
        self.host = JobClock(before=host_before)
        self.fleet: FleetTimeline | None = None
        if spec.clock.kind == "fleet":
            before = fleet_before or FleetTime()
            self.fleet = FleetTimeline(
                Links.of(spec.clock), slack, time=before.time, worker_seconds=before.worker_seconds
            )

    def elapsed(self) -> float:
        """The job's time (the fleet clock's at the last closed step, or the host's)."""
        return self.fleet.time if self.fleet else self.host.elapsed()

    def fleet_state(self) -> FleetTime | None:
        return FleetTime(time=self.fleet.time, worker_seconds=self.fleet.worker_seconds) if self.fleet else None
