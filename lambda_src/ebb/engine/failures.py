"""The failure policy: when a worker is lost, and what the job does then
(docs/RELIABILITY.md; the job spec's ``faults``).

A worker is lost when its process ended (the launcher says how) or, once the step it
should report has waited ``faults.worker_timeout_s``, when its heartbeat went silent for
that long (or never came in the round's first ``faults.startup_timeout_s``). Then, by
``faults.on_worker_loss``: ``fail`` ends the job; ``restart_round`` (and SSP, and a fleet
with no survivor) runs the round again from its checkpoints; ``evict`` goes on without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from ebb.engine.errors import EngineError, RoundLost
from ebb.engine.fleet_clock import FleetTimeline
from ebb.engine.state import SupervisorState
from ebb.ports.keys import lost_blob
from ebb.ports.launcher import WorkerLauncher
from ebb.ports.messages import Directive
from ebb.ports.updates import UpdateStore
from ebb.spec import FaultSpec

ROUND_GRACE_S = 30.0  # past round_seconds, a round still waiting on its workers has lost one


def lost_workers(
    missing: list[int],
    *,
    exited: Mapping[int, str],
    faults: FaultSpec,
    round_elapsed: float,
    stalled_s: float,
    heartbeats: Callable[[list[int]], dict[int, float]],
    age: Callable[[float], float],
) -> dict[int, str]:
    """Which of the ``missing`` workers (the step waits for them) are lost, and why.

    ``stalled_s``: how long the step has waited; heartbeats are read only past the timeout.
    ``age(t)``: how old a heartbeat written at wall time ``t`` is, on the judge's running
    time (``ebb.engine.pauses``: its own pauses left out)."""
    lost = {w: exited[w] for w in missing if w in exited}
    if stalled_s > faults.worker_timeout_s:
        beats = heartbeats(missing)
        for w in missing:
            if w in lost:
                continue
            if w not in beats and round_elapsed > faults.startup_timeout_s:
                lost[w] = f"sent no heartbeat in the round's first {faults.startup_timeout_s:g} s"
            elif w in beats and (silent := age(beats[w])) > faults.worker_timeout_s:
                lost[w] = f"went silent (no heartbeat for {silent:.0f} s)"
    return lost


def on_loss(
    lost: Mapping[int, str], step: int, *, faults: FaultSpec, mode: str, survivors: list[int], directive_staged: bool
) -> Literal["evict"]:
    """What to do about ``lost`` at ``step``: "evict" (go on without them), or raise:
    ``EngineError`` (the job fails) or ``RoundLost`` (the round runs again). Going on needs
    the step's directive still staged, to name the survivors in it."""
    what = describe(lost)
    if faults.on_worker_loss == "fail":
        raise EngineError(f"{what} at step {step} (faults.on_worker_loss: fail)")
    if faults.on_worker_loss == "restart_round" or mode == "ssp" or not survivors or not directive_staged:
        raise RoundLost(f"{what} at step {step}")
    return "evict"


def describe(lost: Mapping[int, str]) -> str:
    return "; ".join(f"worker {w} {why}" for w, why in sorted(lost.items()))


def overdue(round_: int, round_elapsed: float, round_seconds: float, waiting: int, missing: list[int]) -> str | None:
    """Why the round has lost a worker, if it is still waiting on ``missing`` to report step
    ``waiting`` this long past its time."""
    if round_elapsed <= round_seconds + ROUND_GRACE_S:
        return None
    return (
        f"round {round_} ran {round_elapsed:.0f} s, past its {round_seconds:g} s: still waiting for "
        f"worker(s) {missing} to report step {waiting}"
    )


def go_on_without(
    lost: Mapping[int, str],
    step: int,
    *,
    state: SupervisorState,
    staged: Directive,
    at: float,
    launcher: WorkerLauncher,
    updates: UpdateStore,
    fleet: FleetTimeline | None,
) -> Directive:
    """Leave ``lost`` behind at ``step`` (job time ``at``): stop them, mark them lost (should
    one come back, it leaves quietly), take them off the fleet clock, record it. Returns the
    step's directive naming the survivors: it opens their barrier, and its fleet from the
    next step leaves the lost out. (A lost worker's replica is gone with it; its unsent ISP
    updates are the price of going on.)"""
    if fleet is not None:
        fleet.leave(lost)
    for w, why in sorted(lost.items()):
        launcher.stop(w)
        updates.put_blob(lost_blob(w), b"1")
        state.recent_loss.pop(w, None)
        state.scale_events.append(
            {"step": step, "applied_at": step, "time": round(at, 3), "action": "lost", "worker": w, "reason": why}
        )
    upcoming = [w for w in state.upcoming if w not in lost]
    state.members, state.upcoming = [w for w in state.members if w not in lost], upcoming
    return staged.model_copy(
        update={
            "members": upcoming,
            "evict": [w for w in staged.evict if w not in lost],
            "donors": [w for w in staged.donors if w not in lost],
        }
    )
