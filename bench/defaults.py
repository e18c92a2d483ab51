"""PMF defaults across presets: how far each preset's default lands from its own tuned optimum.

For every ratings preset (the documented shapes ml-100k and ml-latest-small, and their
"-wild" twins with real raters' irregularities; ``ebb synth ratings --preset``), split
80 / 10 / 10 % by ``bench/quality.py``'s ``dataset``:

* **torch**: ``bench/quality.py``'s reference (biased MF, rank 20, Adam, minibatch 1,000),
  grid-tuned over lr × weight decay on validation; its test RMSE at the best epoch.
* **grid** (1 worker): every point of a small PMF grid, one run each on the prepared
  folder itself: early stopping watches validation and the report's test RMSE is the
  model it kept. The best validation figure is the preset's **Ebb-tuned optimum**.
* **arms** (1 and P workers): the catalogue's defaults, ``--arm`` settings (e.g. the
  previous defaults) and the **robust choice**: the grid point whose worst validation
  regret over all presets (its validation RMSE over that preset's best, minus one) is
  the smallest. At P workers the tuned optimum is the best validation among the arms
  (a full grid at P workers costs P times as much; the table says which arm it was).

Every run is ``python -m ebb.cli train`` (real engine; worker processes and a private
redis-server from 2 workers on), ISP at the job's ``sync.significance``, no scaling.
The epoch cap is ``--epochs`` × P (at P workers an epoch is between 1/P and 1 of one
worker's progress); "cap" in the table means the cap, not early stopping, ended the run.

    python bench/defaults.py                                    # 4 presets, 1 and 4 workers
    python bench/defaults.py --presets ml-100k-wild --workers 1 --grid lr=0.02,0.04 l2=0.05,0.1
    python bench/defaults.py --arm previous:lr=0.04,l2=0.05,lr_decay=0.9,significance=0.7
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality  # noqa: E402
from _common import print_table, result_path, train_job_file, write_json  # noqa: E402

from ebb.catalogue import CATALOGUE  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RUNS = quality.DATA / "runs-defaults"
PRESETS = "ml-100k,ml-latest-small,ml-100k-wild,ml-latest-small-wild"
GRID = ["lr=0.02,0.04", "l2=0.05,0.1,0.2", "lr_decay=0.9"]
SYNC_KEYS = ("significance",)  # arm keys that go to sync.*, the rest to hyper.*


def _value(key: str, text: str):
    """A setting's value: an int (rank, cold_k), a word (optimizer, row_grad) or a float."""
    return int(text) if key in ("rank", "cold_k") else text if key in ("optimizer", "row_grad") else float(text)


def parse_settings(text: str) -> dict:
    out: dict = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        out[key] = _value(key, value)
    return out


def parse_grid(items: list[str]) -> list[dict]:
    axes = {}
    for item in items:
        key, _, values = item.partition("=")
        axes[key] = [_value(key, v) for v in values.split(",")]
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def label(settings: dict) -> str:
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in settings.items()) or "defaults"


def run(data: dict, workers: int, settings: dict, epochs: float, tag: str) -> dict:
    """One job on the prepared folder: early stopping on validation, test RMSE of the kept model."""
    out = RUNS / tag
    hyper = {k: v for k, v in settings.items() if k not in SYNC_KEYS}
    sync = {"mode": "isp", **{k: v for k, v in settings.items() if k in SYNC_KEYS}}
    job = {
        "name": re.sub(r"[^A-Za-z0-9_.-]", "_", tag.replace("/", "-"))[-64:],
        "model": "pmf",
        "data": str(data["prepared"]),
        "out": str(out),
        "seed": 0,
        "workers": workers,
        "hyper": hyper,
        "sync": sync,
        "scaling": {"policy": "none"},
        "stop": {"max_epochs": epochs, "max_seconds": 3600},
    }
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    report, wall = train_job_file(out / "job.yaml")
    # auto_hyper: the data-dependent defaults the job trained with (PMF's l2 when unset).
    row = {
        "settings": settings,
        "auto": report.get("auto_hyper", {}),
        "status": report["status"],
        "wall_s": round(wall, 1),
    }
    if report["status"] != "failed" and "best_val" in report:
        row.update(
            val=report["best_val"],
            test=report["test_metrics"]["rmse"],
            epoch=report["best_epoch"],
            ended="cap" if report["status"] == "max_epochs" else f"stop@{report['epochs']:.0f}",
            usd=report.get("cost", {}).get("total_usd") if isinstance(report.get("cost"), dict) else None,
        )
    else:
        row["error"] = report.get("error")
    print(
        f"   {tag}: val {row.get('val', float('nan')):.4f} test {row.get('test', float('nan')):.4f} "
        f"epoch {row.get('epoch', float('nan')):.1f} ({row.get('ended', row['status'])}, {wall:.0f} s)",
        flush=True,
    )
    return row


