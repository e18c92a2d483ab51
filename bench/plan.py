"""`ebb plan`'s predictions against real fleet-clock runs (issue 27; docs/RESULTS-TOOLS.md §9).

For each job: plan it (profiles at --profile-workers for --profile-steps steps each, on the
fleet clock), then run it for real on the fleet clock at every size of --workers, the
scaling policy off, for the same epochs, and compare predicted with measured time and $.
The recommendation (best Perf/$ unless --max-seconds / --max-usd) is judged against the
best measured configuration on that objective.

    python bench/plan.py                                   # PMF quick, PMF ML-10M shape, sparse LR Criteo shape
    python bench/plan.py --jobs pmf-quick --workers 4,8    # one job, two sizes
    python bench/plan.py --workers 8,16,24 --plan-only --label tuner-ceilings   # the tuner's gains

``--plan-only`` skips the real runs: the table is the plan's, with each size's predicted
auto-tuner gain (``ebb.plan.planner.tuner_gain``: evictions only past the knee) beside what
starting smaller would gain (``tuner_ceiling``).

Jobs: ``pmf-quick`` (1M planted ratings, 8 epochs), ``pmf-ml10m`` (10M ratings at
MovieLens-10M shape, half an epoch, for time: the steps of 5 quick epochs, each a
MovieLens-10M step), ``sparse_lr-criteo`` (1M Criteo-shaped rows, 4 epochs). JSON to
bench/results/plan/<label>.json, the plan's plot beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, result_path, write_json  # noqa: E402

from ebb.local.runner import run_local  # noqa: E402
from ebb.plan.planner import draw, make_plan, recommend  # noqa: E402
from ebb.spec import load_spec  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"

JOBS = {
    "pmf-quick": {"model": "pmf", "shape": "quick", "epochs": 8.0},
    "pmf-ml10m": {"model": "pmf", "shape": "ml10m", "epochs": 0.5},
    "sparse_lr-criteo": {"model": "sparse_lr", "shape": "criteo", "epochs": 4.0},
}


def dataset(job: dict) -> str:
    if job["model"] == "pmf":
        from sync import dataset as ratings

        return ratings(job["shape"])[0]
    from autotuner import logistic_dataset

    return logistic_dataset(1_000_000, 0, "criteo")[0]


def job_spec(name: str, data: str, workers: int, out: Path, args):
    from sync import fresh_out

    job = JOBS[name]
    return load_spec(
        overrides={
            "name": f"bench-plan-{name}",
            "model": job["model"],
            "data": data,
            "workers": workers,
            "sync.mode": "isp",
            "clock.kind": "fleet",
            "scaling.policy": "none",
            "stop.eval_every": 0,
            "stop.max_epochs": job["epochs"],
            "out": fresh_out(out),
        }
    )


def measure(name: str, data: str, workers: int, args) -> dict:
    spec = job_spec(name, data, workers, DATA / "runs" / f"plan-{name}-P{workers}", args)
    started = time.monotonic()
    report, _ = run_local(spec)
    return {
        "workers": workers,
        "status": report["status"],
        "steps": report["steps"],
        "seconds": report["wall_seconds"],
        "usd": report["cost"]["total_usd"],
        "perf_per_dollar": report["perf_per_dollar"],
        "host_s": round(time.monotonic() - started, 1),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--workers", default="4,8,16,32", help="fleet sizes predicted and run")
    ap.add_argument("--profile-workers", default="2,4,8")
    ap.add_argument("--profile-steps", type=int, default=30)
    ap.add_argument("--max-seconds", type=float, default=None)
    ap.add_argument("--max-usd", type=float, default=None)
    ap.add_argument("--label", default=None, help="JSON name (default: the jobs)")
    ap.add_argument("--replot", metavar="JSON", help="only draw the plans of a result JSON (beside it)")
    ap.add_argument("--plan-only", action="store_true", help="no real runs: the plans and the tuner's gains")
    args = ap.parse_args(argv)
    if args.replot:
        import json

        return plot_plans(json.loads(Path(args.replot).read_text())["jobs"], Path(args.replot).with_suffix(".png"))
    sizes = [int(v) for v in args.workers.split(",")]
    results, table = {}, []
    for name in args.jobs.split(","):
        data = dataset(JOBS[name])
        base = job_spec(name, data, sizes[0], DATA / "runs" / f"plan-{name}-profile", args)
        started = time.monotonic()
        plan = make_plan(
            base,
            workers=sizes,
            epochs=JOBS[name]["epochs"],
            profile_sizes=[int(v) for v in args.profile_workers.split(",")],
            profile_steps=args.profile_steps,
            max_usd=args.max_usd,
            max_seconds=args.max_seconds,
            say=lambda line: print(line, flush=True),
        )
        plan_s = time.monotonic() - started
        if args.plan_only:
            results[name] = {"plan": plan.to_dict(), "plan_host_seconds": round(plan_s, 1)}
            table += [
                {"job": name, **{k: r[k] for k in ("workers", "steps", "seconds", "usd", "perf_per_dollar")}}
                | {k: r.get(k) for k in ("tuner_gain", "tuner_workers", "start_gain", "start_workers")}
                for r in plan.rows
            ]
            continue
        measured = []
        for p in sizes:
            print(f"-- {name}: real run at {p} workers", flush=True)
            measured.append(measure(name, data, p, args))
        rows = []
        for predicted, real in zip(plan.rows, measured):
            rows.append(
                {
                    "job": name,
                    "workers": real["workers"],
                    "steps": real["steps"],
                    "steps_predicted": predicted["steps"],
                    "seconds": real["seconds"],
                    "seconds_predicted": predicted["seconds"],
                    "seconds_error": predicted["seconds"] / real["seconds"] - 1,
                    "usd": real["usd"],
                    "usd_predicted": predicted["usd"],
                    "usd_error": predicted["usd"] / real["usd"] - 1,
                    "host_s": real["host_s"],
                }
            )
        best_measured, objective, _ = recommend(measured, max_usd=args.max_usd, max_seconds=args.max_seconds)
        chosen = plan.recommended
        score = {
            "perf_per_dollar": lambda r: 1 / r["perf_per_dollar"],
            "cheapest": lambda r: r["usd"],
            "fastest": lambda r: r["seconds"],
        }[objective]
        regret = (
            score(measured[chosen]) / score(measured[best_measured]) - 1
            if chosen is not None and best_measured is not None
            else None
        )
        errors = [abs(r[k]) for r in rows for k in ("seconds_error", "usd_error")]
        results[name] = {
            "rows": rows,
            "plan": plan.to_dict(),
            "plan_host_seconds": round(plan_s, 1),
            "objective": objective,
            "recommended_workers": None if chosen is None else plan.rows[chosen]["workers"],
            "best_measured_workers": None if best_measured is None else measured[best_measured]["workers"],
            "recommendation_regret": regret,
            "median_abs_error": statistics.median(errors),
            "worst_abs_error": max(errors),
        }
        table += rows
        print(
            f"{name}: median |error| {100 * results[name]['median_abs_error']:.1f} %, worst "
            f"{100 * results[name]['worst_abs_error']:.1f} %; recommended {results[name]['recommended_workers']} "
            f"workers, best measured {results[name]['best_measured_workers']} ({objective}; regret "
            f"{100 * (regret or 0):.1f} %)",
            flush=True,
        )
    print()
    if args.plan_only:
        return plan_only_summary(table, results, args)
    print_table(
        table,
        [
            ("job", "job"),
            ("workers", "P"),
            ("steps", "steps"),
            ("seconds", "s measured"),
            ("seconds_predicted", "s predicted"),
            ("seconds_error", "s error"),
            ("usd", "$ measured"),
            ("usd_predicted", "$ predicted"),
            ("usd_error", "$ error"),
            ("host_s", "host s"),
        ],
    )
    errors = [abs(r[k]) for r in table for k in ("seconds_error", "usd_error")]
    summary = {
        "median_abs_error": statistics.median(errors),
        "worst_abs_error": max(errors),
        "max_regret": max((v["recommendation_regret"] or 0) for v in results.values()),
    }
    print(
        f"\nall: median |error| {100 * summary['median_abs_error']:.1f} % (target ≤ 15), worst "
        f"{100 * summary['worst_abs_error']:.1f} % (≤ 30); recommendation within "
        f"{100 * summary['max_regret']:.1f} % of the best measured (≤ 10)"
    )
    out = write_json(
        result_path("plan", args.label or "-".join(results)),
        {"summary": summary, "jobs": results, "settings": vars(args)},
    )
    plot_plans(results, out.with_suffix(".png"))


def plan_only_summary(table: list[dict], results: dict, args) -> None:
    """The plans' predictions and the tuner's gains, printed and written."""
    print_table(
        table,
        [
            ("job", "job"),
            ("workers", "P"),
            ("steps", "steps"),
            ("seconds", "s predicted"),
            ("usd", "$ predicted"),
            ("perf_per_dollar", "Perf/$"),
            ("tuner_gain", "tuner gain"),
            ("tuner_workers", "ends at P"),
            ("start_gain", "smaller start"),
            ("start_workers", "at P"),
        ],
    )
    out = write_json(result_path("plan", args.label or "-".join(results)), {"jobs": results, "settings": vars(args)})
    plot_plans(results, out.with_suffix(".png"))


def plot_plans(jobs: dict, png: Path) -> None:
    """Each job's plan, time against $ (its front joined, its pick ringed), side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(jobs), figsize=(5 * len(jobs), 4), squeeze=False)
    for ax, (name, job) in zip(axes[0], jobs.items()):
        draw(ax, job["plan"], title=f"{name}: predicted time against $")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
