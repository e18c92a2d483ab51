"""The fleet clock: the time a job's steps would take on a fleet of functions, each with
its own vCPU and its own network link to one cache node (docs/ARCHITECTURE.md, "Fleet clock").

Locally every worker shares the host's cores and talks over a free loopback, so host
time measures CPU queueing. The fleet clock instead builds each step's time from what
the workers measured and reported (``StepReport``): process CPU time, bytes written and
read, requests to the update store. Pure arithmetic; the supervisor feeds it.

One worker's share of a step (from its previous report to this one)::

    t_w = (cpu_w - io_w) + max(io_w, write_w + read_w) + requests_w × rtt
    write_w = max(sent_w / link, Σ sent / node)     read_w = max(read_w / link, Σ read / node)

``io_w`` is the CPU the worker spent inside the update store's calls (serialising, system
calls, the client library): it runs while the bytes are on the wire, so the I/O takes the
longer of the two, not their sum (on a slow link the client's CPU grows with the wait).
The cache node is shared: with a barrier every worker writes at about the same time and,
after the go, reads at about the same time, so each direction of the node's link is a
phase of the step that cannot end before the node has moved the whole fleet's bytes
(``Σ sent / node``, then ``Σ read / node``), on top of the CPU, not beside it.

Steps are closed in order. Each worker ``w`` has a virtual time ``ready_w``: when it
finished its last step. The dependency rule of the sync model, with ``slack`` 0 for BSP
and ISP (a barrier per step) and ``sync.slack`` for SSP:

    start_w(s) = max(ready_w, cleared(s - 1 - slack) + barrier)
    finish_w(s) = start_w(s) + t_w(s)
    cleared(s) = max_w finish_w(s)

so worker ``w`` may start step ``s`` once it finished its own step ``s - 1`` and every
member finished step ``s - 1 - slack``, and the word of it has reached it: ``barrier``
(``clock.barrier_ms``) is the release, from the last announcement to a waiting worker's
go (the cache's script, its push, the worker waking). With a barrier (slack 0) every
member starts at ``cleared(s - 1) + barrier`` and a step takes the slowest worker. The
job's fleet time is ``cleared`` of its last closed step (by then every worker has
finished it, so it is the largest virtual time).

A wave of invocations (the workers of a round's start, or joiners) pays one cold start:
their ``ready`` is the fleet time they were launched at plus ``cold_start_s``.

Billing on the fleet clock: every live invocation (a member of the step, or a joiner
launched and not yet training) is billed for each step's fleet time, ``cleared(s) -
cleared(s - 1)``, the cold start included (Lambda bills a function's init).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from ebb.spec import ClockSpec

MB = 1e6
_DEFAULT = ClockSpec()  # the defaults live in the job spec (``ebb spec``, clock.*)


@dataclass(frozen=True)
class Links:
    """The fleet's network and start-up: per-worker link, request round trip, the cache
    node's link, one cold start, the barrier's release (the ``clock`` section of a job spec,
    whose defaults these are)."""

    link_mb_s: float = _DEFAULT.link_mb_s
    rtt_ms: float = _DEFAULT.rtt_ms
    node_mb_s: float = _DEFAULT.node_mb_s
    cold_start_s: float = _DEFAULT.cold_start_s
    barrier_ms: float = _DEFAULT.barrier_ms

    @classmethod
    def of(cls, clock: ClockSpec) -> Links:
        return cls(
            link_mb_s=clock.link_mb_s,
            rtt_ms=clock.rtt_ms,
            node_mb_s=clock.node_mb_s,
            cold_start_s=clock.cold_start_s,
            barrier_ms=clock.barrier_ms,
        )


class Measured(Protocol):
    """What the fleet clock reads of a worker's step report."""

    cpu_seconds: float
    sent_bytes: int
    read_bytes: int
    requests: int
    io_cpu_seconds: float


@dataclass(frozen=True)
class WorkerStep:
    """What one worker measured for one step (its ``StepReport``)."""

    cpu_s: float
    sent_bytes: int = 0
    read_bytes: int = 0
    requests: int = 0
    io_cpu_s: float = 0.0  # the part of cpu_s spent inside the update store's calls
    # The parts of cpu_s spent on the peers' updates: reading them (inside the store's
    # calls) and applying them (``peer_seconds``).
    read_cpu_s: float = 0.0
    apply_cpu_s: float = 0.0

    @classmethod
    def of(cls, report: Measured) -> WorkerStep:
        """The measures of a worker's ``StepReport`` (its "read" and "apply" phases' CPU: the
        apply adds the step's mean, the worker's own update one of its members')."""
        timing = getattr(report, "cpu_timing", None) or {}
        members = len(getattr(report, "members", None) or [0])
        return cls(
            report.cpu_seconds,
            report.sent_bytes,
            report.read_bytes,
            report.requests,
            report.io_cpu_seconds,
            read_cpu_s=timing.get("read", 0.0),
            apply_cpu_s=timing.get("apply", 0.0) * (1.0 - 1.0 / members),
        )


