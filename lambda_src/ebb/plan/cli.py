"""``ebb plan`` and ``--workers plan`` (``ebb train``, ``ebb submit``): the command side of
the planner; ``ebb.cli`` only registers it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EPILOG = """\
examples:
  ebb plan examples/pmf.yaml --epochs 20                    every fleet size 1..64, 20 epochs
  ebb plan job.yaml --target-val 0.56 --max-seconds 60      the cheapest within a minute
  ebb plan job.yaml --epochs 5 --workers 4,8,16 --memory 1024,1769,3008 --max-usd 0.05 --json

The job runs a few dozen steps at two or three fleet sizes (--profile-workers) on the fleet
clock (a vCPU and a link per worker, docs/ARCHITECTURE.md); the step time is fitted from
its parts (CPU, bytes per link, the cache node, the barrier) and the steps from the
engine's epoch-per-P rule (and, for --target-val, the profile's validation curve). The
table marks the Pareto front (*) and the recommendation (>); --plot writes time against $.
"""

# Fields `ebb plan` sets itself (the fleet it asks about, its own limits).
_OWN = ("workers", "stop.max_seconds", "stop.budget_usd")


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def add_plan(sub) -> None:
    """Register ``ebb plan``."""
    from ebb.flags import JOB_FLAGS, LOCAL_FLAGS, add_job_arguments

    p = sub.add_parser(
        "plan",
        help="predict a job's time and $ at each fleet size and memory; recommend one",
        description="Profile a job briefly on the fleet clock, predict its time and cost at every fleet size "
        "and memory asked about, print the table, the Pareto front and a recommendation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flags = [f for f in JOB_FLAGS + LOCAL_FLAGS if f.field not in _OWN and f.field not in ("redis_urls", "clock.kind")]
    add_job_arguments(p, flags)
    p.add_argument("--workers", type=_ints, default=None, help="fleet sizes to predict (default 1,2,4,8,16,32,64)")
    p.add_argument("--memory", type=_ints, default=None, help="Lambda memory sizes, MB (default: the job's)")
    p.add_argument("--epochs", type=float, default=None, help="plan for this many passes over the data")
    p.add_argument("--max-usd", type=float, default=None, help="recommend the fastest within this budget")
    p.add_argument("--max-seconds", type=float, default=None, help="recommend the cheapest within this time")
    p.add_argument("--profile-workers", type=_ints, default=None, help="fleet sizes profiled (default 2,4,8)")
    p.add_argument(
        "--profile-steps",
        type=int,
        default=None,
        help="steps profiled at each (default 30; 100 with a validation target: the profiles' curves extrapolate)",
    )
    p.add_argument("--plot", metavar="PNG", default=None, help="write time against $ here (default plan.png)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (for scripts)")
    p.set_defaults(func=cmd_plan, spec_flags="plan", plan_flags=flags)


def _spec(args, job: str | None):
    from ebb.flags import given
    from ebb.spec import load_spec

    overrides = given(args, args.plan_flags)
    return load_spec(job, overrides, args.assignments)


def cmd_plan(args) -> int:
    from ebb.plan.planner import DEFAULT_WORKERS, make_plan, plot, render
    from ebb.spec import SpecError

    try:
        spec = _spec(args, args.job)
    except SpecError as exc:
        print(f"ebb plan: {exc}", file=sys.stderr)
        return 2
    target = spec.stop.target_val if args.epochs is None else None
    try:
        plan = make_plan(
            spec,
            workers=args.workers or DEFAULT_WORKERS,
            memories=args.memory,
            epochs=args.epochs,
            target=target,
            profile_sizes=args.profile_workers,
            profile_steps=args.profile_steps,
            max_usd=args.max_usd,
            max_seconds=args.max_seconds,
            say=lambda line: print(line, file=sys.stderr),
        )
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"ebb plan: {exc}", file=sys.stderr)
        return 2
    png = plot(plan, args.plot or "plan.png")
    if args.json:
        print(json.dumps({**plan.to_dict(), "plot": str(png)}, indent=2))
    else:
        print(render(plan, target=target, epochs=args.epochs or (None if target else spec.stop.max_epochs)))
        print(f"plot: {png}")
    return 0 if plan.recommended is not None else 1


def accept_workers_plan(parser: argparse.ArgumentParser) -> None:
    """Let ``--workers`` of ``ebb train`` / ``ebb submit`` take ``plan`` besides a number."""
    for action in parser._actions:
        if action.dest == "spec__workers":
            action.type = _workers_or_plan
            action.metavar = "N|plan"
            action.help = (action.help or "").replace(
                " (default:", ", or `plan`: the fleet `ebb plan` recommends (profiled first) (default:", 1
            )


def _workers_or_plan(text: str) -> int | str:
    if text == "plan":
        return "plan"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of workers or 'plan', got {text!r}") from None


def resolve_workers_plan(args) -> int | None:
    """``--workers plan``: plan the job as given (its other flags and file) and put the
    recommended fleet size in ``args``; returns an exit code when it cannot."""
    if getattr(args, "spec__workers", None) != "plan":
        return None
    from ebb.flags import given
    from ebb.plan.planner import make_plan
    from ebb.spec import SpecError, load_spec

    args.spec__workers = None
    flags = [f for f in _job_flags(args) if f.field != "workers"]
    try:
        spec = load_spec(args.job, given(args, flags), args.assignments)
        plan = make_plan(spec, say=lambda line: print(line, file=sys.stderr))
    except (SpecError, ValueError, RuntimeError, OSError) as exc:
        print(f"ebb {args.command}: --workers plan: {exc}", file=sys.stderr)
        return 2
    if plan.recommended is None:
        print(f"ebb {args.command}: --workers plan: {plan.why}", file=sys.stderr)
        return 2
    best = plan.rows[plan.recommended]
    print(
        f"plan: {best['workers']} workers (predicted {best['seconds']:.1f} s, ${best['usd']:.5f}; {plan.why})",
        file=sys.stderr,
    )
    args.spec__workers = best["workers"]
    return None


def _job_flags(args) -> Any:
    from ebb.flags import JOB_FLAGS, LOCAL_FLAGS

    return JOB_FLAGS + LOCAL_FLAGS if getattr(args, "spec_flags", "") == "train" else JOB_FLAGS


def smaller_fleet_note(report: dict) -> str | None:
    """One line when this run's own measurements say a smaller fleet would have reached
    the same point both sooner (by 5 % or more) and cheaper (by 10 %), else None.

    The run is refitted at its own size (its totals: CPU, bytes, steps) and the smaller
    sizes predicted with the engine's epoch-per-P rule for its progress. One measured size
    gives no slopes: the bytes read and the CPU of applying the peers' updates (its share
    of the CPU by the run's phase timings) shrink with the peers, the rest stays."""
    from ebb.engine.fleet_clock import Links
    from ebb.plan.fit import Line, StepModel
    from ebb.plan.planner import predict
    from ebb.spec import JobSpec

    try:
        spec = JobSpec.model_validate(report["spec"])
        p, steps, totals = report["workers"]["initial"], report["steps"], report["totals"]
    except (KeyError, TypeError, ValueError):
        return None
    # A run the tuner scaled in is judged at its initial fleet, where it spent most steps.
    if p < 2 or steps < 2 or report.get("status") == "failed":
        return None
    reports = max(1, totals.get("reports", 0))
    # The CPU a step spends on the peers' updates (applying them) grows with the fleet; the
    # rest (fetch, the local step, the filter) does not: split the run's CPU by its phases.
    phases = totals.get("timing_seconds", {})
    own = sum(phases.get(k, 0.0) for k in ("fetch", "compute", "filter"))
    peers_share = phases.get("apply", 0.0) / (own + phases.get("apply", 0.0)) if own > 0 else 0.0
    cpu = totals.get("cpu_critical_seconds", 0.0) / steps
    model = StepModel(
        cpu=Line(cpu * (1 - peers_share), cpu * peers_share / (p - 1)),
        fetch_cpu=0.0,
        io_cpu=Line(0.0, 0.0),
        sent=Line(totals.get("bytes_sent", 0) / (steps * p), 0.0),
        read_per_peer=Line(totals.get("bytes_received", 0) / reports / (p - 1), 0.0),
        requests=Line(3.0, 0.0),
        straggle=Line(1.0, 0.0),
        links=Links.of(spec.clock),
    )
    from ebb.engine.cadence import one_worker_epoch

    parts = max(1, round(steps * p / max(report["epochs"], 1e-9)))
    units = steps / one_worker_epoch(spec, parts)
    here = predict(spec, model, p, spec.aws.memory_mb, num_parts=parts, progress_units=units)
    better = []
    for q in (q for q in (1, 2, 4, 8, 16, 32) if q < p):
        there = predict(spec, model, q, spec.aws.memory_mb, num_parts=parts, progress_units=units)
        if there["seconds"] <= 0.95 * here["seconds"] and there["usd"] <= 0.9 * here["usd"]:
            better.append(there)
    if not better:
        return None
    best = min(better, key=lambda r: r["usd"])
    return (
        f"note: {best['workers']} worker{'s' if best['workers'] > 1 else ''} would likely have been sooner "
        f"({best['seconds']:.1f} s against {here['seconds']:.1f}) and cheaper (${best['usd']:.4f} against "
        f"${here['usd']:.4f}) on a fleet; `ebb plan` with this job's flags profiles it"
    )
