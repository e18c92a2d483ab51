"""``ebb plan``: profile a job briefly on the fleet clock, predict its time and dollars at
every fleet size and memory asked about, and recommend one (docs/RESULTS-TOOLS.md, "Planning a job").

A profile runs the job itself (its data's real minibatches, its sync model) for a few
dozen steps at two or three fleet sizes on the fleet clock, with the scaling policy off,
and keeps what each worker reported for each step (``run_local``'s ``measure_of``). The
fits are in ``ebb.plan.fit``; the dollars are the engine's own cost meter
(``ebb.cost.meter``) applied to the predicted time and worker time, so a prediction and a
run's ``report.json`` price the same usage alike.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ebb.cost.meter import JobAccount, meter_for
from ebb.cost.model import MB_PER_VCPU, perf_per_dollar
from ebb.engine.cadence import one_worker_epoch
from ebb.engine.fleet_clock import Links, WorkerStep
from ebb.plan.fit import (
    Progress,
    SizeSample,
    StepModel,
    epoch_steps,
    fit_progress,
    fit_step_model,
    miss_share,
    sample_of,
)
from ebb.spec import JobSpec

DEFAULT_WORKERS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_PROFILE_STEPS = 30
# With a validation target the steps to it, and the tuner's knee, are extrapolated from the
# profiles' curves: 30 steps put PMF quick's target at 3.0–3.4× its real steps, its tuner
# gain at 1.23–1.28× for a real 1.00×; 100 steps at 0.64–0.73× and 1.00× (docs/RESULTS-TOOLS.md §9).
DEFAULT_TARGET_PROFILE_STEPS = 100
# The tuner's gain is predicted only for jobs of at most this many times the profiled steps.
TUNER_EXTRAPOLATION = 10.0
OBJECTIVES = ("perf_per_dollar", "cheapest", "fastest")


@dataclass
class ProfileRun:
    """One profiled fleet size: the reduced sample, the validation curve in progress units."""

    sample: SizeSample
    curve: tuple[list[float], list[float]]
    host_seconds: float
    losses: tuple[list[int], list[float]] = ((), ())  # (step, global training loss) of every step


def _dataset(spec: JobSpec):
    from ebb.ports.manifest import load_manifest
    from ebb.stores import open_object_store

    data = open_object_store(spec.data)
    return data, load_manifest(data, spec.data)


def profile_size(spec: JobSpec, workers: int, steps: int, *, eval_every: int = 0, out: str | None = None) -> ProfileRun:
    """Run ``spec`` at ``workers`` for ``steps`` steps on the fleet clock (no scaling,
    no stop rule but the step count) and reduce what the workers reported."""
    from ebb.local.runner import run_local

    _, manifest = _dataset(spec)
    parts = len(manifest.train.parts)
    scratch = out or tempfile.mkdtemp(prefix=f"ebb-plan-P{workers}-")
    trial = spec.model_copy(
        update={
            "workers": workers,
            "out": scratch,
            "clock": spec.clock.model_copy(update={"kind": "fleet"}),
            "scaling": spec.scaling.model_copy(update={"policy": "none"}),
            "stop": spec.stop.model_copy(
                update={
                    "max_epochs": (steps + 0.5) * workers / parts,
                    "target_val": None,
                    "target_loss": None,
                    "eval_every": eval_every,
                    "patience_evals": 10**6,
                    "budget_usd": None,
                    "max_seconds": 10**7,
                }
            ),
        }
    )
    trial = JobSpec.model_validate(trial.model_dump())
    by_step: dict[int, dict[int, WorkerStep]] = {}
    gets: dict[int, dict[int, int]] = {}

    def measure(report) -> WorkerStep:
        m = WorkerStep.of(report)
        by_step.setdefault(report.step, {})[report.worker] = m
        gets.setdefault(report.step, {})[report.worker] = report.object_gets
        return m

    started = time.monotonic()
    report, _ = run_local(trial, measure_of=measure)
    if report["status"] == "failed":
        raise RuntimeError(f"the profile at {workers} workers failed: {report.get('error')}")
    history = report["history"]
    # The first step of a wave carries the cold start and the processes' start-up CPU.
    kept = sorted(s for s in by_step if s > 0)
    times = [h["time"] for h in history]
    step_s = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else times[0]
    first_extra = times[0] - trial.clock.cold_start_s - step_s
    sample = sample_of(workers, [by_step[s] for s in kept], [gets[s] for s in kept], step_s, first_extra)
    unit = one_worker_epoch(trial, parts)
    split = "val" if manifest.has_val else "test"
    curve = ([(h["step"] + 1) / unit for h in history if split in h], [h[split] for h in history if split in h])
    losses = ([h["step"] for h in history], [h["loss"] for h in history])
    return ProfileRun(sample=sample, curve=curve, host_seconds=time.monotonic() - started, losses=losses)


def fetch_measure(spec: JobSpec, parts: int = 3) -> tuple[float, int]:
    """(CPU seconds, decoded bytes) to fetch, check and decode one training minibatch,
    measured here on a few."""
    from ebb.engine.parts import PartCache, batch_nbytes
    from ebb.models import build_model

    data, manifest = _dataset(spec)
    model = build_model(spec.model, manifest, spec.hyper, spec.seed)
    cache = PartCache(data, manifest, model, max_bytes=0)
    count = min(parts, len(manifest.train.parts))
    start = time.process_time()
    sizes = [batch_nbytes(cache.get(index)) for index in range(count)]
    return (time.process_time() - start) / count, int(sum(sizes) / count)


def cached_share(spec: JobSpec, part_bytes: int, num_parts: int) -> float:
    """The share of the training parts one worker's part cache holds."""
    total = part_bytes * num_parts
    return 1.0 if total <= 0 else min(1.0, spec.aws.part_cache_bytes() / total)


