"""BSP vs SSP vs ISP on PMF at MovieLens-10M shape (MLLess Table 1), locally.

Generates planted ratings (≈70k users × 10k items, 10M ratings, rank 10, σ 0.5; cached
under bench/data/), prepares them into 6,250-rating minibatches, then trains rank-20
PMF with 4 and 8 workers under each sync model until the test RMSE (scored by worker 0
every --eval-every steps; scoring time excluded) reaches the target. Reports time to
target, bytes exchanged, steps, final test RMSE and the per-step synchronisation
overhead (announce + barrier, excluding payload).

    python bench/sync.py                 # full shape (≈15–25 min on 2 cores)
    python bench/sync.py --quick         # 1M ratings (≈3–5 min)
    python bench/sync.py --with-ddp      # also the DistributedDataParallel baseline
    python bench/sync.py --optimizers sgd_momentum,adam   # also each sync model with PMF's lazy Adam

On the fleet clock (``--clock fleet``, docs/ARCHITECTURE.md "Fleet clock") every Ebb run's
time is the engine's modelled fleet time (a vCPU and a ``--link-mb-s`` link per worker),
its cost the engine's cost meter on that time, and DDP is put on the same footing
(``ddp_fleet``): measured CPU per step plus its all-reduce bytes per rank over the same
link, priced as the same Lambda workers. ``--model sparse_lr`` trains sparse LR on the
Criteo-shaped generator instead of PMF:

    python bench/sync.py --clock fleet --quick --workers 8 --with-ddp        # validate
    python bench/sync.py --clock fleet --model sparse_lr --workers 8,16,32 --with-ddp
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, result_path, write_json  # noqa: E402

from ebb.catalogue import CATALOGUE  # noqa: E402
from ebb.data.prepare import prepare_dataset  # noqa: E402
from ebb.data.synth import synth_ratings  # noqa: E402
from ebb.engine.fleet_clock import Links, WorkerStep, barrier_step_seconds  # noqa: E402
from ebb.local.runner import run_local  # noqa: E402
from ebb.spec import load_spec  # noqa: E402
from ebb.stores.local import FolderObjectStore  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
SHAPES = {
    "ml10m": {"users": 70_000, "items": 10_000, "ratings": 10_000_000},
    "quick": {"users": 20_000, "items": 5_000, "ratings": 1_000_000},
}


def dataset(shape: str, seed: int = 0) -> tuple[str, dict]:
    """Generate and prepare (once) the ratings of a shape; returns (prepared dir, meta)."""
    import json

    dims = SHAPES[shape]
    root = DATA / f"ratings-{shape}-s{seed}"
    prepared = root / "prepared"
    raw = root / "ratings.csv"
    if not (prepared / "manifest.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        synth_ratings(raw, rank=10, noise=0.5, seed=seed, **dims)
        print(f"generated {dims['ratings']:,} ratings in {time.perf_counter() - t0:.0f} s", flush=True)
        t0 = time.perf_counter()
        prepare_dataset(
            "movielens",
            raw,
            FolderObjectStore(prepared),
            batch_size=6250,
            test_fraction=0.1,
            val_fraction=0.0,
            seed=seed,
        )
        print(f"prepared in {time.perf_counter() - t0:.0f} s", flush=True)
    return str(prepared), json.loads(Path(f"{raw}.meta.json").read_text())


CONFIGS = {
    "bsp": {"sync.mode": "bsp"},
    "ssp(s=3)": {"sync.mode": "ssp", "sync.slack": 3},
}


def fresh_out(path: Path) -> str:
    """A run folder of this bench's own, emptied: the runner refuses to overwrite a finished run."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    return str(path)


METRIC = {"pmf": "rmse", "sparse_lr": "logloss"}


def clock_fields(args) -> dict:
    """A job spec's clock overrides for ``--clock`` (fleet: ``--link-mb-s``, and ``--node-mb-s`` if given)."""
    if args.clock != "fleet":
        return {}
    return {
        "clock.kind": "fleet",
        "clock.link_mb_s": args.link_mb_s,
        **({"clock.node_mb_s": args.node_mb_s} if args.node_mb_s else {}),
    }


