"""When a job ends, and which scoring is the best so far (docs/ARCHITECTURE.md,
"Validation and early stopping").

The supervisor hands every closed step and every held-out scoring here; the rules read
and update the job's ``StopState``. The first rule that holds ends the job:
``stop.target_val`` reached ("converged"), ``stop.patience_evals`` validation scorings
without a better one ("early_stopped"), ``stop.target_loss`` held for ``stop.patience``
steps ("converged"), then the backstops: ``max_epochs``, ``max_seconds``, ``budget_usd``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ebb.catalogue import entry
from ebb.cost.model import would_exceed
from ebb.engine.accounting import record_scoring
from ebb.engine.errors import EngineError
from ebb.engine.state import Best, StopReason, StopState, SupervisorState, TargetHit
from ebb.ports.messages import Scoring, StepReport
from ebb.spec import JobSpec


def improved(value: float, best: float | None, min_delta: float) -> bool:
    """Whether ``value`` beats ``best``: lower by ``min_delta``'s share at least. The one
    rule of "better": the scoring worker keeps its best replica by it, and the supervisor
    counts the scorings without one by it."""
    return best is None or value < best * (1 - min_delta)


def take_val(
    stop: StopState, spec: JobSpec, value: float, step: int, epoch: float | None, *, settling: bool = False
) -> None:
    """A validation scoring: a new best, or one more scoring without one — unless the
    fleet is ``settling`` (a scale event since the previous scoring), when no better one
    is not held against the job."""
    if improved(value, stop.best.value if stop.best else None, spec.stop.min_delta):
        stop.best = Best(value=value, step=step, epoch=epoch, since=0)
    elif stop.best is not None and not settling:
        stop.best.since += 1


def settling(state: SupervisorState, step: int, split: str) -> bool:
    """Whether a scale event took effect since the scoring before the one of ``step``: the
    fleet re-settles after one (its replicas re-stripe, the loss bumps), and an eviction
    that tripped early stopping there cost a job its target (issue 27)."""
    events = [e.get("applied_at", e.get("step", -1)) for e in state.scale_events]
    if not events:
        return False
    previous = next((k for k in range(min(step, len(state.history)) - 1, -1, -1) if split in state.history[k]), -1)
    return any(previous < at <= step for at in events)


def take_scoring(
    state: SupervisorState, spec: JobSpec, scoring: Scoring, *, now: float, fleet_clock: bool
) -> tuple[str, float] | None:
    """A held-out scoring (validation, or test standing in when there is none), of its
    metric named like the training loss: into the history (returns what to record when its
    step closes, if it is not closed yet), on validation a new best or one more scoring
    without one, and the first at or below ``stop.target_val`` remembered."""
    stop, value = state.stop, scoring.metrics[entry(spec.model).loss_name]
    early = record_scoring(state, scoring, value)
    if scoring.split == "val":
        take_val(stop, spec, value, scoring.step, scoring.epoch, settling=settling(state, scoring.step, "val"))
    target = spec.stop.target_val
    if target is not None and value <= target and stop.target_hit is None:
        at = state.history[scoring.step]["time"] if early is None else now
        # Host time holds the scorings; fleet time never did (scoring CPU is not in cpu_seconds).
        excluded = 0.0 if fleet_clock else state.overheads.eval_seconds - scoring.seconds
        stop.target_hit = TargetHit(
            step=scoring.step,
            time=at,
            seconds_excluding_eval=at - excluded,
            metric=entry(spec.model).loss_name,
            value=value,
        )
    return early


# The share of a job's budget kept for what it is billed after a budget stop.
BUDGET_FINISH_SHARE = 0.05


def steps_to_target(state: SupervisorState, spec: JobSpec, step: int, *, scan: int = 4000) -> float | None:
    """Steps left after ``step`` until ``stop.target_val``, from the held-out scorings so
    far: the last three extrapolated along a straight line (None without a target, three
    scorings in the last ``scan`` steps, or a descent). A descending metric flattens, so
    the line puts the target sooner than it comes: the estimate errs towards a short rest
    of the job, and the auto-tuner's cost guard, which reads it, towards fewer evictions."""
    target = spec.stop.target_val
    if target is None:
        return None
    points: list[tuple[int, float]] = []
    split: str | None = None
    for k in range(min(step, len(state.history) - 1), max(-1, step - scan), -1):
        entry_k = state.history[k]
        if split is None:
            split = "val" if "val" in entry_k else "test" if "test" in entry_k else None
        if split is not None and split in entry_k:
            points.append((k, float(entry_k[split])))
            if len(points) == 3:
                break
    if len(points) < 3:
        return None
    xs = [float(k) for k, _ in points]
    ys = [v for _, v in points]
    mx, my = sum(xs) / 3, sum(ys) / 3
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if not slope < 0:
        return None
    last_step, last_value = points[0]
    return max(0.0, (last_value - target) / -slope - (step - last_step))


