"""What one round of the supervisor has heard from its workers: the reports of steps not
closed yet, who started and ended when, and whose updates still sit in the update store.
Nothing here outlives the round (``SupervisorState`` is what does)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ebb.ports.messages import EndReport, StepReport
from ebb.ports.updates import UpdateStore


@dataclass
class Inbox:
    discarded_upto: int  # every step's updates up to this one are deleted from the update store
    steps: dict[int, dict[int, StepReport]] = field(default_factory=dict)  # unclosed step -> worker -> report
    started_at: dict[int, float] = field(default_factory=dict)  # job time each worker was launched
    ended: dict[int, EndReport] = field(default_factory=dict)
    ended_at: dict[int, float] = field(default_factory=dict)  # job time each worker ended (or was lost)
    senders: dict[int, list[int]] = field(default_factory=dict)  # closed step -> who published an update
    sync_by_step: dict[int, list[float]] = field(default_factory=dict)  # step -> each worker's wait for its go

    def take_step(self, r: StepReport, closed_upto: int) -> bool:
        """Keep a step report; False if it was seen already (at-least-once channels) or its
        step is closed (from a worker given up on)."""
        if r.step <= closed_upto or r.worker in self.steps.get(r.step, {}):
            return False
        self.steps.setdefault(r.step, {})[r.worker] = r
        if r.sync_seconds is not None:
            self.sync_by_step.setdefault(r.step - 1, []).append(r.sync_seconds)
        return True

    def take_end(self, r: EndReport, at: float) -> bool:
        """Keep a worker's last report of the round (at job time ``at``); False if seen already."""
        if r.worker in self.ended:
            return False
        self.ended[r.worker], self.ended_at[r.worker] = r, at
        return True

    def complete(self, step: int, members: list[int]) -> bool:
        got = self.steps.get(step, {})
        return all(w in got for w in members)

    def missing(self, step: int, members: list[int]) -> list[int]:
        """The members that have neither reported ``step`` nor ended."""
        got = self.steps.get(step, {})
        return [w for w in members if w not in got and w not in self.ended]

    def close(self, step: int, members: list[int]) -> dict[int, StepReport]:
        """The reports of ``step`` from its members (a lost worker's are dropped)."""
        return {w: r for w, r in self.steps.pop(step).items() if w in members}

    def worker_seconds(self, now: float) -> float:
        """This round's worker time so far: from each launch to its end (or ``now``)."""
        return sum(self.ended_at.get(w, now) - t for w, t in self.started_at.items())

    def quickest_waits(self) -> list[float]:
        """Per step, the quickest worker's wait for its go (the barrier without CPU queueing)."""
        return [min(v) for _, v in sorted(self.sync_by_step.items()) if v]

    def discard_upto(self, applied: int, updates: UpdateStore) -> None:
        """Every worker has applied the steps up to ``applied``: delete their updates."""
        for step in range(self.discarded_upto + 1, applied + 1):
            if self.senders.get(step):
                updates.discard([step], self.senders[step])
            self.senders.pop(step, None)
        self.discarded_upto = max(self.discarded_upto, applied)