@dataclass
class Plan:
    """Every configuration's prediction, the Pareto front and the recommendation."""

    rows: list[dict[str, Any]]
    front: list[int]  # indices into rows
    recommended: int | None
    objective: str
    model: StepModel
    progress: Progress | None
    profiles: list[dict[str, Any]] = field(default_factory=list)
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "recommended": None if self.recommended is None else self.rows[self.recommended],
            "why": self.why,
            "rows": self.rows,
            "pareto_front": [self.rows[i] for i in self.front],
            "step_model": self.model.to_dict(),
            "progress": None if self.progress is None else self.progress.to_dict(),
            "profiles": self.profiles,
        }


def predict(
    spec: JobSpec,
    model: StepModel,
    workers: int,
    memory_mb: int,
    *,
    num_parts: int,
    epochs: float | None = None,
    progress_units: float | None = None,
    cache_share: float = 1.0,
) -> dict[str, Any]:
    """Predicted time and dollars of ``spec`` at ``workers`` and ``memory_mb`` for
    ``epochs`` passes, or ``progress_units`` of one worker's epochs (a validation target)."""
    sized = spec.model_copy(update={"workers": workers, "aws": spec.aws.model_copy(update={"memory_mb": memory_mb})})
    if epochs is not None:
        steps = epoch_steps(epochs, num_parts, workers)
    elif progress_units is not None:
        steps = max(1, math.ceil(progress_units * one_worker_epoch(sized, num_parts)))
    else:
        raise ValueError("predict needs epochs or progress units")
    # Lambda gives CPU in proportion to memory up to one vCPU at 1,769 MB; a worker is
    # single-threaded, so more buys no speed (the profile ran with a core per worker).
    slow = MB_PER_VCPU / min(memory_mb, MB_PER_VCPU)
    per_epoch = num_parts / workers
    train_s, parts_sum = 0.0, {"cpu": 0.0, "wire": 0.0, "rtt": 0.0, "barrier": 0.0}
    done, epoch, misses = 0, 0, 0.0
    while done < steps:
        in_epoch = min(steps - done, max(1, math.ceil(per_epoch * (epoch + 1) - done - 1e-9)))
        miss = miss_share(epoch, workers, cache_share)
        p = model.parts(workers, miss)
        step = p["total"] + (slow - 1.0) * p["cpu"]
        train_s += in_epoch * step
        for k in parts_sum:
            parts_sum[k] += in_epoch * p[k] * (slow if k == "cpu" else 1.0)
        misses += in_epoch * workers * miss
        done += in_epoch
        epoch += 1
    links = model.links
    rounds = max(1, math.ceil(train_s / sized.round_seconds))
    start_s = links.cold_start_s + max(0.0, model.first_extra(workers - 1))
    wall = train_s + rounds * start_s
    account = JobAccount(
        wall_seconds=wall,
        worker_seconds=workers * wall,
        rounds=rounds,
        worker_invocations=workers * rounds,
        object_gets=round(misses),
        object_puts=rounds * (workers + 1),
        reports=steps * workers,
        directives=steps,
    )
    cost = meter_for(sized)(account)
    return {
        "workers": workers,
        "memory_mb": memory_mb,
        "steps": steps,
        "step_s": train_s / steps,
        "seconds": wall,
        "usd": cost["total_usd"],
        "usd_by_component": {k: v for k, v in cost["by_component"].items() if v > 0},
        "seconds_by_part": {**{k: v for k, v in parts_sum.items()}, "start": rounds * start_s},
        "perf_per_dollar": perf_per_dollar(wall, cost["total_usd"]),
    }


