"""When a round ends: after ``round_steps`` steps, or before its time (``round_seconds``;
on Lambda the function's timeout less a margin) would run out (docs/ARCHITECTURE.md,
"Rounds and checkpoints")."""

from __future__ import annotations

import math

from ebb.engine.errors import EngineError
from ebb.engine.state import SupervisorState
from ebb.ports.keys import worker_key
from ebb.ports.launcher import WorkerStart

STEP_EWMA = 0.2  # weight of the newest step in the step-time estimate that times the round's end


class RoundEnd:
    """Tracks the step time (close to close) and names the round's last step in time."""

    def __init__(self, *, round_seconds: float, round_steps: int | None, first_step: int, slack: int):
        self.round_seconds, self.round_steps = round_seconds, round_steps
        self.first_step, self.slack = first_step, slack
        self.step_s: float | None = None
        self._last_close: float | None = None

    def step_closed(self, round_elapsed: float) -> None:
        """A step closed at ``round_elapsed`` seconds into the round."""
        if self._last_close is not None:
            d = round_elapsed - self._last_close
            self.step_s = d if self.step_s is None else STEP_EWMA * d + (1 - STEP_EWMA) * self.step_s
            if self.step_s > self.round_seconds:
                raise EngineError(
                    f"round_seconds ({self.round_seconds:g} s) is shorter than one training step "
                    f"({self.step_s:.2f} s measured): raise round_seconds in the job spec (or --round-seconds)"
                )
        self._last_close = round_elapsed

    def last_step(self, nxt: int, clock: int, round_elapsed: float) -> int | None:
        """The round's last step, if the directive of ``nxt`` must name it (else None).

        Under SSP a worker may already be training ``slack`` steps past ``nxt`` when the
        directive arrives, so the last step is ``nxt + slack``: no one has trained past it.
        """
        last = nxt + self.slack
        if self.round_steps is not None and last - self.first_step + 1 >= self.round_steps:
            return last
        if self.step_s is not None and math.isfinite(self.round_seconds):
            if round_elapsed + (last - clock + 1) * self.step_s >= self.round_seconds:
                return last
        return None


def last_step_closed(clock: int, stop_step: int | None, round_end: int | None) -> bool:
    """Whether the round's last step is closed: the stop step, or the round's end if that comes first."""
    ends = [s for s in (stop_step, round_end) if s is not None]
    return bool(ends) and clock >= min(ends)


def round_starts(state: SupervisorState, round_: int) -> list[WorkerStart]:
    """How a round's workers start: from the step after the last closed one, each from its
    checkpoint of the round before (none in round 0)."""
    return [
        WorkerStart(
            worker=w,
            members=list(state.members),
            round=round_,
            step=state.clock + 1,
            cursor=state.cursor,
            resume=worker_key(round_ - 1, w) if round_ else None,
        )
        for w in state.members
    ]
