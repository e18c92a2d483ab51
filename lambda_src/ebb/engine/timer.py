"""Where a worker's step goes: seconds per phase (fetch, compute, filter, write, wait, read,
apply), summed between reports."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class StepTimer:
    spans: dict[str, float] = field(default_factory=dict)
    _t: float = 0.0

    def start(self) -> None:
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        """The time since the last lap (or start) goes to phase ``name``."""
        now = time.perf_counter()
        self.spans[name] = self.spans.get(name, 0.0) + now - self._t
        self._t = now

    def take(self) -> dict[str, float]:
        """The phases' seconds since the last take; starts the sums afresh."""
        out, self.spans = self.spans, {}
        return out
