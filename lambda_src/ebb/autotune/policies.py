"""Worker-scaling policies the supervisor consults after every completed step.

A policy only says *how many* workers to add or remove and why; the supervisor carries
the decision out (and picks the evicted worker with ``pick_eviction``). Policies:

* ``none``: never changes the fleet;
* ``autotune``: MLLess's scale-in auto-tuner (``ScaleInTuner``);
* ``schedule``: a user-given list of ``{epoch, workers}`` targets applied at epoch
  boundaries (Hydrozoa-style), scaling in or out.

Every policy's state is a JSON-able dict so it survives the supervisor's Lambda rounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .tuner import ScaleInTuner


@dataclass
class ScaleDecision:
    """Change the fleet by ``count`` workers: ``action`` is "evict" or "join"."""

    action: str
    count: int = 1
    reason: str = ""

    def __post_init__(self) -> None:
        if self.action not in ("evict", "join"):
            raise ValueError(f"action must be 'evict' or 'join', got {self.action!r}")
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")


@dataclass(frozen=True)
class StepSeen:
    """What the supervisor saw of a completed step: its global training loss, the fleet,
    ``peer_s`` (the part of the step spent on the peers' updates, if known) and
    ``steps_left`` (the steps to the job's target, if it has one and they can be told)."""

    step: int
    elapsed_s: float
    loss: float
    workers: int
    epoch: float
    peer_s: float | None = None
    steps_left: float | None = None


@runtime_checkable
class ScalingPolicy(Protocol):
    """What the supervisor calls: ``observe`` then ``decide`` once per completed step."""

    name: str

    def observe(self, seen: StepSeen) -> None: ...

    def decide(self, step: int, elapsed_s: float, workers: int, epoch: float) -> ScaleDecision | None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class NoScaling:
    """Keeps the initial fleet. Accepts (and ignores) the fleet bounds every policy gets."""

    name = "none"

    def __init__(self, *, min_workers: int = 1, max_workers: int | None = None):
        self.min_workers, self.max_workers = min_workers, max_workers

    def observe(self, seen: StepSeen) -> None:
        return None

    def decide(self, step: int, elapsed_s: float, workers: int, epoch: float) -> ScaleDecision | None:
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


class AutoTunePolicy:
    """MLLess scale-in: evicts one worker at a time (see ``ScaleInTuner`` for params).

    ``max_workers`` is accepted for a uniform construction and ignored: this policy adds
    a worker only to undo its own eviction (the cost guard's, ``ScaleInTuner``).
    """

    name = "autotune"

    def __init__(self, *, max_workers: int | None = None, **tuner_params: Any):
        self.tuner = ScaleInTuner(**tuner_params)

    def observe(self, seen: StepSeen) -> None:
        s = seen
        self.tuner.observe(s.step, s.elapsed_s, s.loss, s.workers, peer_s=s.peer_s, steps_left=s.steps_left)

    def decide(self, step: int, elapsed_s: float, workers: int, epoch: float) -> ScaleDecision | None:
        reason = self.tuner.decide(elapsed_s, workers)
        return None if reason is None else ScaleDecision(self.tuner.last_action, 1, reason)

    def state_dict(self) -> dict:
        return self.tuner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.tuner.load_state_dict(state)


@dataclass(frozen=True)
class ScheduleEntry:
    """From the first epoch boundary at or after ``epoch``, run ``workers`` workers."""

    epoch: float
    workers: int


class SchedulePolicy:
    """Hydrozoa-style schedule: target fleet sizes that apply at epoch boundaries.

    ``schedule`` is a list of ``{"epoch": float, "workers": int}`` (or ``(epoch,
    workers)`` pairs). An entry fires once, at the first step whose epoch's integer
    part is ``>= entry.epoch`` (so 1.5 takes effect at the start of epoch 2, and 0 at
    the first step). If several entries fire at once the latest wins. The decision asks
    for exactly the workers needed to reach the target clamped to
    ``[min_workers, max_workers]`` (``max_workers=None``: no upper bound); none if
    already there.
    """

    name = "schedule"

    def __init__(self, schedule: Sequence[Any], *, min_workers: int = 1, max_workers: int | None = None):
        if min_workers < 1:
            raise ValueError(f"min_workers must be >= 1, got {min_workers}")
        if max_workers is not None and max_workers < min_workers:
            raise ValueError(f"max_workers ({max_workers}) is below min_workers ({min_workers})")
        self.entries = sorted((_parse_entry(item) for item in schedule), key=lambda e: e.epoch)
        if not self.entries:
            raise ValueError("schedule policy needs at least one {epoch, workers} entry")
        self.min_workers, self.max_workers = min_workers, max_workers
        self.fired = 0  # entries already applied, in epoch order

    def observe(self, seen: StepSeen) -> None:
        return None

    def decide(self, step: int, elapsed_s: float, workers: int, epoch: float) -> ScaleDecision | None:
        boundary = math.floor(epoch)
        due = self.fired
        while due < len(self.entries) and self.entries[due].epoch <= boundary:
            due += 1
        if due == self.fired:
            return None
        self.fired = due
        entry = self.entries[due - 1]
        target = max(self.min_workers, entry.workers)
        if self.max_workers is not None:
            target = min(self.max_workers, target)
        if target == workers:
            return None
        reason = f"schedule: {target} workers from epoch {boundary} (entry epoch {entry.epoch:g}: {entry.workers})"
        if target < workers:
            return ScaleDecision("evict", workers - target, reason)
        return ScaleDecision("join", target - workers, reason)

    def state_dict(self) -> dict:
        return {"fired": self.fired}

    def load_state_dict(self, state: dict) -> None:
        self.fired = int(state["fired"])


def _parse_entry(item: Any) -> ScheduleEntry:
    if isinstance(item, Mapping):
        if "epoch" not in item or "workers" not in item:
            raise ValueError(f"schedule entry needs 'epoch' and 'workers': {item!r}")
        epoch, workers = item["epoch"], item["workers"]
    elif isinstance(item, Sequence) and not isinstance(item, (str, bytes)) and len(item) == 2:
        epoch, workers = item
    else:
        epoch, workers = getattr(item, "epoch", None), getattr(item, "workers", None)
    try:
        epoch_value, workers_value = float(epoch), int(workers)
    except (TypeError, ValueError):
        raise ValueError(f"schedule entry needs a numeric epoch and an integer workers: {item!r}") from None
    if workers_value != workers or not math.isfinite(epoch_value) or epoch_value < 0 or workers_value < 1:
        raise ValueError(f"schedule entry needs epoch >= 0 and an integer workers >= 1: {item!r}")
    return ScheduleEntry(epoch_value, workers_value)


POLICIES = {"none": NoScaling, "autotune": AutoTunePolicy, "schedule": SchedulePolicy}


def make_policy(name: str, **params: Any) -> ScalingPolicy:
    """Build the policy called ``name`` ("none", "autotune", "schedule") from params."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown scaling policy {name!r}; choose one of {sorted(POLICIES)}") from None
    return cls(**params)


def pick_eviction(recent_loss: Mapping[int, float]) -> int:
    """The worker to evict: highest recent loss (NaN counts as highest), ties → highest id."""
    if not recent_loss:
        raise ValueError("pick_eviction needs at least one worker's recent loss")

    def badness(worker: int) -> tuple[float, int]:
        loss = float(recent_loss[worker])
        return (math.inf if math.isnan(loss) else loss, worker)

    return max(recent_loss, key=badness)
