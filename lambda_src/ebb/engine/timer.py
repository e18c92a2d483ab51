"""Where a worker's step goes: seconds per phase (fetch, compute, filter, write, wait, read,
apply), summed between reports, in wall time and in the training thread's CPU time.

CPU time is what the fleet clock bills a worker for (its own vCPU) and what grows with
the fleet when each worker applies P − 1 payloads, so the CPU per phase is what a job's
report breaks a step down by (``totals.cpu_ms_per_worker_step``). ``time.thread_time``
leaves out the heartbeat thread."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class StepTimer:
    spans: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    _t: float = 0.0
    _c: float = 0.0

    def start(self) -> None:
        self._t, self._c = time.perf_counter(), time.thread_time()

    def lap(self, name: str) -> None:
        """The time since the last lap (or start) goes to phase ``name``."""
        now, cpu = time.perf_counter(), time.thread_time()
        self.spans[name] = self.spans.get(name, 0.0) + now - self._t
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu - self._c
        self._t, self._c = now, cpu

    def take(self) -> dict[str, float]:
        """The phases' wall seconds since the last take; starts the sums afresh."""
        out, self.spans = self.spans, {}
        return out

    def take_cpu(self) -> dict[str, float]:
        """The phases' CPU seconds (this thread's) since the last take; starts the sums afresh."""
        out, self.cpu = self.cpu, {}
        return out