def finished_report(spec) -> dict | None:
    """The report of a finished run of exactly this job spec in its folder, if there is one (``--reuse``)."""
    import json

    path = Path(spec.out) / "report.json"
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    if report.get("spec") != spec.model_dump(mode="json"):
        return None
    print("   (reused: a finished run of this exact job spec)", flush=True)
    return report


def job_settings(pairs: list[str] | None) -> dict:
    """``["sync.sum_cap=4", ...]`` as spec overrides, each value read as YAML (4 is an int)."""
    import yaml

    out = {}
    for pair in pairs or []:
        field, sep, value = pair.partition("=")
        if not sep or not field:
            raise SystemExit(f"--set {pair!r}: expected FIELD=VALUE, e.g. sync.sum_cap=4")
        out[field.strip()] = yaml.safe_load(value)
    return out


def settings_tag(args) -> str:
    """What --set changed, for the run's folder: two invocations that differ only there
    may run side by side without sharing one."""
    pairs = getattr(args, "set", None)
    return "".join(f"-{p}" for p in sorted(pairs)) if pairs else ""


def run_config(data_dir, workers, name, fields, args) -> dict:
    model = getattr(args, "model", "pmf")
    overrides = {
        "name": f"bench-sync-{model}-{name}-{workers}".replace("(", "")
        .replace(")", "")
        .replace("=", "")
        .replace("/", "-"),
        "model": model,
        "data": data_dir,
        "workers": workers,
        "seed": args.seed,
        **({"hyper.rank": 20} if model == "pmf" else {}),
        **clock_fields(args),
        "scaling.policy": "none",
        "stop.target_val": args.target,
        "stop.eval_every": args.eval_every,
        "stop.max_seconds": args.max_seconds,
        "stop.max_epochs": args.max_epochs,
        **({"hyper.lr": args.lr} if args.lr else {}),
        **job_settings(getattr(args, "set", None)),
        "out": str(
            DATA / "runs" / f"sync-{Path(data_dir).parent.name}-{name}-{workers}{settings_tag(args)}".replace("/", "-")
        ),
        **fields,
    }
    spec = load_spec(overrides=overrides)
    print(f"-- {model} {name} × {workers} workers ({spec.clock.kind} clock)", flush=True)
    try:
        report = finished_report(spec) if getattr(args, "reuse", False) else None
        if report is None:
            fresh_out(Path(spec.out))
            report, _ = run_local(spec)  # the report prices the run (spec.aws)
    except Exception as exc:  # a configuration that fails is a result too (e.g. a v that diverges)
        print(f"   failed: {exc}", flush=True)
        return {"config": name, "workers": workers, "status": "failed", "error": str(exc)}
    hit = report["time_to_target_val"]
    totals = report["totals"]
    test_metric = report["test_metrics"][METRIC[model]]
    return {
        "config": name,
        "model": model,
        "optimizer": fields.get("hyper.optimizer"),
        "workers": workers,
        "status": report["status"],
        "auto_hyper": report.get("auto_hyper", {}),  # the data-dependent defaults it trained with
        "reached": hit is not None,
        "clock": report.get("clock", {}).get("kind", "host"),
        "time_to_target_s": hit["seconds_excluding_eval"] if hit else None,
        "steps_to_target": hit["step"] + 1 if hit else None,
        "steps": report["steps"],
        "epochs": report["epochs"],
        "mb_exchanged": (totals["bytes_sent"] + totals["bytes_received"]) / 1e6,
        "mb_sent": totals["bytes_sent"] / 1e6,
        "sent_fraction": totals["sent_fraction"],
        "final_test": test_metric,
        "final_test_rmse": report["test_metrics"].get("rmse"),
        "final_train_loss": report["final_loss"],
        "cost_usd": (report.get("cost") or {}).get("total_usd"),
        "host_s": report.get("host_seconds"),
        "load_avg_1m": os.getloadavg()[0],  # process CPU time grows with the host's load (docs/RESULTS.md)
        "curve": [(h["time"], h["test"]) for h in report["history"] if "test" in h],
        # Under SSP a worker is usually computing when its go arrives: no barrier to time.
        "sync_ms_median": None if fields["sync.mode"] == "ssp" else (report["sync_overhead_ms"] or {}).get("median"),
        "sync_ms_p90": None if fields["sync.mode"] == "ssp" else (report["sync_overhead_ms"] or {}).get("p90"),
        "wall_s": report["wall_seconds"],
        "eval_s": report["eval_seconds"],
        "cpu_ms_per_worker_step": 1000 * totals["cpu_seconds"] / (report["steps"] * workers),
        "cpu_ms_critical_per_step": 1000 * totals["cpu_critical_seconds"] / report["steps"],
        "barrier_ms_first": (report["sync_overhead_ms"] or {}).get("first_worker_median"),
    }


