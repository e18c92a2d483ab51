"""Scale-in auto-tuner on vs off (MLLess §6.2.2): 8 workers, ISP in both.

PMF on planted ratings at MovieLens-10M shape (as bench/sync.py) and sparse LR on planted
logistic data (both cached under bench/data/). Each run trains until the test metric (scored every --eval-every steps,
scoring time excluded) reaches the target, then reports time to target, the estimated
AWS cost of the run (bench's Lambda/Redis configuration from the job spec), Perf/$ =
1/(time × cost) and the final test metric; the PNG shows loss and active workers over
time for both runs, like MLLess Fig. 2.

    python bench/autotuner.py            # both models, 3 repeats (≈10 min on 2 cores)
    python bench/autotuner.py --models pmf
    python bench/autotuner.py --clock fleet --workers 24 --lr-data criteo   # on the fleet clock

On the fleet clock (``--clock fleet``) time, T and Δ are fleet seconds and the cost is the
engine's cost meter on fleet time. The JSON and PNG go to
``bench/results/autotuner/<clock>-<model>-<data>-P<workers>`` unless ``--json`` says where.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, provenance, result_path, write_json  # noqa: E402

from ebb.data.prepare import prepare_dataset  # noqa: E402
from ebb.data.synth import synth_logistic  # noqa: E402
from ebb.local.runner import run_local  # noqa: E402
from ebb.spec import load_spec  # noqa: E402
from ebb.stores.local import FolderObjectStore  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


# Planted logistic data: 20k features, 30 a row (the estimation gap above Bayes is ≈ D/2N:
# 1% at 1M rows, 0.3% at 4M). Criteo's shape (bench/quality.py's criteo-shaped): 39 values a
# row over 100,000 hashed features with a heavy popularity skew, so most features are rare.
LOGISTIC_SHAPES = {"planted": {"features": 20_000, "nnz": 30}, "criteo": {"features": 100_000, "nnz": 39, "zipf": 1.0}}


def logistic_dataset(rows: int, seed: int = 0, shape: str = "planted") -> tuple[str, dict]:
    """Generate and prepare (once) ``rows`` planted logistic rows of a shape; (prepared dir, meta)."""
    import json

    dims = LOGISTIC_SHAPES[shape]
    root = DATA / (
        f"logistic-20k-{rows // 1000}k-s{seed}" if shape == "planted" else f"{shape}-{rows // 1000}k-s{seed}"
    )
    raw, prepared = root / "data.svm", root / "prepared"
    if not (prepared / "manifest.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        synth_logistic(raw, rows=rows, seed=seed, **dims)
        prepare_dataset(
            "libsvm", raw, FolderObjectStore(prepared), batch_size=6250, test_fraction=0.1, val_fraction=0.0, seed=seed
        )
    return str(prepared), json.loads(Path(f"{raw}.meta.json").read_text())


KNEE_TOLERANCE = {"pmf": 0.1, "sparse_lr": 0.2}


def cell_spec(model: str, data_dir: str, policy: str, args, target: float, hyper: dict):
    """The job spec of one arm of a cell (also what ``--plan`` plans)."""
    from sync import clock_fields, fresh_out

    return load_spec(
        overrides={
            **clock_fields(args),
            "name": f"bench-autotune-{model}-{policy}",
            "model": model,
            "data": data_dir,
            "workers": args.workers,
            "seed": args.seed,
            "sync.mode": "isp",
            "scaling.policy": policy,
            **({"sync.significance": args.significance} if args.significance is not None else {}),
            "scaling.interval_s": args.interval,
            "scaling.horizon_s": args.horizon,
            "scaling.min_workers": args.min_workers,
            **({"scaling.tolerance": args.tolerance} if args.tolerance is not None else {}),
            **(
                {"scaling.throughput_tolerance": args.throughput_tolerance}
                if args.throughput_tolerance is not None
                else {}
            ),
            **({"scaling.scale_lr": args.scale_lr == "on"} if args.scale_lr else {}),
            "scaling.knee_tolerance": args.knee_tolerance or KNEE_TOLERANCE[model],
            "stop.target_val": target,
            "stop.eval_every": args.eval_every,
            "stop.max_seconds": args.max_seconds,
            "stop.max_epochs": args.max_epochs,
            "out": fresh_out(
                DATA / "runs" / f"autotune-{model}-{policy}-{args.clock}-{args.workers}"
                f"{'-' + Path(args.json).stem if args.json else ''}"
            ),
            **{f"hyper.{k}": v for k, v in hyper.items()},
        }
    )


def run(model: str, data_dir: str, policy: str, args, target: float, hyper: dict) -> dict:
    spec = cell_spec(model, data_dir, policy, args, target, hyper)
    print(
        f"-- {model}, {args.workers} workers, tuner {'on' if policy == 'autotune' else 'off'} ({args.clock} clock)",
        flush=True,
    )
    report, _ = run_local(spec)  # the report prices the run (spec.aws)
    hit = report["time_to_target_val"]
    metric = "rmse" if model == "pmf" else "logloss"
    cost = report["cost"]["total_usd"]
    time_to_target = hit["seconds_excluding_eval"] if hit else None
    return {
        "model": model,
        "tuner": policy == "autotune",
        "status": report["status"],
        "clock": spec.clock.kind,
        "significance": spec.sync.significance,
        "sum_cap": spec.sync.sum_cap,
        "host_s": report.get("host_seconds"),
        "load_avg_1m": __import__("os").getloadavg()[0],
        "time_to_target_s": time_to_target,
        "cost_usd": cost,
        "perf_per_dollar": 1 / (time_to_target * cost) if time_to_target else None,
        "final_test": report["test_metrics"][metric],
        "metric": metric,
        "workers_final": report["workers"]["final"],
        "evictions": len(report["scale_events"]),
        "worker_seconds": report["totals"]["worker_seconds"],
        "scale_events": report["scale_events"],
        "timeline": [(h["time"], h["workers"], h["loss"]) for h in report["history"]],
        "autotune": report.get("autotune"),
        "tests": [(h["time"], h["test"]) for h in report["history"] if "test" in h],
    }


PER_STEP = ("timeline", "tests")  # kept for the plotted (median) run only


def summary(result: dict) -> dict:
    """A repetition without its per-step series: the JSON stays readable."""
    return {k: v for k, v in result.items() if k not in PER_STEP}


def median_run(results: list[dict]) -> dict:
    """The run with the median time to target (its timeline is plotted), plus medians and spread."""
    import statistics

    reached = [r for r in results if r["time_to_target_s"]]
    pool = sorted(reached, key=lambda r: r["time_to_target_s"]) or results
    chosen = dict(pool[len(pool) // 2])
    chosen["reached"] = f"{len(reached)}/{len(results)}"
    if reached:
        times = [r["time_to_target_s"] for r in reached]
        costs = [r["cost_usd"] for r in reached]
        chosen["time_to_target_s"] = statistics.median(times)
        chosen["cost_usd"] = statistics.median(costs)
        chosen["perf_per_dollar"] = statistics.median(r["perf_per_dollar"] for r in reached)
        chosen["time_range_s"] = (min(times), max(times))
        chosen["final_test"] = statistics.median(r["final_test"] for r in reached)
        chosen["evictions"] = statistics.median(r["evictions"] for r in reached)
    return chosen


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        ax2 = ax.twinx()
        for r in (r for r in rows if r["model"] == model):
            t, w, loss = zip(*r["timeline"])
            style = "-" if r["tuner"] else "--"
            label = "tuner on" if r["tuner"] else "tuner off"
            ax.plot(t, loss, style, color="tab:blue", lw=1, label=f"loss, {label}")
            ax2.step(t, w, style, where="post", color="tab:orange", lw=1.5, label=f"workers, {label}")
        ax.set_title(f"{model}: training loss and active workers (ISP)")
        ax.set_xlabel(f"{rows[0].get('clock', 'host')} seconds")
        ax.set_ylabel(rows[0]["metric"] if model == "pmf" else "log-loss", color="tab:blue")
        ax2.set_ylabel("active workers", color="tab:orange")
        ax2.set_ylim(0, max(max(w for _, w, _ in r["timeline"]) for r in rows) + 1)
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="pmf,sparse_lr")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--min-workers", type=int, default=2)
    ap.add_argument("--significance", type=float, default=None, help="ISP's v (default: the model's, in ebb.catalogue)")
    # MLLess decides every 20 s on jobs of 5-10 minutes; these jobs last 30-60 s.
    ap.add_argument("--interval", type=float, default=2.0, help="T, seconds (MLLess: 20 on jobs of minutes)")
    ap.add_argument("--horizon", type=float, default=1.0, help="Δ ≤ T, seconds")
    ap.add_argument("--tolerance", type=float, default=None, help="S (default: the job spec's)")
    ap.add_argument(
        "--throughput-tolerance",
        type=float,
        default=None,
        help="the tuner's throughput guard (default: the job spec's; 1 turns it off)",
    )
    ap.add_argument("--lr", type=float, default=None, help="sparse LR's learning rate (default: the spec's)")
    ap.add_argument(
        "--scale-lr",
        choices=["on", "off"],
        default=None,
        help="scaling.scale_lr: scale the learning rate by p/P as the fleet shrinks (default: the spec's)",
    )
    ap.add_argument(
        "--knee-tolerance",
        type=float,
        default=None,
        help="knee: the slope has fallen to this share of the steepest (default: 0.1, the job spec's, "
        "for PMF, whose early plateau a looser one takes for the knee; 0.2 for sparse LR, whose "
        "steep first steps make 0.1 find it late)",
    )
    # Targets near where the runs level off: the tuner acts after the knee, so a target
    # reached before it measures nothing but noise.
    ap.add_argument(
        "--pmf-target",
        type=float,
        default=None,
        help="target test RMSE (noise floor 0.5; default 0.56 at ml10m shape, where 8 workers level "
        "off near 0.55, and 0.645 at the quick shape)",
    )
    ap.add_argument(
        "--pmf-shape",
        default="ml10m",
        choices=["quick", "ml10m"],
        help="PMF data: 1M ratings, or MovieLens-10M shape as bench/sync.py",
    )
    ap.add_argument(
        "--pmf-optimizer",
        choices=["sgd_momentum", "adam"],
        help="PMF's optimiser (default: the catalogue's; sgd_momentum takes its own lr, 0.02)",
    )
    ap.add_argument("--lr-rows", type=int, default=4_000_000, help="rows of the planted logistic data")
    ap.add_argument(
        "--lr-target",
        type=float,
        default=None,
        help="target test log-loss (default: 1.008 × Bayes, near where the 4M-row set levels off)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs per setting, interleaved; medians are reported")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--max-epochs", type=float, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--lr-data",
        default="planted",
        choices=["planted", "criteo"],
        help="sparse LR data: planted (20k features) or the Criteo-shaped generator (100k, skewed)",
    )
    ap.add_argument(
        "--clock",
        default="host",
        choices=["host", "fleet"],
        help="fleet: the engine's fleet clock (a vCPU and a --link-mb-s link per worker)",
    )
    ap.add_argument("--link-mb-s", type=float, default=75.0, help="fleet clock: one worker's link, MB/s")
    ap.add_argument("--node-mb-s", type=float, default=None, help="fleet clock: the cache node's (default: the spec's)")
    ap.add_argument(
        "--arms",
        default="none,autotune",
        help="scaling policies to run: none,autotune; one arm per invocation lets two invocations run "
        "the arms side by side under the same load (process CPU time grows with the load), "
        "then --combine their JSONs",
    )
    ap.add_argument("--combine", nargs="+", metavar="JSON", help="only merge the rows of these JSONs, judge, plot")
    ap.add_argument(
        "--plan",
        metavar="P,P,...",
        help="no arms: `ebb plan` the cell's job (its spec and target, profiled on the fleet clock) at these fleet "
        "sizes and write the predicted tuner gain beside the smaller start's (default JSON "
        "bench/results/plan/tuner-predicted-<model>-<data>.json)",
    )
    ap.add_argument(
        "--profile-steps",
        type=int,
        default=None,
        help="--plan: steps each profile runs (default: ebb plan's, 100 to a target)",
    )
    ap.add_argument(
        "--json",
        help="output JSON (default bench/results/autotuner/<clock>-<model>-<data>-P<workers>"
        "[-<arms>].json; the PNG beside it)",
    )
    args = ap.parse_args(argv)
    if args.combine:
        import json

        parts = [json.loads(Path(path).read_text()) for path in args.combine]
        return summarise(
            [row for part in parts for row in part["rows"]],
            args,
            [part["settings"] for part in parts],
            [part.get("command") for part in parts],
        )

    from sync import LR_TARGET as CRITEO_TARGET
    from sync import dataset as ratings_dataset

    rows = []
    for model in args.models.split(","):
        if model == "pmf":
            data_dir, meta = ratings_dataset(args.pmf_shape, args.seed)
            target = args.pmf_target or (0.56 if args.pmf_shape == "ml10m" else 0.645)
            hyper = {"rank": 20, **({"optimizer": args.pmf_optimizer} if args.pmf_optimizer else {})}
        else:
            data_dir, meta = logistic_dataset(args.lr_rows, args.seed, args.lr_data)
            target, hyper = (
                args.lr_target or (1.008 * meta["bayes_logloss"] if args.lr_data == "planted" else CRITEO_TARGET),
                ({"lr": args.lr} if args.lr else {}),
            )
        if args.plan:
            plan_cell(model, data_dir, args, target, hyper)
            continue
        runs: dict[str, list[dict]] = {policy: [] for policy in args.arms.split(",")}
        for _ in range(args.repeats):
            for policy in runs:  # interleaved, so machine noise hits both alike
                runs[policy].append(run(model, data_dir, policy, args, target, hyper))
        for results in runs.values():
            rows.append({**median_run(results), "target": target, "repeats": [summary(r) for r in results]})
    if rows:
        summarise(rows, args)


PLAN_FIELDS = (
    "workers",
    "steps",
    "seconds",
    "usd",
    "tuner_gain",
    "tuner_workers",
    "tuner_knee_step",
    "tuner_window_steps",
    "start_gain",
    "start_workers",
)


def plan_cell(model: str, data_dir: str, args, target: float, hyper: dict) -> None:
    """``ebb plan`` of the cell's job to its target: the tuner's predicted gain at each size."""
    import time

    from ebb.plan.planner import make_plan

    spec = cell_spec(model, data_dir, "autotune", args, target, hyper)
    started = time.monotonic()
    plan = make_plan(
        spec,
        workers=[int(v) for v in args.plan.split(",")],
        target=target,
        profile_steps=args.profile_steps,
        say=lambda line: print(line, flush=True),
    )
    rows = [{"model": model, **{k: r.get(k) for k in PLAN_FIELDS}} for r in plan.rows]
    print_table(rows, [(k, k) for k in ("model", *PLAN_FIELDS)])
    data = args.pmf_shape if model == "pmf" else args.lr_data
    write_json(
        Path(args.json) if args.json else result_path("plan", f"tuner-predicted-{model}-{data}"),
        {
            "rows": rows,
            "target": target,
            "plan": plan.to_dict(),
            "plan_host_seconds": round(time.monotonic() - started, 1),
            "settings": vars(args),
        },
    )


def summarise(
    rows: list[dict], args, arm_settings: list[dict] | None = None, arm_commands: list[str | None] | None = None
) -> None:
    """Table, verdict per model (tuner on against off, when both arms are there), plot and JSON; a JSON
    combined from arms run apart records each arm's command, then the combining one."""
    print()
    print_table(
        rows,
        [
            ("model", "model"),
            ("tuner", "tuner"),
            ("reached", "reached"),
            ("time_to_target_s", "s to target (median)"),
            ("time_range_s", "range"),
            ("cost_usd", "cost $"),
            ("perf_per_dollar", "Perf/$"),
            ("final_test", "test metric"),
            ("workers_final", "workers at end"),
            ("evictions", "evictions"),
        ],
    )
    verdict = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        off, on = (next((r for r in rows if r["model"] == model and r["tuner"] is t), None) for t in (False, True))
        if off and on and off["perf_per_dollar"] and on["perf_per_dollar"]:
            v = {
                "perf_per_dollar_gain": on["perf_per_dollar"] / off["perf_per_dollar"],
                "time_ratio": on["time_to_target_s"] / off["time_to_target_s"],
                "metric_rel_diff": abs(on["final_test"] - off["final_test"]) / off["final_test"],
            }
            verdict[model] = v
            print(
                f"{model}: Perf/$ {v['perf_per_dollar_gain']:.2f}× with the tuner (target ≥ 1.4), time to target "
                f"{v['time_ratio']:.2f}× (target ≤ 1.10), test metric differs by {100 * v['metric_rel_diff']:.2f}% "
                f"(target ≤ 1%)"
            )
    out = Path(args.json) if args.json else default_path(args, rows, arm_settings)
    png = out.with_suffix(".png")
    if all(r.get("timeline") for r in rows):
        plot(rows, png)
    write_json(
        out,
        {
            "rows": rows,
            "verdict": verdict,
            "png": str(png.name),
            "settings": vars(args),
            **({"arm_settings": arm_settings} if arm_settings else {}),
            **({"command": [*arm_commands, provenance()["command"]]} if arm_commands else {}),
        },
    )


def default_path(args, rows: list[dict], arm_settings: list[dict] | None = None) -> Path:
    """bench/results/autotuner/<clock>-<model>-<data>[-<model>-<data>]-P<workers>[-<arms>].json (the data as
    the arms ran it, when combining)."""
    ran = arm_settings[0] if arm_settings else vars(args)
    data = {"pmf": ran["pmf_shape"], "sparse_lr": ran["lr_data"]}
    models = "-".join(f"{m}-{data[m]}" for m in dict.fromkeys(r["model"] for r in rows))
    arms = "" if args.arms == "none,autotune" else "-" + args.arms.replace(",", "-")
    return result_path("autotuner", f"{args.clock}-{models}-P{args.workers}{arms}")


if __name__ == "__main__":
    main()
