"""Scaling, the supervisor's side: which policy a job runs, and a decision turned into
who leaves or joins (docs/ARCHITECTURE.md, "The scale-in auto-tuner"; the policies
themselves are in ``ebb.autotune``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ebb.autotune.policies import ScaleDecision, ScalingPolicy, make_policy, pick_eviction
from ebb.ports.keys import replica_blob
from ebb.ports.launcher import WorkerStart
from ebb.ports.messages import Directive
from ebb.spec import JobSpec


def policy_for(spec: JobSpec) -> ScalingPolicy:
    """The scaling policy of a job (SSP and single-worker jobs never scale)."""
    s = spec.scaling
    if spec.sync.mode == "ssp" or (spec.workers == 1 and s.policy != "schedule"):
        return make_policy("none")
    if s.policy == "autotune":
        return make_policy(
            "autotune",
            interval_s=s.interval_s,
            horizon_s=s.horizon_s,
            tolerance=s.tolerance,
            knee_tolerance=s.knee_tolerance,
            knee_patience=s.knee_patience,
            knee_min_drop=s.knee_min_drop,
            min_workers=s.min_workers,
            throughput_tolerance=s.throughput_tolerance,
            **cost_guard_params(spec),
        )
    if s.policy == "schedule":
        return make_policy(
            "schedule",
            schedule=[e.model_dump() for e in s.schedule],
            min_workers=s.min_workers,
            max_workers=max([spec.workers] + [e.workers for e in s.schedule]),
        )
    return make_policy("none")


def cost_guard_params(spec: JobSpec) -> dict[str, float | None]:
    """The auto-tuner's cost guard for ``spec``: $ per worker-second, $ per second of what
    bills whatever the fleet (supervisor, cache nodes), and the progress model: under sum a
    smaller fleet needs p/(p−1) the steps (exponent 1); under mean the tuner measures it,
    from ``scaling.noise_ratio`` or else a noise-dominated start (``ebb.autotune.tuner``, "Cost guard")."""
    from ebb.cost.model import load_prices

    prices, aws = load_prices(), spec.aws
    gb_s = prices.lambda_usd_per_gb_second[aws.arch]
    node = prices.cache_usd_per_node_hour.get(aws.cache_node_type, 0.0) * aws.cache_nodes / 3600.0
    return {
        "worker_usd_s": aws.memory_mb / 1024.0 * gb_s,
        "fixed_usd_s": aws.supervisor_memory_mb / 1024.0 * gb_s + node,
        "progress_exponent": 1.0 if spec.sync.combine == "sum" else 0.0,
        "noise_ratio": spec.scaling.noise_ratio,
    }


def autotune_summary(policy: ScalingPolicy) -> dict[str, Any] | None:
    """What the auto-tuner saw: its knee and every interval's s_Δ (why it did or did not evict)."""
    tuner = getattr(policy, "tuner", None)
    if tuner is None:
        return None
    return {"knee_step": tuner.knee_step, "tolerance": tuner.tolerance, "decisions": tuner.decisions}


@dataclass
class ScalePlan:
    """A decision made concrete: who leaves, who joins (from whose replica), the fleet after."""

    after: list[int]
    evict: list[int] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)
    donor: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    def write(self, directive: Directive) -> None:
        """Put the plan in the directive of the step it takes effect at."""
        directive.evict, directive.members = list(self.evict), list(self.after)
        directive.donors = [self.donor] if self.donor is not None else []

    def starts(self, *, round_: int, barrier: int, cursor: int) -> list[WorkerStart]:
        """How the joiners start: after ``barrier``, from the donor's replica as of that barrier."""
        return [
            WorkerStart(
                worker=w,
                members=list(self.after),
                round=round_,
                step=barrier + 1,
                cursor=cursor,
                donor_blob=replica_blob(self.donor, barrier),
            )
            for w in self.joined
            if self.donor is not None
        ]


def plan(
    decision: ScaleDecision,
    *,
    step: int,
    applied_at: int,
    elapsed: float,
    trainers: list[int],
    recent_loss: Mapping[int, float],
    min_workers: int,
    next_id: int,
) -> ScalePlan:
    """Evict the workers with the highest recent loss (never below ``min_workers``), or
    add workers with fresh ids starting from the lowest-id trainer's replica."""
    event = {"step": step, "applied_at": applied_at, "time": round(elapsed, 3), "reason": decision.reason}
    if decision.action == "evict":
        evict: list[int] = []
        for _ in range(decision.count):
            if len(trainers) - len(evict) <= min_workers:
                break
            candidates = {w: recent_loss.get(w, 0.0) for w in trainers if w not in evict}
            evict.append(pick_eviction(candidates))
        return ScalePlan(
            after=[w for w in trainers if w not in evict],
            evict=evict,
            events=[{**event, "action": "evict", "worker": w, "recent_loss": recent_loss.get(w)} for w in evict],
        )
    donor = trainers[0]
    joined = list(range(next_id, next_id + decision.count))
    return ScalePlan(
        after=sorted(trainers + joined),
        joined=joined,
        donor=donor,
        events=[{**event, "action": "join", "worker": w, "donor": donor} for w in joined],
    )