def pareto_front(rows: Sequence[dict[str, Any]]) -> list[int]:
    """Indices of the configurations no other is both at least as fast and as cheap as
    (and strictly better in one), by time."""
    front = []
    for i, r in enumerate(rows):
        dominated = any(
            o["seconds"] <= r["seconds"]
            and o["usd"] <= r["usd"]
            and (o["seconds"] < r["seconds"] or o["usd"] < r["usd"])
            for o in rows
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: rows[i]["seconds"])


def recommend(
    rows: Sequence[dict[str, Any]], *, max_usd: float | None = None, max_seconds: float | None = None
) -> tuple[int | None, str, str]:
    """(index, objective, why): the cheapest within ``max_seconds``, the fastest within
    ``max_usd`` (both: the cheapest within both), else the best Perf/$ (1 / (s × $))."""
    fits = [
        i
        for i, r in enumerate(rows)
        if (max_usd is None or r["usd"] <= max_usd) and (max_seconds is None or r["seconds"] <= max_seconds)
    ]
    if max_seconds is not None:
        objective, key = "cheapest", (lambda i: (rows[i]["usd"], rows[i]["seconds"]))
    elif max_usd is not None:
        objective, key = "fastest", (lambda i: (rows[i]["seconds"], rows[i]["usd"]))
    else:
        objective, key = "perf_per_dollar", (lambda i: -rows[i]["perf_per_dollar"])
    if not fits:
        limits = " and ".join(
            t for t in (f"${max_usd:g}" if max_usd else "", f"{max_seconds:g} s" if max_seconds else "") if t
        )
        return None, objective, f"no configuration fits {limits}"
    best = min(fits, key=key)
    return (
        best,
        objective,
        {
            "cheapest": f"the cheapest within {max_seconds:g} s" if max_seconds else "",
            "fastest": f"the fastest within ${max_usd:g}" if max_usd else "",
            "perf_per_dollar": "the highest Perf/$ = 1 / (seconds × $)",
        }[objective],
    )


