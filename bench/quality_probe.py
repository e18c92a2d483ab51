"""Why were 4 workers worse than one? The probes behind sync.combine (docs/ARCHITECTURE.md,
"Validation and early stopping"): one job each on a dataset's validation view
(bench/quality.py's data and views), printing the validation curve and its best point.

Each probe names the one thing it changes from the 4-worker default of the time, when
every model combined a step's updates by the row mean and scored once an epoch:

    python bench/quality_probe.py                      # every probe (≈ 20 min on 2 idle cores)
    python bench/quality_probe.py c4-mean c4-bsp       # some of them
    python bench/quality_probe.py --list

Results append to bench/results/quality_probe/probes.jsonl (one JSON object a probe, with the
command, commit, machine and load it ran with).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality  # noqa: E402
from _common import RESULTS, provenance, train_job_file  # noqa: E402

from ebb.engine.cadence import one_worker_epoch  # noqa: E402
from ebb.spec import parse_spec  # noqa: E402

MEAN_PER_EPOCH = {"sync.combine": "mean", "eval": "epoch"}  # the old defaults
CRITEO, MLS = "criteo-shaped", "ml-latest-small"
PROBES = {
    # Sparse LR, Criteo shape, 8 epochs (the 4-worker curve turned at epoch 5).
    "c1": dict(data=CRITEO, workers=1, epochs=8),
    "c4-mean": dict(data=CRITEO, workers=4, epochs=8, **MEAN_PER_EPOCH),
    "c4-bsp": dict(data=CRITEO, workers=4, epochs=8, mode="bsp", **MEAN_PER_EPOCH),
    "c4-noquant": dict(data=CRITEO, workers=4, epochs=8, quantize=False, **MEAN_PER_EPOCH),
    "c4-lr0.02": dict(data=CRITEO, workers=4, epochs=8, lr=0.02, **MEAN_PER_EPOCH),
    "c4-lr0.04": dict(data=CRITEO, workers=4, epochs=8, lr=0.04, **MEAN_PER_EPOCH),
    "c1-batch4000": dict(data=CRITEO, workers=1, epochs=8, batch=4000),  # one worker, the 4-worker global batch
    "c4-sum": dict(data=CRITEO, workers=4, epochs=8),  # today's default
    # PMF, ml-latest-small shape.
    "m4-mean-25": dict(data=MLS, workers=4, epochs=25, **MEAN_PER_EPOCH),
    "m4-bsp-25": dict(data=MLS, workers=4, epochs=25, mode="bsp", **MEAN_PER_EPOCH),
    "m4-sum-25": dict(data=MLS, workers=4, epochs=25, **{"sync.combine": "sum", "eval": "epoch"}),
    "m4-lr0.04-25": dict(data=MLS, workers=4, epochs=25, lr=0.04, **MEAN_PER_EPOCH),
    "m4-lr0.08-25": dict(data=MLS, workers=4, epochs=25, lr=0.08, **MEAN_PER_EPOCH),
    "m1-batch4000-25": dict(data=MLS, workers=1, epochs=25, batch=4000),
    "m4-mean-80": dict(data=MLS, workers=4, epochs=80, **MEAN_PER_EPOCH),
    "m4-160": dict(data=MLS, workers=4, epochs=160),  # today's default: scored every 4 epochs
    "m4-bsp-160": dict(data=MLS, workers=4, epochs=160, mode="bsp"),  # what is left: the ISP threshold?
    "m4-v0.2-160": dict(data=MLS, workers=4, epochs=160, significance=0.2),
    "m4-v0.4-160": dict(data=MLS, workers=4, epochs=160, significance=0.4),
}


def run(name: str, probe: dict, runs: Path) -> dict:
    data = quality.dataset(probe["data"], probe.get("batch"))
    parts = len(data["manifest"].train.parts)
    out = runs / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    job = {
        "name": f"probe-{name}",
        "model": data["model"],
        "data": str(data["val_view"]),
        "out": str(out),
        "seed": 0,
        "workers": probe["workers"],
        "hyper": {"lr": probe["lr"]} if "lr" in probe else {},
        "sync": {
            "mode": probe.get("mode", "isp"),
            "quantize": probe.get("quantize", True),
            "significance": probe.get("significance", 0.7),
        },
        "scaling": {"policy": "none"},
        "stop": {"max_epochs": probe["epochs"], "max_seconds": 7200},
    }
    if "sync.combine" in probe:
        job["sync"]["combine"] = probe["sync.combine"]
    per_epoch = max(1, round(parts / probe["workers"]))
    job["stop"]["eval_every"] = (
        per_epoch if probe.get("eval") == "epoch" else one_worker_epoch(parse_spec(job, "probe"), parts)
    )
    (out / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    report, wall = train_job_file(out / "job.yaml")
    curve = [(h["epoch"], round(h["test"], 4)) for h in report["history"] if "test" in h]
    best = min(curve, key=lambda c: c[1]) if curve else None
    stop = quality.early_stopped([{"epoch": e, "value": v, "step": 0} for e, v in curve])
    return {
        "probe": name,
        **probe,
        "status": report["status"],
        "best_val": best,
        "early_stopping_keeps": [stop[0]["epoch"], stop[0]["value"]] if stop[0] else None,
        "early_stopping_stops_at": stop[1],
        "curve": curve,
        "wall_s": round(wall),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probes", nargs="*", help="names (default: all)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--runs", type=Path, default=quality.DATA / "probes")
    ap.add_argument("--out", type=Path, default=RESULTS / "quality_probe" / "probes.jsonl")
    args = ap.parse_args(argv)
    if args.list:
        for name, probe in PROBES.items():
            print(name, probe)
        return
    for name in args.probes or list(PROBES):
        result = run(name, PROBES[name], args.runs)
        print(json.dumps({k: v for k, v in result.items() if k != "curve"}), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(json.dumps({**provenance(), **result}) + "\n")


if __name__ == "__main__":
    main()