def robust_choice(grid_rows: dict[str, list[dict]]) -> tuple[dict, dict[str, float]]:
    """The grid point with the smallest worst validation regret over the presets."""
    best = {name: min(r["val"] for r in rows if "val" in r) for name, rows in grid_rows.items()}
    worst: dict[str, float] = {}
    settings_of: dict[str, dict] = {}
    for name, rows in grid_rows.items():
        for r in rows:
            key = label(r["settings"])
            settings_of[key] = r["settings"]
            regret = r["val"] / best[name] - 1 if "val" in r else float("inf")
            worst[key] = max(worst.get(key, 0.0), regret)
    key = min(worst, key=worst.__getitem__)
    return settings_of[key], worst


def main(argv=None) -> None:
    global RUNS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=PRESETS, help="comma-separated datasets of bench/quality.py")
    ap.add_argument("--workers", default="1,4", help="fleet sizes of the arms (the grid runs at 1 worker)")
    ap.add_argument("--epochs", type=float, default=30, help="epoch cap at 1 worker (× P at P workers)")
    ap.add_argument("--torch-epochs", type=int, default=25)
    ap.add_argument("--torch-grid", default="lr=0.01 wd=0.03,0.1,0.3", help="the torch reference's grid")
    ap.add_argument("--grid", nargs="*", default=GRID, help="PMF grid at 1 worker, KEY=V1,V2 ... (hyper.* keys)")
    ap.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME:K=V,...",
        help="settings to score beside the defaults at every fleet size (sync.significance as significance=)",
    )
    ap.add_argument("--torch-from", type=Path, help="take the torch reference from this results file (same presets)")
    ap.add_argument("--no-default", action="store_true", help="do not run the catalogue's defaults as an arm")
    ap.add_argument("--no-choice", action="store_true", help="do not add the robust choice as an arm")
    ap.add_argument("--runs", type=Path, help=f"the jobs' folders (default {RUNS})")
    ap.add_argument("--json", help="output JSON (default bench/results/defaults/<presets>.json)")
    args = ap.parse_args(argv)
    if args.runs:
        RUNS = args.runs
    names = args.presets.split(",")
    fleet = [int(w) for w in args.workers.split(",")]
    torch_grid = {
        k: [float(v) for v in vs.split(",")] for k, _, vs in (i.partition("=") for i in args.torch_grid.split())
    }
    arms: dict[str, dict] = {"default": {}}
    for text in args.arm:
        name, _, settings = text.partition(":")
        arms[name] = parse_settings(settings)
    grid = parse_grid(args.grid) if args.grid else []
    if grid:  # the defaults spelled out on the grid's keys, so a grid point equal to them is not run twice
        # (a data-dependent default, e.g. l2, stays unset: each preset gets its own value)
        arms["default"] = {k: CATALOGUE["pmf"].hyper[k] for k in grid[0] if k in CATALOGUE["pmf"].hyper}
        grid += [] if arms["default"] in grid else [arms["default"]]  # the defaults compete too

    datasets, torch_ref, grid_rows = {}, {}, {}
    for name in names:
        data = quality.dataset(name)
        datasets[name] = data
        print(f"== {name}: {data['manifest'].train.rows:,} train rows, floor {data['floor']:.4f}", flush=True)
        if args.torch_from:  # the same split, seed and grid: the reference does not depend on Ebb's settings
            torch_ref[name] = json.loads(args.torch_from.read_text())["torch"][name]
        else:
            torch_ref[name] = quality.tune_torch(data, torch_grid, args.torch_epochs)
        grid_rows[name] = [run(data, 1, s, args.epochs, f"{name}/grid/{label(s)}") for s in grid]
    if args.no_default:
        arms.pop("default")
    choice, worst = robust_choice(grid_rows) if grid else ({}, {})
    if grid:
        print(f"robust choice: {label(choice)} (worst validation regret {100 * worst[label(choice)]:.2f} %)")
        if not args.no_choice:
            arms["choice"] = choice

    rows, details = [], []
    for name in names:
        data, ref = datasets[name], torch_ref[name]["test_at_best_val"]
        for workers in fleet:
            cap = args.epochs * workers
            results = {}
            for arm, settings in arms.items():
                same = next((r for r in grid_rows[name] if r["settings"] == settings), None)
                if workers == 1 and same is not None:
                    results[arm] = same  # already run in the grid
                else:
                    results[arm] = run(data, workers, settings, cap, f"{name}/w{workers}/{arm}")
            pool = grid_rows[name] if workers == 1 and grid_rows[name] else list(results.values())
            tuned = min((r for r in pool if "val" in r), key=lambda r: r["val"])
            details.append({"dataset": name, "workers": workers, "arms": results, "tuned": tuned})
            for arm, r in results.items():
                rows.append(
                    {
                        "dataset": name,
                        "workers": workers,
                        "arm": arm,
                        "settings": label(r["settings"]) + (f" (auto {label(r['auto'])})" if r.get("auto") else ""),
                        "floor": data["floor"],
                        "test": r.get("test"),
                        "epoch": r.get("epoch"),
                        "ended": r.get("ended", r["status"]),
                        "torch": ref,
                        "vs_torch_pct": 100 * (r["test"] / ref - 1) if "test" in r else None,
                        "tuned": label(tuned["settings"]),
                        "tuned_test": tuned["test"],
                        "vs_tuned_pct": 100 * (r["test"] / tuned["test"] - 1) if "test" in r else None,
                        "val_regret_pct": 100 * (r["val"] / tuned["val"] - 1) if "val" in r else None,
                    }
                )
    print()
    print_table(rows, TABLE)
    stem = "all" if args.presets == PRESETS else args.presets.replace(",", "+")
    write_json(
        result_path("defaults", f"{stem}-P{'-'.join(map(str, fleet))}"),
        {
            "catalogue_defaults": dict(CATALOGUE["pmf"].hyper),
            "catalogue_auto": dict(CATALOGUE["pmf"].auto),
            "catalogue_significance": CATALOGUE["pmf"].significance,
            "arms": arms,
            "grid": grid,
            "robust_choice": choice,
            "worst_val_regret": worst,
            "epochs": args.epochs,
            "rows": rows,
            "details": details,
            "grid_runs": grid_rows,
            "torch": {n: {k: v for k, v in t.items() if k != "trials"} for n, t in torch_ref.items()},
            "datasets": {n: {k: v for k, v in d["meta"].items() if k != "target"} for n, d in datasets.items()},
        },
        args.json,
    )


TABLE = [
    ("dataset", "preset"),
    ("workers", "P"),
    ("arm", "arm"),
    ("settings", "settings"),
    ("test", "test RMSE"),
    ("epoch", "epoch"),
    ("ended", "ended"),
    ("torch", "torch"),
    ("vs_torch_pct", "vs torch %"),
    ("tuned_test", "Ebb tuned"),
    ("vs_tuned_pct", "vs tuned %"),
    ("tuned", "tuned settings"),
]


if __name__ == "__main__":
    main()