def stop_reason(
    stop: StopState,
    spec: JobSpec,
    *,
    loss: float,
    epoch_next: float,
    epoch_limit: float,
    elapsed: float,
    cost_usd: float,
    step: int,
) -> StopReason | None:
    """Why the job stops after ``step`` (None: it goes on). ``epoch_next``: the epochs done
    after the next step, so ``max_epochs`` stops where a step-by-step decision would."""
    rules = spec.stop
    if stop.target_hit is not None:
        return "converged"
    if stop.best is not None and stop.best.since >= rules.patience_evals:
        return "early_stopped"
    if rules.target_loss is not None:
        stop.at_target = stop.at_target + 1 if loss <= rules.target_loss else 0
        if stop.at_target >= rules.patience:
            return "converged"
    if epoch_next >= epoch_limit:
        return "max_epochs"
    if elapsed >= rules.max_seconds:
        return "max_time"
    if rules.budget_usd is not None and step > 0:
        # Stop while the next steps still fit, keeping a margin for what is billed after
        # the stop (final replicas, merge, evaluation, the outputs' writes): two steps and
        # BUDGET_FINISH_SHARE of the budget (two steps alone let a search of small jobs
        # end 1.3 % over its budget).
        per_step = cost_usd / (step + 1)
        if would_exceed(cost_usd + 2 * per_step + BUDGET_FINISH_SHARE * rules.budget_usd, rules.budget_usd):
            return "budget"
    return None


@dataclass(frozen=True)
class Watch:
    """How far the rule expected to end the job has got: ``done`` of ``total``."""

    rule: str  # early_stopping | target_loss | max_epochs | max_time | budget
    done: float
    total: float

    def as_dict(self) -> dict[str, float | str]:
        return {"rule": self.rule, "done": self.done, "total": self.total}


def watch(
    stop: StopState,
    spec: JobSpec,
    *,
    scoring_val: bool,
    epoch: float,
    epoch_limit: float,
    elapsed: float,
    cost_usd: float,
) -> Watch:
    """The rule a user should watch: early stopping when validation is scored (scorings
    since the best against ``patience_evals``), else the training-loss target, else the
    epochs. A backstop the user set (``max_epochs``, ``max_seconds``, ``budget_usd``) takes
    over once it is further along."""
    rules = spec.stop
    if scoring_val:
        main = Watch("early_stopping", stop.best.since if stop.best else 0, rules.patience_evals)
    elif rules.target_loss is not None:
        main = Watch("target_loss", stop.at_target, rules.patience)
    else:
        main = Watch("max_epochs", epoch, epoch_limit)
    backstops = [Watch("max_time", elapsed, rules.max_seconds)] if "max_seconds" in rules.model_fields_set else []
    if rules.max_epochs is not None and main.rule != "max_epochs":
        backstops.append(Watch("max_epochs", epoch, epoch_limit))
    if rules.budget_usd is not None:
        backstops.append(Watch("budget", cost_usd, rules.budget_usd))
    return max([main, *backstops], key=lambda w: w.done / w.total if w.total else 0.0)


def check_finite(
    step: int,
    loss: float,
    reports: Mapping[int, StepReport],
    *,
    epoch: float,
    lr: float | None,
    loss_of: Callable[[float, int], float],
) -> None:
    """A job whose training loss went non-finite cannot go on: say which workers, and what to change."""
    if math.isfinite(loss):
        return
    bad = sorted(w for w, r in reports.items() if not math.isfinite(loss_of(r.loss_sum, r.samples)))
    raise EngineError(diverged(step, bad, epoch, lr))


def diverged(step: int, bad_workers: list[int], epoch: float, lr: float | None) -> str:
    lr = lr or 0.0
    return (
        f"the training loss diverged at step {step}: worker(s) {bad_workers} computed a non-finite loss "
        f"(epoch {epoch:.2f}); the learning rate {lr:g} is too high for this data: lower hyper.lr (--lr), "
        f"e.g. to {lr / 4:g}"
    )