def barrier_dataset(seed: int = 0) -> tuple[str, int]:
    """Tiny ratings in 20-rating minibatches, for steps with no compute to speak of:
    (prepared folder, number of train minibatches)."""
    root = DATA / "barrier"
    if not (root / "prepared" / "manifest.json").exists():
        synth_ratings(
            root / "ratings.csv",
            users=200,
            items=100,
            ratings=10_000,
            rank=2,
            seed=seed,
            min_user_ratings=5,
            min_item_ratings=5,
        )
        prepare_dataset(
            "movielens",
            root / "ratings.csv",
            FolderObjectStore(root / "prepared"),
            batch_size=20,
            test_fraction=0.05,
            val_fraction=0.0,
            seed=seed,
        )
    return str(root / "prepared"), 475  # ≈ 9,500 train ratings / 20


def barrier_overhead(workers: int, steps: int = 400, seed: int = 0) -> dict:
    """Announce + barrier with no payload: ISP with a threshold nothing passes, so every
    worker announces an *empty* step; tiny minibatches keep compute out of the way."""
    import statistics

    data_dir, parts = barrier_dataset(seed)
    spec = load_spec(
        overrides={
            "name": f"bench-barrier-{workers}",
            "model": "pmf",
            "data": data_dir,
            "workers": workers,
            "hyper.rank": 2,
            "sync.mode": "isp",
            "sync.significance": 1e12,
            "scaling.policy": "none",
            "stop.max_epochs": steps * workers / parts,
            "out": fresh_out(DATA / "runs" / "barrier"),
        }
    )
    report, _ = run_local(spec)  # (report, merged model): the samples' quantiles are in the report
    sync = report["sync_overhead_ms"]
    return {
        "workers": workers,
        "steps": report["steps"],
        "empty_fraction": report["totals"]["empty_steps"]
        / max(1, report["totals"]["empty_steps"] + report["totals"]["updates_sent"]),
        "sync_ms_median": sync["median"],
        "sync_ms_p90": sync["p90"],
        "first_worker_ms_median": sync["first_worker_median"],
        "step_ms_median": 1000
        * statistics.median(b["time"] - a["time"] for a, b in zip(report["history"], report["history"][1:])),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1M ratings instead of 10M")
    ap.add_argument("--workers", default="4,8")
    ap.add_argument(
        "--sync",
        default="bsp,ssp,isp",
        help="which sync models to run (comma-separated; none: only DDP, with --with-ddp)",
    )
    ap.add_argument("--isp-v", default="0.7,1", help="ISP thresholds to run (MLLess's 0.7 and a tuned one)")
    ap.add_argument(
        "--model",
        default="pmf",
        choices=["pmf", "sparse_lr"],
        help="pmf (planted ratings) | sparse_lr (the Criteo-shaped generator, --lr-rows rows)",
    )
    ap.add_argument("--lr-rows", type=int, default=1_000_000, help="sparse_lr: rows of the Criteo-shaped set")
    ap.add_argument(
        "--clock",
        default="host",
        choices=["host", "fleet"],
        help="fleet: Ebb runs on the engine's fleet clock and DDP is put on the same links (ddp_fleet)",
    )
    ap.add_argument(
        "--target",
        type=float,
        default=None,
        help="target test RMSE (default: 0.58 at ML-10M shape, 0.66 with --quick; noise floor 0.5) or "
        f"sparse_lr test log-loss (default {LR_TARGET})",
    )
    ap.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="score the test split every N steps, Ebb and DDP alike (default 20; 5 with --quick)",
    )
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--max-epochs", type=float, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--with-ddp", action="store_true", help="also run bench/ddp_baseline.py's DDP (gloo) variants")
    ap.add_argument("--ddp-variants", default="dense,sparse", help="which DDP variants --with-ddp runs")
    ap.add_argument(
        "--ddp-lr",
        default="",
        help="learning rates of DDP variants, e.g. dense=50 (default: bench/ddp_baseline.py's tuned ones)",
    )
    ap.add_argument(
        "--optimizers",
        default="sgd_momentum",
        help="PMF optimisers (comma-separated: sgd_momentum, adam); runs other than sgd_momentum are "
        "named adam/<sync> and take the optimiser's default lr",
    )
    ap.add_argument("--lr", type=float, default=None, help="hyper.lr of every Ebb run (default: the optimiser's)")
    ap.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="a job-spec field for every Ebb run, e.g. --set sync.sum_cap=4 (repeatable; YAML values)",
    )
    ap.add_argument(
        "--json",
        help="output JSON (default bench/results/sync/<clock>-<shape>-P<workers>[-<syncs>].json; "
        "--plot: a PNG beside it)",
    )
    ap.add_argument(
        "--link-mb-s",
        type=float,
        default=75.0,
        help="for the modelled times: network throughput of one worker, MB/s (default 75, about "
        "what one Lambda function moves to ElastiCache; an assumption, not a measurement)",
    )
    ap.add_argument(
        "--node-mb-s",
        type=float,
        default=None,
        help="the Redis node's link, MB/s per direction (default: 1250, 10 Gbit/s, for the host clock's "
        "modelled times; the job spec's clock.node_mb_s on the fleet clock)",
    )
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="take the report of a finished run of the same job spec instead of running it again",
    )
    ap.add_argument("--plot", action="store_true", help="also a PNG of the test metric against time per sync model")
    args = ap.parse_args(argv)

    if args.model == "sparse_lr":
        from autotuner import logistic_dataset

        shape = f"criteo-{args.lr_rows // 1000}k"
        data_dir, meta = logistic_dataset(args.lr_rows, args.seed, "criteo")
        args.target = args.target or LR_TARGET
        args.eval_every = args.eval_every or 5
        args.isp_v = args.isp_v if args.isp_v != ap.get_default("isp_v") else str(LR_ISP_V)
    else:
        shape = "quick" if args.quick else "ml10m"
        data_dir, meta = dataset(shape, args.seed)
    if args.target is None:
        args.target = 0.66 if args.quick else 0.58
    if args.eval_every is None:
        args.eval_every = 5 if args.quick else 20
    chosen = set(args.sync.split(","))
    configs = {name: fields for name, fields in CONFIGS.items() if fields["sync.mode"] in chosen}
    if "isp" in chosen:
        for v in (float(x) for x in args.isp_v.split(",")):
            configs[f"isp(v={v:g})"] = {"sync.mode": "isp", "sync.significance": v}
    base = dict(configs)
    configs = {}
    for optimizer in args.optimizers.split(","):
        for name, fields in base.items():
            configs[name if optimizer == "sgd_momentum" else f"{optimizer}/{name}"] = {
                **fields,
                **({"hyper.optimizer": optimizer} if args.model == "pmf" else {}),
            }
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        for name, fields in configs.items():
            rows.append(run_config(data_dir, workers, name, fields, args))
            partial(rows, args, shape)
        if args.with_ddp:
            from ddp_baseline import run_ddp

            for variant in args.ddp_variants.split(","):
                print(f"-- ddp-{variant} × {workers} workers", flush=True)
                lrs = {k: float(v) for k, v in (kv.split("=") for kv in args.ddp_lr.split(",") if kv)}
                r = run_ddp(
                    data_dir,
                    workers,
                    args.target,
                    model=args.model,
                    variant=variant,
                    rank=20,
                    lr=lrs.get(variant),
                    max_seconds=args.max_seconds,
                    max_epochs=args.max_epochs,
                    seed=args.seed,
                    eval_every=args.eval_every,
                )
                row = {
                    "config": f"ddp-{variant}",
                    "workers": workers,
                    **r,
                    "final_test": r["final_test_metric"],
                    "final_test_rmse": r["final_test_metric"] if args.model == "pmf" else None,
                }
                rows.append({**row, **(ddp_fleet(row, args) if args.clock == "fleet" else {})})
                partial(rows, args, shape)
    if args.clock == "fleet":
        return fleet_summary(rows, args, shape, meta)
    args.node_mb_s = args.node_mb_s or 1250.0

    barrier = [barrier_overhead(w) for w in (int(w) for w in args.workers.split(","))]
    print()
    print("announce + barrier without payload (empty ISP steps):")
    print_table(
        barrier,
        [
            ("workers", "P"),
            ("steps", "steps"),
            ("sync_ms_median", "sync ms (median)"),
            ("sync_ms_p90", "sync ms (p90)"),
            ("first_worker_ms_median", "first worker ms (median)"),
            ("step_ms_median", "step ms (median)"),
        ],
    )
    for r in rows:
        r["projected_s"] = project(r, args.link_mb_s, args.node_mb_s)
    print()
    print_table(
        rows,
        [
            ("config", "sync"),
            ("workers", "P"),
            ("status", "status"),
            ("time_to_target_s", "s to target"),
            ("steps_to_target", "steps"),
            ("mb_exchanged", "MB exchanged"),
            ("sent_fraction", "sent frac"),
            ("final_test_rmse", "test RMSE"),
            ("sync_ms_median", "sync ms (med)"),
            ("cpu_ms_per_worker_step", "CPU ms/step"),
            ("cpu_ms_critical_per_step", "busiest ms/step"),
            ("projected_s", "modelled s"),
        ],
    )
    verdict = verdicts(rows, max(int(w) for w in args.workers.split(",")), args.link_mb_s, args.node_mb_s)
    largest = max(barrier, key=lambda b: b["workers"])
    verdict["barrier_ms_median"] = largest["sync_ms_median"]
    verdict["barrier_first_worker_ms_median"] = largest["first_worker_ms_median"]
    verdict["lines"].append(
        f"announce + barrier without payload at {largest['workers']} workers: median "
        f"{largest['sync_ms_median']:.2f} ms over all workers, {largest['first_worker_ms_median']:.2f} ms "
        f"for the first worker of each step (target ≤ 2 ms)"
    )
    for line in verdict["lines"]:
        print(line)
    write_json(
        default_path(args, shape),
        {
            "shape": shape,
            "data_meta": meta,
            "target_rmse": args.target,
            "rows": rows,
            "barrier": barrier,
            "verdict": verdict,
        },
        args.json,
    )


