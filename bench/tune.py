"""``ebb tune --quick`` against today's defaults and against random search with the same
trial budget, on the same splits (bench/quality.py's data: generated, seeded, cached).

For each dataset, side by side in one run:

* **defaults**: ``ebb train`` with the model's defaults (early stopping on validation);
* **tune --quick**: ``ebb tune --quick`` (ASHA over the built-in space, Optuna's samplers);
  the best trial's model on the test split;
* **random**: ``ebb tune --quick --scheduler none --sampler random``: as many trials, each
  trained to the last rung (early stopping still ends a trial that stops improving);
* **--arm LABEL=FLAGS** (repeatable): another ``ebb tune --quick`` with FLAGS on top, e.g.
  the fixed ladder ``"fixed 12/36=--ladder fixed --min-epochs 12 --max-epochs 36"``;
* **torch** (``--with-torch``): bench/quality.py's PyTorch reference, grid-tuned on the
  same validation split (its quick grid).

Every Ebb run is on the fleet clock (``--clock fleet``), so $ and time are a Lambda fleet's.
For a search, "fleet wall" is its time with every rung's jobs at once (as the AWS design
runs them, docs/AWS.md) and "serial" the sum of its jobs.

    python bench/tune.py                                   # every ratings preset and criteo-shaped, 1 worker
    python bench/tune.py --datasets ml-100k --workers 2 --with-torch
    python bench/tune.py --trials 27                       # every search (random's too) with 27 trials
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, result_path, write_json  # noqa: E402
from quality import DATA, QUICK_TORCH_GRIDS, dataset, tune_torch  # noqa: E402

RUNS = DATA / "tune-runs"
# Every ratings preset (the four bench/defaults.py chose the defaults on) and Criteo's shape.
DATASETS = ("ml-100k", "ml-latest-small", "ml-100k-wild", "ml-latest-small-wild", "criteo-shaped")


def _ebb(args: list[str], log: Path) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        return subprocess.run([sys.executable, "-m", "ebb.cli", *args], stdout=f, stderr=subprocess.STDOUT).returncode


def _common(data: dict, workers: int) -> list[str]:
    return [
        "--model", data["model"], "--data", str(data["prepared"]), "--workers", str(workers),
        "--clock", "fleet", "--set", "scaling.policy=none", "--seed", "0",
    ]  # fmt: skip


def run_defaults(data: dict, workers: int, out: Path) -> dict:
    started = time.perf_counter()
    code = _ebb(["train", *_common(data, workers), "--out", str(out)], out.with_suffix(".log"))
    report = json.loads((out / "report.json").read_text())
    assert code == 0, f"ebb train failed: see {out.with_suffix('.log')}"
    return {
        "test": report["test_metrics"][data["metric"]],
        "best_val": report.get("best_val"),
        "usd": report["cost"]["total_usd"],
        "usd_by_component": report["cost"]["by_component"],
        "fleet_wall_s": report["wall_seconds"],
        "serial_s": report["wall_seconds"],
        "epochs": report["epochs"],
        "trials": 1,
        "host_s": round(time.perf_counter() - started, 1),
    }


def run_tune(data: dict, workers: int, out: Path, extra: list[str], parallel: int) -> dict:
    started = time.perf_counter()
    args = ["tune", *_common(data, workers), "--quick", "--out", str(out), "--parallel", str(parallel), *extra]
    code = _ebb(args, out.with_suffix(".log"))
    assert code == 0, f"ebb tune failed: see {out.with_suffix('.log')}"
    result = json.loads((out / "tune.json").read_text())
    best = json.loads((out / "best" / "report.json").read_text())
    return {
        "test": best["test_metrics"][data["metric"]],
        "best_val": result["best"]["best_val"],
        "usd": result["total_usd"],
        "fleet_wall_s": result["fleet_wall_seconds"],
        "serial_s": result["job_seconds"],
        "epochs": round(sum(t["epochs"] for t in result["trials"]), 1),
        "trials": len(result["trials"]),
        "best_params": result["best"]["params"],
        "packs": len(result.get("packs", [])),
        "usd_by_component": result.get("cost_by_component"),
        "host_s": round(time.perf_counter() - started, 1),
    }


def _earlier(runs: dict, files: list[str], workers: int) -> None:
    """Each dataset's defaults and random search from earlier runs' JSON (waiting for a run
    still going to write it), in place of running them again."""
    while True:
        rows = [r for f in files if Path(f).exists() for r in json.loads(Path(f).read_text())["rows"]]
        found = {(r["dataset"], r["arm"]): r for r in rows if r["workers"] == workers}
        if all((name, arm) in found for name in runs for arm in ("defaults", "random")):
            break
        time.sleep(30)
    for name, (_, got) in runs.items():
        for arm in ("defaults", "random"):
            r = {k: v for k, v in found[(name, arm)].items() if k not in ("dataset", "workers", "arm", "metric")}
            got[arm] = {**r, "from": "earlier run"}  # (the defaults keep their place, first)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default=",".join(DATASETS), help=f"comma-separated (default: {','.join(DATASETS)})")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--parallel", type=int, default=2, help="ebb tune's CPU budget (default 2: this machine)")
    p.add_argument("--with-torch", action="store_true", help="also the grid-tuned PyTorch reference")
    p.add_argument("--no-packs", action="store_true", help="searches without trial packs (a fleet per job)")
    p.add_argument("--tune-args", default="", help="more ebb tune flags for the tune --quick arm ('--sampler qmc')")
    p.add_argument("--no-quick", action="store_true", help="only the --arm searches (with the defaults and random)")
    p.add_argument("--arm", action="append", default=[], metavar="LABEL=FLAGS", help="another tune --quick arm")
    p.add_argument("--trials", type=int, help="every search's trial budget (default --quick's, 9), random's too")
    p.add_argument(
        "--random-from",
        action="append",
        default=[],
        metavar="JSON",
        help="take random search's row (and the defaults') from an earlier run's JSON, not run it again",
    )
    p.add_argument("--label", default="quick")
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows, runs = [], {}
    for name in args.datasets.split(","):
        data = dataset(name)
        base = RUNS / f"{name}-w{args.workers}-{args.label}"  # (runs of different labels at once)
        shutil.rmtree(base, ignore_errors=True)
        print(f"[{name}] {data['model']}, {args.workers} worker(s)", flush=True)
        packs = ["--no-packs"] if args.no_packs else []
        packs += ["--trials", str(args.trials)] if args.trials else []
        random = ["--scheduler", "none", "--sampler", "random", *packs]
        got = {"defaults": None if args.random_from else run_defaults(data, args.workers, base / "defaults")}
        print(f"   defaults: {got['defaults']}", flush=True)
        if not args.no_quick:
            quick = [*packs, *args.tune_args.split()]
            got["tune --quick"] = run_tune(data, args.workers, base / "tune", quick, args.parallel)
            print(f"   tune --quick: {got['tune --quick']}", flush=True)
        for i, text in enumerate(args.arm):
            label, _, flags = text.partition("=")
            got[label] = run_tune(data, args.workers, base / f"arm{i}", [*packs, *flags.split()], args.parallel)
            print(f"   {label}: {got[label]}", flush=True)
        if not args.random_from:
            got["random"] = run_tune(data, args.workers, base / "random", random, args.parallel)
            print(f"   random: {got['random']}", flush=True)
        if args.with_torch:
            started = time.perf_counter()
            ref = tune_torch(data, QUICK_TORCH_GRIDS[data["model"]], epochs=20)
            got["torch (grid)"] = {
                "test": ref["test_at_best_val"],
                "best_val": ref["best_val"],
                "host_s": round(time.perf_counter() - started, 1),
            }
        runs[name] = (data, got)
    if args.random_from:
        _earlier(runs, args.random_from, args.workers)
    for name, (data, got) in runs.items():
        d_usd = got["defaults"]["usd"]
        for arm, r in got.items():
            rows.append(
                {
                    "dataset": name,
                    "workers": args.workers,
                    "arm": arm,
                    "metric": data["metric"],
                    **r,
                    "usd_vs_default": round(r["usd"] / d_usd, 2) if r.get("usd") else None,
                    # a search's $ against random search's (same trials, each to early stopping)
                    "usd_vs_random": round(r["usd"] / got["random"]["usd"], 2) if r.get("trials", 0) > 1 else None,
                }
            )
    print()
    print_table(
        rows,
        [
            ("dataset", "dataset"),
            ("arm", "arm"),
            ("metric", "metric"),
            ("test", "test"),
            ("best_val", "best val"),
            ("usd", "$"),
            ("usd_vs_default", "$ / default"),
            ("usd_vs_random", "$ / random"),
            ("fleet_wall_s", "fleet wall s"),
            ("serial_s", "serial s"),
            ("trials", "trials"),
            ("epochs", "epochs"),
            ("host_s", "host s"),
        ],
    )
    write_json(result_path("tune", args.label), {"rows": rows}, args.json)


if __name__ == "__main__":
    main()