def _node_totals(steps: Iterable[WorkerStep]) -> tuple[int, int]:
    steps = list(steps)
    return sum(w.sent_bytes for w in steps), sum(w.read_bytes for w in steps)


def worker_seconds(w: WorkerStep, links: Links, node_totals: tuple[int, int] = (0, 0)) -> float:
    """One worker's time for its step: its CPU, with the I/O part overlapping the wire time
    of its writes and reads (each at least the node's time for the fleet's bytes in that
    direction, ``node_totals`` = (Σ sent, Σ read)), plus its round trips."""
    link, node = links.link_mb_s * MB, links.node_mb_s * MB
    write = max(w.sent_bytes / link, node_totals[0] / node)
    read = max(w.read_bytes / link, node_totals[1] / node)
    io = min(w.io_cpu_s, w.cpu_s)
    return w.cpu_s - io + max(io, write + read) + w.requests * links.rtt_ms / 1e3


def barrier_step_seconds(steps: Iterable[WorkerStep], links: Links) -> float:
    """A barrier step's fleet time (BSP, ISP): the release, then the slowest worker."""
    steps = list(steps)
    totals = _node_totals(steps)
    return links.barrier_ms / 1e3 + max((worker_seconds(w, links, totals) for w in steps), default=0.0)


def peer_seconds(steps: Iterable[WorkerStep], links: Links) -> float:
    """The part of a barrier step's fleet time spent on the peers' updates: reading them
    (their bytes, and ``read_cpu_s``, inside the update store's calls) and applying them
    (``apply_cpu_s``). The step composed again
    without it is what the step would take with no peers; what a worker reads and applies
    grows with the peers ``P − 1``, so this over ``P − 1`` is the step time one worker
    fewer saves (the auto-tuner's cost guard uses it at the knee, where only one fleet size
    has been timed)."""
    steps = list(steps)
    alone = []
    for m in steps:
        cpu = max(0.0, m.cpu_s - m.read_cpu_s - m.apply_cpu_s)
        alone.append(replace(m, cpu_s=cpu, io_cpu_s=min(cpu, max(0.0, m.io_cpu_s - m.read_cpu_s)), read_bytes=0))
    return max(0.0, barrier_step_seconds(steps, links) - barrier_step_seconds(alone, links))


class FleetTimeline:
    """Virtual times of the workers and of the cleared steps (the rule in the module doc)."""

    def __init__(self, links: Links, slack: int = 0, time: float = 0.0, worker_seconds: float = 0.0):
        self.links, self.slack = links, slack
        self.time = float(time)  # cleared(last closed step): the job's fleet time
        self.worker_seconds = float(worker_seconds)  # billed worker-seconds of fleet time
        self.ready: dict[int, float] = {}
        self.cleared: dict[int, float] = {}  # step -> cleared(step), this round's steps

    def launch(self, workers: Iterable[int], at: float | None = None) -> None:
        """A wave of invocations launched at fleet time ``at`` (default now): one cold start."""
        start = (self.time if at is None else at) + self.links.cold_start_s
        for w in workers:
            self.ready[w] = start

    def leave(self, workers: Iterable[int]) -> None:
        for w in workers:
            self.ready.pop(w, None)

    def close(self, step: int, measured: Mapping[int, WorkerStep], waiting: int = 0) -> float:
        """Close ``step`` (steps close in order) with each member's measures; returns cleared(step).

        ``waiting``: invocations launched that do not train yet (joiners), billed too."""
        gate = self.cleared.get(step - 1 - self.slack)
        # The first step of a wave has no go to wait for; every later one waits for the release.
        gate = 0.0 if gate is None else gate + self.links.barrier_ms / 1e3
        totals = _node_totals(measured.values())
        finish = 0.0
        for w, m in measured.items():
            done = max(self.ready.get(w, self.time), gate) + worker_seconds(m, self.links, totals)
            self.ready[w] = done
            finish = max(finish, done)
        cleared = max(finish, self.time)
        self.cleared[step] = cleared
        self.cleared.pop(step - 2 - 2 * self.slack, None)  # only the last slack + 1 are looked back at
        self.worker_seconds += (cleared - self.time) * (len(measured) + waiting)
        self.time = cleared
        return cleared

    def state_dict(self) -> dict[str, float]:
        """What survives rounds: the fleet time and the billed worker-seconds (a round's
        workers start again, cold, so their virtual times are not carried)."""
        return {"time": self.time, "worker_seconds": self.worker_seconds}