# Sparse LR on the Criteo-shaped set (1M rows): a test log-loss 8 workers reach in ≈ 5 epochs on the fleet
# clock; ISP at the engine's default threshold for it, tuned on this set (docs/RESULTS.md, "Sync models").
LR_TARGET = 0.52
LR_ISP_V = CATALOGUE["sparse_lr"].significance


def fleet_spec(args):
    """The job spec every fleet-clock run of this bench starts from (its clock and aws sections)."""
    return load_spec(overrides={"data": "unused", "model": args.model, **clock_fields(args)})


def ddp_fleet(row: dict, args) -> dict:
    """DDP on the fleet clock's footing: the time and cost of its run with a vCPU and a link per rank.

    A step takes its busiest rank's measured CPU (per step the largest process time of any
    rank, averaged) plus the bytes one rank sends in the all-reduce over its link (a ring is
    full duplex: one direction counted; dense: 2(P−1)/P × the model's float32 gradient;
    sparse: the measured gradient rows all-gathered), and the fleet starts after one cold
    start, as Ebb's does. Priced by the engine's cost model as P workers of the job spec's
    Lambda size for that time, with no cache node, supervisor or Step Functions (DDP's
    ranks talk to each other; in its favour)."""
    from ebb.cost.model import Usage, estimate_cost, load_prices

    spec = fleet_spec(args)
    steps = row.get("steps_to_target") if row.get("reached") else row.get("steps")
    per_step = row["cpu_ms_critical_per_step"] / 1e3 + row["bytes_per_step_per_rank"] / (spec.clock.link_mb_s * 1e6)
    seconds = spec.clock.cold_start_s + steps * per_step
    usage = Usage(
        worker_seconds=row["workers"] * seconds,
        memory_mb=spec.aws.memory_mb,
        arch=spec.aws.arch,
        invocations=row["workers"],
        wall_seconds=seconds,
        supervisor_seconds=0.0,
    )
    cost = estimate_cost(usage, load_prices())["total_usd"]
    return {
        "host_time_to_target_s": row["time_to_target_s"],
        "clock": "fleet (ddp_fleet)",
        "time_to_target_s": seconds if row.get("reached") else None,
        "fleet_s": seconds,
        "cost_usd": cost,
        "mb_exchanged": row["mb_exchanged"],
        "curve": [(spec.clock.cold_start_s + c["step"] * per_step, c["test_metric"]) for c in row["curve"]],
    }