def make_plan(
    spec: JobSpec,
    *,
    workers: Sequence[int] = DEFAULT_WORKERS,
    memories: Sequence[int] | None = None,
    epochs: float | None = None,
    target: float | None = None,
    profile_sizes: Sequence[int] | None = None,
    profile_steps: int | None = None,
    max_usd: float | None = None,
    max_seconds: float | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> Plan:
    """Profile, fit, predict every (workers, memory), and recommend."""
    _, manifest = _dataset(spec)
    num_parts = len(manifest.train.parts)
    workers = sorted({w for w in workers if 1 <= w <= num_parts})
    if not workers:
        raise ValueError(f"no fleet size asked for fits the data's {num_parts} minibatches")
    memories = list(memories or [spec.aws.memory_mb])
    if target is None and epochs is None:
        target = spec.stop.target_val
        if target is None:
            epochs = spec.stop.max_epochs
        if target is None and epochs is None:
            raise ValueError("say what the job must reach: --target-val X or --epochs N")
    if profile_steps is None:
        profile_steps = DEFAULT_PROFILE_STEPS if target is None else DEFAULT_TARGET_PROFILE_STEPS
    sizes = sorted(set(profile_sizes or default_profile_sizes(workers, num_parts)))
    links = Links.of(spec.clock)
    runs: list[ProfileRun] = []
    for p in sizes:
        steps = max(profile_steps, 8)
        say(f"profiling {p} worker{'s' if p > 1 else ''} for {steps} steps on the fleet clock ...")
        runs.append(profile_size(spec, p, steps, eval_every=max(1, steps // 10) if target is not None else 0))
    fetch, part_bytes = fetch_measure(spec)
    model = fit_step_model([r.sample for r in runs], links, fetch_cpu_s=fetch)
    progress = None
    if target is not None:
        progress = fit_progress({r.sample.workers: r.curve for r in runs}, target)
    rows = []
    for p in workers:
        for mem in memories:
            share = cached_share(
                spec.model_copy(update={"aws": spec.aws.model_copy(update={"memory_mb": mem})}), part_bytes, num_parts
            )
            kwargs: dict[str, Any] = {"num_parts": num_parts, "cache_share": share}
            if progress is not None:
                row = predict(spec, model, p, mem, progress_units=progress.units, **kwargs)
                lo = predict(spec, model, p, mem, progress_units=progress.low, **kwargs)
                hi = predict(spec, model, p, mem, progress_units=progress.high, **kwargs)
                row["seconds_range"] = [lo["seconds"], hi["seconds"]]
                row["usd_range"] = [lo["usd"], hi["usd"]]
            else:
                row = predict(spec, model, p, mem, epochs=epochs, **kwargs)
            rows.append({**row, "_share": share})
    knee = loss_model(spec, runs, num_parts)
    for row in rows:
        share = row.pop("_share")
        row.update(tuner_ceiling(spec, model, row, num_parts=num_parts, cache_share=share))
        gain = tuner_gain(
            spec, model, row, num_parts=num_parts, cache_share=share, loss=knee, to_target=target is not None
        )
        row.update(gain)
    best, objective, why = recommend(rows, max_usd=max_usd, max_seconds=max_seconds)
    return Plan(
        rows=rows,
        front=pareto_front(rows),
        recommended=best,
        objective=objective,
        model=model,
        progress=progress,
        profiles=[{**r.sample.to_dict(), "host_seconds": round(r.host_seconds, 2)} for r in runs],
        why=why,
    )


def tuner_ceiling(
    spec: JobSpec, model: StepModel, row: dict[str, Any], *, num_parts: int, cache_share: float
) -> dict[str, Any]:
    """What *starting* smaller would gain over ``row``'s fleet P (``start_gain`` at
    ``start_workers``): the best Perf/$ over the fleets p ≤ P (down to
    ``scaling.min_workers``) relative to P's, each doing P's minibatches, a smaller fleet
    needing P/p the steps (the cost guard's noise-dominated progress model). Not what the
    auto-tuner attains: it evicts one worker at a time and only after the knee
    (``tuner_gain``); a smaller start is the plan's own recommendation."""
    P, mem = int(row["workers"]), int(row["memory_mb"])
    epochs = row["steps"] * P / num_parts
    floor = max(1, min(P, spec.scaling.min_workers))
    ppd = {
        p: predict(spec, model, p, mem, num_parts=num_parts, epochs=epochs, cache_share=cache_share)["perf_per_dollar"]
        for p in range(floor, P + 1)
    }
    best = max(ppd, key=lambda p: ppd[p])
    return {"start_gain": ppd[best] / ppd[P] if ppd[P] > 0 else 1.0, "start_workers": best}


@dataclass
class LossModel:
    """The training loss against progress, from the profiles, for the tuner's knee and its
    judgement windows: the tuner's own reference curve fitted to the largest profiled
    fleet's per-step losses (``steps_per_unit`` of its steps a unit of progress, one
    worker's epoch) and the losses' spread about it at that fleet (``noise``)."""

    curve: Any  # ebb.autotune.curves.ReferenceCurve, in the profiled fleet's steps
    steps_per_unit: float
    workers: int
    noise: float
    profiled_steps: float = 0.0  # how far the profile's losses go, in its fleet's steps

    def at(self, steps: np.ndarray, steps_per_unit: float) -> np.ndarray:
        """The loss after ``steps`` of a fleet with ``steps_per_unit``."""
        return np.asarray(self.curve(np.asarray(steps, float) * self.steps_per_unit / steps_per_unit), float)


def loss_model(spec: JobSpec, runs: Sequence[ProfileRun], num_parts: int) -> LossModel | None:
    """The profiles' loss model (None: no profile's losses can be fitted)."""
    from ebb.autotune.curves import fit_reference
    from ebb.autotune.knee import smooth_points
    from ebb.autotune.tuner import DEFAULT_REFERENCE_RECENCY

    for run in sorted(runs, key=lambda r: -r.sample.workers):
        steps, losses = (np.asarray(v, float) for v in run.losses)
        keep = np.isfinite(losses)
        steps, losses = steps[keep], losses[keep]
        if steps.size < 8:
            continue
        try:
            curve = fit_reference(*smooth_points(steps, losses, 0.3), recency=DEFAULT_REFERENCE_RECENCY)
        except ValueError:
            continue
        sized = spec.model_copy(update={"workers": run.sample.workers})
        return LossModel(
            curve=curve,
            steps_per_unit=float(one_worker_epoch(sized, num_parts)),
            workers=run.sample.workers,
            noise=float(np.std(losses - curve(steps), ddof=1)),
            profiled_steps=float(steps.max()),
        )
    return None


def tuner_gain(
    spec: JobSpec,
    model: StepModel,
    row: dict[str, Any],
    *,
    num_parts: int,
    cache_share: float,
    loss: LossModel | None,
    to_target: bool = True,
) -> dict[str, Any]:
    """The auto-tuner's predicted Perf/$ gain for a job started at ``row``'s fleet P, the
    tuner as built (``ebb.autotune.tuner``): P workers up to its knee (the knee detector
    run on the profiles' loss curve at P's steps); then, at each decision, one worker
    fewer only where the cost guard's formula says it pays over the rest of the job and
    (``to_target``: a job stopping at a target, whose rest the tuner estimates) that rest
    holds ``JUDGE_SHARE`` judgement windows, and after each eviction no
    decision until its judgement window has run (sized from the losses' spread and
    descent at the knee) nor before an interval ``T``; each smaller fleet needs the
    guard's m the steps (noise-dominated: progress per step in proportion to the fleet).
    The rest of the job's steps run at the fleet reached, with the job's fixed costs. The
    throughput guard applies as in the tuner; s_Δ (which can only refuse more) does not.
    ``tuner_gain`` None: the profiles' losses give no curve to find a knee on, or the job
    runs more than ``TUNER_EXTRAPOLATION`` times the steps they cover (the tuner's gain is
    made after the knee, and a curve extrapolated that far does not place the rest of the
    job: PMF at the quick shape on SGD, profiled over its first 100 steps, a plateau, was
    put at 8,113 steps to a target it reached in ~450)."""
    from ebb.autotune.knee import KneeDetector
    from ebb.autotune.tuner import JUDGE_SHARE, ScaleInTuner, judge_window
    from ebb.engine.scaling import cost_guard_params

    P, mem, S = int(row["workers"]), int(row["memory_mb"]), int(row["steps"])
    if loss is None:
        return {"tuner_gain": None, "tuner_workers": P, "tuner_knee_step": None}
    s = spec.scaling
    sized = spec.model_copy(update={"workers": P})
    unit = float(one_worker_epoch(sized, num_parts))
    covered = loss.profiled_steps * unit / loss.steps_per_unit  # the profile's reach, in P's steps
    if S > TUNER_EXTRAPOLATION * max(covered, 1.0):
        return {"tuner_gain": None, "tuner_workers": P, "tuner_knee_step": None}
    losses = loss.at(np.arange(S), unit)
    detector = KneeDetector(tolerance=s.knee_tolerance, patience=s.knee_patience, min_drop=s.knee_min_drop)
    knee = next((t for t, value in enumerate(losses) if detector.update(float(value)) is not None), None)
    if knee is None or knee + 1 >= S or P <= max(1, s.min_workers):
        return {"tuner_gain": 1.0, "tuner_workers": P, "tuner_knee_step": knee}
    floor = max(1, min(P, s.min_workers))
    epochs = S * P / num_parts
    step = {
        p: predict(spec, model, p, mem, num_parts=num_parts, epochs=epochs, cache_share=cache_share)["step_s"]
        for p in range(floor, P + 1)
    }
    guard = ScaleInTuner(
        interval_s=s.interval_s,
        horizon_s=min(s.horizon_s, s.interval_s),
        min_workers=s.min_workers,
        **cost_guard_params(spec),
    )
    guard.reference_workers = P
    start_s = model.links.cold_start_s + max(0.0, model.first_extra(P - 1))
    segments = [(P, knee + 1)]  # (fleet, steps)
    elapsed, done, rate, p = start_s + (knee + 1) * step[P], float(knee + 1), 1.0, P
    first_window = None
    while done < S:
        n = max(1, math.ceil(s.interval_s / step[p]))
        # The throughput guard, after the knee's eviction (minibatches a second kept within tolerance).
        keeps_pace = p == P or ((p - 1) / step.get(p - 1, math.inf)) / (P / step[P]) >= 1.0 - s.throughput_tolerance
        # R as the tuner takes it: the steps to the target (its estimate), at most the time so far.
        rest_s = min(elapsed, (S - done) / rate * step[p]) if to_target else elapsed
        pays, m, window = False, 1.0, 0
        if p > floor:
            m = guard.progress_steps(p)
            # The loss's descent per step at P's knee, at the smaller fleet's pace, and its
            # spread there (the global loss averages the fleet's minibatches): the window
            # that judges the eviction, which must fit JUDGE_SHARE times in the rest.
            descent = float(losses[knee] - losses[knee + 1]) * rate / m
            window = judge_window(loss.noise * math.sqrt(loss.workers / (p - 1)), descent, guard.min_fit_points)
            gain = guard.predicted_gain(p, step[p], step[p - 1], rest_s)
            judgeable = not to_target or rest_s / step[p] >= JUDGE_SHARE * window
            pays = gain > 1.0 + guard.cost_margin and judgeable
        if pays and keeps_pace:
            p, rate = p - 1, rate / m
            segments.append((p, int(guard.settle_steps)))  # re-settling: no progress
            elapsed += guard.settle_steps * step[p]
            first_window = first_window or window
            n = max(n, window)
        n = min(n, math.ceil((S - done) / rate))
        segments.append((p, n))
        elapsed += n * step[p]
        done += n * rate
    on = _segments_cost(spec, model, mem, segments, step, start_s)
    off = _segments_cost(spec, model, mem, [(P, S)], step, start_s)
    return {
        "tuner_gain": on["perf_per_dollar"] / off["perf_per_dollar"],
        "tuner_workers": p,
        "tuner_knee_step": knee,
        "tuner_window_steps": first_window,
        "tuner_seconds": on["seconds"],
        "tuner_usd": on["usd"],
    }


def _segments_cost(
    spec: JobSpec, model: StepModel, memory_mb: int, segments: Sequence[tuple[int, int]], step: dict, start_s: float
) -> dict[str, float]:
    """Time, $ and Perf/$ of a run through ``segments`` (fleet, steps), priced by the engine's meter
    as ``predict`` prices one fleet (the minibatch reads left out: alike with and without the tuner)."""
    P = segments[0][0]
    sized = spec.model_copy(update={"workers": P, "aws": spec.aws.model_copy(update={"memory_mb": memory_mb})})
    train_s = sum(n * step[p] for p, n in segments)
    rounds = max(1, math.ceil(train_s / sized.round_seconds))
    wall = train_s + rounds * start_s
    account = JobAccount(
        wall_seconds=wall,
        worker_seconds=sum(p * n * step[p] for p, n in segments) + P * rounds * start_s,
        rounds=rounds,
        worker_invocations=P * rounds,
        object_gets=0,
        object_puts=rounds * (P + 1),
        reports=sum(p * n for p, n in segments),
        directives=sum(n for _, n in segments),
    )
    usd = meter_for(sized)(account)["total_usd"]
    return {"seconds": wall, "usd": usd, "perf_per_dollar": perf_per_dollar(wall, usd)}


def default_profile_sizes(workers: Sequence[int], num_parts: int) -> list[int]:
    """Two or three small sizes that still show the slopes: 2, 4 and 8 where asked for
    and the data has the minibatches (profiling large fleets costs what it measures)."""
    sizes = [p for p in (2, 4, 8) if p <= num_parts]
    return sizes[:3] or [1]


def render(plan: Plan, *, target: float | None, epochs: float | None) -> str:
    """The table a user reads: every configuration, its time and $ by component, the front."""
    what = f"to validation {target:g}" if target is not None else f"{epochs:g} epochs"
    lines = [f"predicted, {what} (fleet clock: a vCPU and link per worker):"]
    comps = sorted({c for r in plan.rows for c in r["usd_by_component"]})
    short = {
        "lambda_workers": "workers",
        "lambda_supervisor": "superv",
        "lambda_requests": "invoke",
        "step_functions": "sfn",
    }
    head = f"{'':2}{'P':>3} {'MB':>5} {'steps':>6} {'seconds':>9} {'$':>9} {'Perf/$':>9} {'tuner':>9}  " + " ".join(
        f"{short.get(c, c):>8}" for c in comps
    )
    lines.append(head)
    front = set(plan.front)
    for i, r in enumerate(plan.rows):
        mark = ">" if i == plan.recommended else ("*" if i in front else " ")
        secs = f"{r['seconds']:9.1f}"
        lines.append(
            f"{mark:2}{r['workers']:>3} {r['memory_mb']:>5} {r['steps']:>6} {secs} {r['usd']:9.5f} "
            f"{r['perf_per_dollar']:9.4g} {_ceiling(r):>9}  "
            + " ".join(f"{r['usd_by_component'].get(c, 0.0):8.5f}" for c in comps)
        )
    lines.append("* on the Pareto front (no other configuration is both sooner and cheaper); > recommended")
    lines.append(
        "tuner: the auto-tuner's predicted Perf/$ gain started there (evicting only past the knee, one worker per "
        "judged window, where the cost guard says it pays) and the fleet it ends at"
    )
    if plan.progress is not None:
        lines.append(
            f"target reached after {plan.progress.units:.2f} one-worker epochs "
            f"(profiles: {plan.progress.low:.2f}–{plan.progress.high:.2f})"
        )
    if plan.recommended is None:
        lines.append(f"recommended: none ({plan.why})")
    else:
        r = plan.rows[plan.recommended]
        lines.append(
            f"recommended: {r['workers']} workers at {r['memory_mb']} MB, {r['seconds']:.1f} s, ${r['usd']:.5f} "
            f"({plan.why})"
        )
    return "\n".join(lines)


def _ceiling(row: dict[str, Any]) -> str:
    if "tuner_gain" not in row:
        return ""
    gain = row["tuner_gain"]
    return "?" if gain is None else f"{gain:.2f}× @{row['tuner_workers']}"


def plot(plan: Plan, path: str | Path) -> Path:
    """Time against $ per configuration, the Pareto front joined, the recommendation ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    draw(ax, plan.to_dict())
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def draw(ax: Any, plan: dict[str, Any], title: str = "ebb plan: time against cost per configuration") -> None:
    """Draw a plan (``Plan.to_dict()``) on a matplotlib axis."""
    rows = plan["rows"]
    ax.scatter([r["usd"] for r in rows], [r["seconds"] for r in rows], color="0.6", s=25, label="configuration")
    for r in rows:
        ax.annotate(
            f"{r['workers']}w/{r['memory_mb']}",
            (r["usd"], r["seconds"]),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    front = plan["pareto_front"]
    ax.plot([r["usd"] for r in front], [r["seconds"] for r in front], "o-", color="tab:blue", label="Pareto front")
    if (r := plan["recommended"]) is not None:
        ax.scatter(
            [r["usd"]], [r["seconds"]], s=180, facecolors="none", edgecolors="tab:red", lw=2, label="recommended"
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted $ (us-east-1 list prices)")
    ax.set_ylabel("predicted seconds (fleet clock)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
