"""What a job used and measured, counted from the workers' reports (``report.json``'s
``totals`` and ``timing_seconds``; the cost meter's ``JobAccount``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ebb.cost.meter import JobAccount, meter_for
from ebb.engine.clock import JobTime
from ebb.engine.inbox import Inbox
from ebb.engine.state import SupervisorState, Totals
from ebb.ports.messages import Report, Scoring, StepReport
from ebb.spec import JobSpec

LOSS_EWMA = 0.3  # weight of the newest step in a worker's recent loss (whom an eviction picks)


def count_report(
    totals: Totals, timing: dict[str, float], report: Report, cpu_timing: dict[str, float] | None = None
) -> None:
    """What every report adds: bytes read, object reads, CPU, the phases' seconds (wall, and CPU)."""
    totals.bytes_received += report.read_bytes
    totals.object_gets += report.object_gets
    totals.reports += 1
    totals.cpu_seconds += report.cpu_seconds
    for phase, seconds in report.timing.items():
        timing[phase] = timing.get(phase, 0.0) + seconds
    if cpu_timing is not None:
        for phase, seconds in report.cpu_timing.items():
            cpu_timing[phase] = cpu_timing.get(phase, 0.0) + seconds


@dataclass(frozen=True)
class ClosedStep:
    loss: float  # the step's training loss, over all its workers' samples
    epoch: float  # epochs done after it
    sent: int  # bytes its workers published
    sent_nnz: int  # values they sent ...
    local_nnz: int  # ... of the values their updates touched


def close_step(
    state: SupervisorState, reports: Mapping[int, StepReport], *, num_parts: int, loss_of: Callable[[float, int], float]
) -> ClosedStep:
    """Count a closed step's reports into ``state`` and move its cursor past the step."""
    for r in reports.values():
        count_report(state.totals, state.timing, r, state.cpu_timing)
    loss = loss_of(sum(r.loss_sum for r in reports.values()), sum(r.samples for r in reports.values()))
    # The workers step their cursor past every position of the step, a lost worker's too.
    state.cursor += len(next(iter(reports.values())).members)
    sent, sent_nnz, local_nnz = _count_step(state.totals, reports)
    return ClosedStep(loss=loss, epoch=state.cursor / num_parts, sent=sent, sent_nnz=sent_nnz, local_nnz=local_nnz)


def _count_step(totals: Totals, reports: Mapping[int, StepReport]) -> tuple[int, int, int]:
    """What a closed step adds to the totals; returns its (bytes sent, values sent, values touched)."""
    steps = reports.values()
    sent = sum(r.sent_bytes for r in steps)
    totals.bytes_sent += sent
    totals.worker_steps += len(reports)
    # With a core per worker a step takes as long as its busiest worker's CPU.
    totals.cpu_critical_seconds += max(r.cpu_seconds for r in steps)
    totals.updates_sent += sum(not r.empty for r in steps)
    totals.empty_steps += sum(r.empty for r in steps)
    sent_nnz = sum(r.sent_nnz for r in steps)
    local_nnz = sum(r.local_nnz for r in steps)
    totals.sent_nnz += sent_nnz
    totals.local_nnz += local_nnz
    return sent, sent_nnz, local_nnz


def track_recent_loss(
    recent: dict[int, float], reports: Mapping[int, StepReport], loss_of: Callable[[float, int], float]
) -> None:
    """Each worker's recent loss: an EWMA of its own step losses."""
    for w, r in reports.items():
        mine = loss_of(r.loss_sum, r.samples)
        prev = recent.get(w)
        recent[w] = mine if prev is None else LOSS_EWMA * mine + (1 - LOSS_EWMA) * prev


def mean_timing(reports: Mapping[int, StepReport]) -> dict[str, float]:
    """Seconds per phase of a closed step, averaged over its workers."""
    phases = {name for r in reports.values() for name in r.timing}
    return {name: sum(r.timing.get(name, 0.0) for r in reports.values()) / len(reports) for name in phases}


def job_account(
    state: SupervisorState, *, wall_seconds: float, worker_seconds: float, rounds: int, output_puts: int = 3
) -> JobAccount:
    """The cost meter's view of a job: ``state``'s counters, with its time and worker time
    (``output_puts``: the outputs written with this account, see ``JobAccount``)."""
    return JobAccount(
        wall_seconds=wall_seconds,
        worker_seconds=worker_seconds,
        rounds=rounds,
        worker_invocations=state.worker_invocations,
        object_gets=state.totals.object_gets,
        object_puts=state.checkpoint_puts,
        reports=state.totals.reports,
        directives=state.directives,
        output_puts=output_puts,
    )


def record_scoring(state: SupervisorState, scoring: Scoring, value: float) -> tuple[str, float] | None:
    """A held-out scoring in the history (and its time in the overheads); returns what to
    record when its step closes, if it is not closed yet."""
    state.overheads.eval_seconds += scoring.seconds
    if scoring.step >= len(state.history):  # taken in the same batch of reports as its own step's
        return scoring.split, value
    entry = state.history[scoring.step]
    entry[scoring.split] = value
    entry["eval_seconds_total"] = round(state.overheads.eval_seconds, 4)
    return None


def history_entry(
    step: int, closed: ClosedStep, *, time: float, host_time: float, workers: int, round_: int, cost_usd: float
) -> dict[str, Any]:
    """A closed step as ``report.json``'s ``history[]`` holds it."""
    return {
        "step": step,
        "time": round(time, 4),
        "host_time": round(host_time, 4),
        "loss": closed.loss,
        "epoch": round(closed.epoch, 4),
        "workers": workers,
        "round": round_,
        "bytes_sent": closed.sent,
        "bytes_received": closed.sent * (workers - 1),
        "sent_fraction": closed.sent_nnz / closed.local_nnz if closed.local_nnz else 0.0,
        "cost_usd": cost_usd,
    }


class Books:
    """The job's time and money as of now: its clock, and its worker time (the rounds'
    before, plus this round's from each launch to its end)."""

    def __init__(self, spec: JobSpec, state: SupervisorState, time: JobTime, inbox: Inbox, round_: int):
        self.state, self.time, self.inbox, self.round = state, time, inbox, round_
        self.meter = meter_for(spec)

    def worker_seconds(self) -> float:
        if self.time.fleet:
            return self.time.fleet.worker_seconds
        return self.state.worker_seconds + self.inbox.worker_seconds(now=self.time.elapsed())

    def cost(self) -> dict[str, Any]:
        return self.meter(
            job_account(
                self.state,
                wall_seconds=self.time.elapsed(),
                worker_seconds=self.worker_seconds(),
                rounds=self.round + 1,
                output_puts=0,  # the running cost: the outputs come with the report
            )
        )

    def snapshot(self, *, policy: dict[str, Any], autotune: dict[str, Any] | None) -> SupervisorState:
        """The state as of now, with this round's time, money and measurements folded in
        (``policy``: the scaling policy's state; ``autotune``: what the auto-tuner saw)."""
        s = self.state
        return s.model_copy(
            update={
                "elapsed": self.time.elapsed(),
                "host_elapsed": self.time.host.elapsed(),
                "fleet": self.time.fleet_state(),
                "worker_seconds": self.worker_seconds(),
                "policy": policy,
                "autotune": autotune,
                "overheads": s.overheads.model_copy(
                    update={"sync_first": s.overheads.sync_first + self.inbox.quickest_waits()}
                ),
            }
        )