def default_path(args, shape: str) -> Path:
    """bench/results/sync/<clock>-<shape>-P<workers>[-<syncs>].json: the syncs named when not the default set."""
    workers = "-".join(sorted(args.workers.split(","), key=int))
    syncs = "" if args.sync == "bsp,ssp,isp" else "-" + args.sync.replace(",", "-")
    return result_path("sync", f"{args.clock}-{shape}-P{workers}{syncs}")


def partial(rows: list[dict], args, shape: str) -> None:
    """The rows so far, in the invocation's JSON, so that a long invocation cut short keeps its runs."""
    if args.clock == "fleet":
        write_json(
            default_path(args, shape),
            {"partial": True, "shape": shape, "model": args.model, "target": args.target, "rows": rows},
            args.json,
        )


def fleet_summary(rows: list[dict], args, shape: str, meta: dict) -> None:
    """Table, verdicts per worker count, plot and JSON of a fleet-clock invocation."""
    print()
    print_table(
        rows,
        [
            ("config", "sync"),
            ("workers", "P"),
            ("status", "status"),
            ("time_to_target_s", "fleet s to target"),
            ("steps_to_target", "steps"),
            ("cost_usd", "cost $"),
            ("mb_exchanged", "MB exchanged"),
            ("final_test", "test metric"),
            ("cpu_ms_critical_per_step", "busiest ms/step"),
            ("host_s", "host s"),
        ],
    )
    verdicts_by_p = {}
    for workers in sorted({r["workers"] for r in rows}):
        verdicts_by_p[workers] = fleet_verdicts(rows, workers)
        for line in verdicts_by_p[workers]["lines"]:
            print(line)
    if args.plot:
        plot_curves(
            rows, Path(args.json or default_path(args, shape)).with_suffix(".png"), METRIC[args.model], args.target
        )
    write_json(
        default_path(args, shape),
        {
            "shape": shape,
            "model": args.model,
            "data_meta": meta,
            "target": args.target,
            "clock": fleet_spec(args).clock.model_dump(),
            "settings": vars(args),
            "rows": rows,
            "verdicts": verdicts_by_p,
        },
        args.json,
    )


