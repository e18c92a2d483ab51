"""Test doubles shared by the engine tests (real engine, in-memory channel that records)."""

from __future__ import annotations

from ebb.ports.messages import EndReport, StepReport
from ebb.spec import JobSpec, load_spec
from ebb.stores.memory import MemorySignalChannel


def engine_spec(data_dir, out, **fields) -> JobSpec:
    """A small PMF job on ``data_dir`` writing to ``out``; ``fields`` override (dotted names)."""
    base = {
        "model": "pmf",
        "data": data_dir,
        "out": str(out),
        "scaling.policy": "none",
        "seed": 3,
        "hyper.rank": 6,
        "stop.max_epochs": 2,
    }
    base.update(fields)
    return load_spec(overrides=base)


class RecordingChannel(MemorySignalChannel):
    """The in-memory signal channel, keeping every worker report it carried."""

    def __init__(self):
        super().__init__()
        self.log: list[StepReport | EndReport] = []

    def report(self, message):
        self.log.append(message)
        super().report(message)

    def steps(self) -> list[StepReport]:
        return [m for m in self.log if isinstance(m, StepReport)]

    def ends(self, outcome: str) -> list[EndReport]:
        return [m for m in self.log if isinstance(m, EndReport) and m.outcome == outcome]