def fleet_verdicts(rows: list[dict], workers: int) -> dict:
    """The fleet-clock targets at ``workers``: ISP ≥ 2× sooner than BSP; Ebb (its fastest run) ≥ 3×
    sooner and ≥ 3× cheaper than the better DDP variant; that run's final metric within 1% of BSP's."""
    at = {r["config"]: r for r in rows if r["workers"] == workers}
    reached = {k: r for k, r in at.items() if r.get("time_to_target_s")}
    out: dict = {"workers": workers, "reached": sorted(reached), "missed": sorted(set(at) - set(reached)), "lines": []}
    if out["missed"]:
        out["lines"].append(f"at {workers} workers, did not reach the target: {', '.join(out['missed'])}")
    bsp = reached.get("bsp")
    isps = {k: r for k, r in reached.items() if k.startswith("isp")}
    ebb = {k: r for k, r in reached.items() if not k.startswith("ddp")}
    ddp = {k: r for k, r in reached.items() if k.startswith("ddp")}
    if isps and bsp:
        name, isp = min(isps.items(), key=lambda kv: kv[1]["time_to_target_s"])
        out["isp_vs_bsp"] = {
            "isp": name,
            "speedup": bsp["time_to_target_s"] / isp["time_to_target_s"],
            "bytes_ratio": bsp["mb_exchanged"] / isp["mb_exchanged"],
        }
        out["lines"].append(
            f"at {workers} workers, {name} vs BSP: {out['isp_vs_bsp']['speedup']:.2f}× sooner "
            f"(target ≥ 2), {out['isp_vs_bsp']['bytes_ratio']:.1f}× fewer bytes"
        )
    if ebb and ddp:
        name, best = min(ebb.items(), key=lambda kv: kv[1]["time_to_target_s"])
        dname, rival = min(ddp.items(), key=lambda kv: kv[1]["time_to_target_s"])
        out["ebb_vs_ddp"] = {
            "ebb": name,
            "ddp": dname,
            "speedup": rival["time_to_target_s"] / best["time_to_target_s"],
            "cheaper": rival["cost_usd"] / best["cost_usd"],
            "cheaper_than_cheapest": min(r["cost_usd"] for r in ddp.values()) / best["cost_usd"],
        }
        out["lines"].append(
            f"at {workers} workers, Ebb {name} vs the faster DDP ({dname}): "
            f"{out['ebb_vs_ddp']['speedup']:.2f}× sooner (target ≥ 3), "
            f"{out['ebb_vs_ddp']['cheaper']:.2f}× cheaper (target ≥ 3)"
        )
        if bsp:
            out["metric_rel_diff"] = abs(best["final_test"] - bsp["final_test"]) / bsp["final_test"]
            out["lines"].append(
                f"at {workers} workers, {name}'s final test metric differs from BSP's by "
                f"{100 * out['metric_rel_diff']:.2f}% (target ≤ 1%)"
            )
    return out


def plot_curves(rows: list[dict], path: Path, metric: str, target: float | None = None) -> None:
    """Test metric against (fleet) time, one panel per worker count, one line per sync model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["workers"] for r in rows})
    fig, axes = plt.subplots(1, len(counts), figsize=(5.5 * len(counts), 4), squeeze=False)
    for ax, workers in zip(axes[0], counts):
        for r in (r for r in rows if r["workers"] == workers and r.get("curve")):
            t, m = zip(*r["curve"])
            ax.plot(t, m, "--" if r["config"].startswith("ddp") else "-", lw=1.2, label=r["config"])
        if target:
            ax.axhline(target, color="grey", lw=0.8, ls=":")
        ax.set_title(f"{workers} workers")
        ax.set_xlabel(f"{rows[0].get('clock', 'host')} seconds")
        ax.set_ylabel(f"test {metric}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def project(row: dict, worker_mb_s: float, server_mb_s: float) -> float | None:
    """Time to target with a core per worker and a real network (a model built on measurements).

    Here 8 workers share 2 cores and every byte moves over loopback for free, so the
    measured time is CPU queueing. On Lambda each worker has its own vCPU and its own
    link. An Ebb step is modelled by the engine's fleet clock (``ebb.engine.fleet_clock``,
    one place for the arithmetic), fed this run's averages: the CPU its busiest worker
    spends on it (per step the largest process time of any worker, averaged over steps),
    one round trip costing the barrier measured in the same run (the first worker's go,
    which no CPU queue delays), and each worker's bytes over its link, at least the Redis
    node's busier direction over the node's link. DDP's ring all-reduce (not part of the
    engine) sends and receives at once: its per-rank bytes in one direction / the link;
    its CPU already holds the all-reduce's copies, and its busiest rank sets each step.
    """
    steps, cpu_ms = row.get("steps_to_target"), row.get("cpu_ms_critical_per_step")
    if not steps or cpu_ms is None or "ssp(" in row["config"]:
        return None  # SSP overlaps waiting with computing: its averages do not make its step time
    if row["config"].startswith("ddp"):
        return steps * (cpu_ms / 1e3 + row["bytes_per_step_per_rank"] / 1e6 / worker_mb_s)
    per_worker_step = row["steps"] * row["workers"]
    sent = 1e6 * row["mb_sent"] / per_worker_step
    read = 1e6 * (row["mb_exchanged"] - row["mb_sent"]) / per_worker_step
    links = Links(
        link_mb_s=worker_mb_s,
        rtt_ms=row.get("barrier_ms_first") or 0.0,
        node_mb_s=server_mb_s,
        cold_start_s=0.0,
        barrier_ms=0.0,
    )
    fleet = [WorkerStep(cpu_s=cpu_ms / 1e3, sent_bytes=sent, read_bytes=read, requests=1)] * row["workers"]
    return steps * barrier_step_seconds(fleet, links)


def verdicts(rows, workers, worker_mb_s: float | None = None, server_mb_s: float | None = None) -> dict:
    at = {r["config"]: r for r in rows if r["workers"] == workers}
    bsp = at.get("bsp")
    out: dict = {"workers": workers, "lines": []}
    isps = {k: r for k, r in at.items() if k.startswith("isp") and r.get("time_to_target_s")}
    if not bsp or not bsp.get("time_to_target_s") or not isps:
        out["lines"].append("(BSP or ISP did not reach the target: no ratios)")
        return out
    best_name, best = min(isps.items(), key=lambda kv: kv[1]["time_to_target_s"])
    out.update(
        {
            "best_isp": best_name,
            "bytes_ratio_bsp_over_isp": bsp["mb_exchanged"] / best["mb_exchanged"],
            "speedup_isp_vs_bsp": bsp["time_to_target_s"] / best["time_to_target_s"],
            "rmse_rel_diff": abs(best["final_test_rmse"] - bsp["final_test_rmse"]) / bsp["final_test_rmse"],
            "sync_ms_median_isp": best["sync_ms_median"],
        }
    )
    out["lines"] += [
        f"at {workers} workers, {best_name} vs BSP: {out['bytes_ratio_bsp_over_isp']:.1f}× fewer bytes (target ≥ 5), "
        f"{out['speedup_isp_vs_bsp']:.2f}× sooner to target (target ≥ 1.5), "
        f"test RMSE differs by {100 * out['rmse_rel_diff']:.2f}% (target ≤ 1%)",
        f"per-step sync overhead with payload at {workers} workers (includes waiting for a CPU: "
        f"{workers} workers share this machine's cores): median {best['sync_ms_median']:.2f} ms",
    ]
    ddp = [r for k, r in at.items() if k.startswith("ddp") and r.get("time_to_target_s")]
    if ddp:
        fastest = min(ddp, key=lambda r: r["time_to_target_s"])
        out["speedup_vs_ddp"] = fastest["time_to_target_s"] / best["time_to_target_s"]
        out["lines"].append(
            f"Ebb {best_name} vs the fastest DDP ({fastest['config']}): "
            f"{out['speedup_vs_ddp']:.2f}× sooner to target (target ≥ 3)"
        )
    sparse_adam = at.get("ddp-sparse", {}).get("steps_to_target")
    for name, r in at.items():
        if "/" in name and not name.startswith("ddp"):  # another optimiser: steps against the default's
            base = at.get(name.split("/", 1)[1], {})
            out.setdefault("optimizers", {})[name] = {
                "steps_to_target": r.get("steps_to_target"),
                "default_steps": base.get("steps_to_target"),
                "ddp_sparse_adam_steps": sparse_adam,
                "final_test_rmse": r.get("final_test_rmse"),
                "default_final_test_rmse": base.get("final_test_rmse"),
            }
            out["lines"].append(
                f"{name}: {r.get('steps_to_target')} steps to target against "
                f"{base.get('steps_to_target')} with the default optimiser"
                + (f" and {sparse_adam} for DDP + SparseAdam" if sparse_adam else "")
            )
    if worker_mb_s:
        proj = {k: r["projected_s"] for k, r in at.items() if r.get("projected_s") is not None}
        isp_name = min((k for k in proj if k.startswith("isp")), key=proj.get, default=None)
        if isp_name and "bsp" in proj:
            out["projected"] = {
                "worker_mb_s": worker_mb_s,
                "server_mb_s": server_mb_s,
                "seconds": proj,
                "speedup_isp_vs_bsp": proj["bsp"] / proj[isp_name],
                "best_isp": isp_name,
            }
            line = (
                f"modelled with a core per worker, a {worker_mb_s:g} MB/s link per worker and {server_mb_s:g} MB/s "
                f"at the Redis node (see project()): {isp_name} {proj['bsp'] / proj[isp_name]:.2f}× sooner than BSP"
            )
            ddp_proj = [v for k, v in proj.items() if k.startswith("ddp")]
            if ddp_proj:
                out["projected"]["speedup_vs_ddp"] = min(ddp_proj) / proj[isp_name]
                line += f", {min(ddp_proj) / proj[isp_name]:.2f}× sooner than the fastest DDP"
            out["lines"].append(line)
    return out


if __name__ == "__main__":
    main()
