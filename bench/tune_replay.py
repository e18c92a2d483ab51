"""Replay ``ebb tune``'s scheduler over trials trained to their end, to choose a ladder.

A promoted trial resumes bit-identically, so a trial's validation at any epoch is its
uninterrupted run's: with every trial of a search trained once to its early stopping
(``--collect``: ``ebb tune --quick --scheduler none --max-epochs 80``, QMC and random
samplers, every preset), any ladder's decisions are replayed exactly by the real
``Search`` (QMC draws trial k the same whatever the schedule). $ is estimated from the
collected runs: the pack's fixed cost, ~6 S3 PUTs a trial and 3 a further job, and each
trial's own $ per epoch.

    python bench/tune_replay.py --collect                      # bench/results/tune/i25c-curves.json
    python bench/tune_replay.py --set base_share=0.4 --set ladder=base --set max_epochs=100 --set min_epochs=1
    python bench/tune_replay.py --collect --trials 27 --curves bench/results/tune/i25h-curves27.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import result_path, write_json  # noqa: E402

CURVES = Path(__file__).resolve().parent / "results" / "tune" / "i25c-curves.json"
PER_TRIAL_USD, PER_JOB_USD = 30e-6, 15e-6


def collect(
    names: list[str], label: str, reuse: str | None = None, trials: int | None = None, samplers=("qmc", "random")
) -> None:
    """Train every preset's searches without halving (``trials``: that many, else --quick's);
    ``reuse``: read the runs already in RUNS/<reuse>-<name> instead (made with the same arguments)."""
    from quality import dataset
    from tune import RUNS, _common, _ebb, run_defaults

    out = {}
    for name in names:
        data, base = dataset(name), RUNS / f"{reuse or 'replay'}-{name}"
        if not reuse:
            shutil.rmtree(base, ignore_errors=True)
            run_defaults(data, 1, base / "defaults")
        report = json.loads((base / "defaults" / "report.json").read_text())
        got = {
            "defaults": {"usd": report["cost"]["total_usd"], "epochs": report["epochs"],
                         "test": report["test_metrics"][data["metric"]], "best_val": report.get("best_val")},
            "metric": data["metric"],
            "model": data["model"],
        }  # fmt: skip
        for sampler in samplers:
            folder = base / sampler
            if not reuse:
                args = ["tune", *_common(data, 1), "--quick", "--out", str(folder), "--parallel", "2"]
                args += ["--scheduler", "none", "--sampler", sampler, "--max-epochs", "80"]
                args += ["--trials", str(trials)] if trials else []
                assert _ebb(args, folder.with_suffix(".log")) == 0, f"see {folder}.log"
            r = json.loads((folder / "tune.json").read_text())
            shares = r["packs"][0]["shares"]
            got[sampler] = {
                "pack_usd": r["packs"][0]["usd"],
                "total_usd": r["total_usd"],
                "trials": [
                    {
                        **{k: t[k] for k in ("trial", "params", "best_val", "epochs", "status", "curve")},
                        "test": (t["test_metrics"] or {}).get(data["metric"]),
                        "job_usd": t["cost_usd"] - shares.get(str(t["trial"]), 0.0),
                    }
                    for t in sorted(r["trials"], key=lambda t: t["trial"])
                ],
            }
        out[name] = got
    write_json(result_path("tune", label), out, None)


def replay(run: dict, model: str, overrides: dict, below: int | None = None) -> dict:
    """The search ``--quick`` (with ``overrides``) would run over ``run``'s trials (the first
    ``overrides["trials"]`` of them if set); ``below``: that many rungs below the top in place
    of ``TuneSpec.base_rung_count``'s."""
    from ebb.tune.scheduler import Outcome, Search
    from ebb.tune.space import QUICK, TuneSpec

    trials = {t["trial"]: t for t in run["trials"]}
    spec = TuneSpec.model_validate({**QUICK[model], "trials": len(trials), **overrides})
    if below is not None:
        object.__setattr__(spec, "base_rung_count", lambda: below)
    search, jobs = Search(spec, start=trials[0]["params"]), 0
    while (job := search.next_job()) is not None:
        full = trials[job.trial]
        assert search.trials[job.trial].params == full["params"], "the replay draws the collected settings"
        if full["epochs"] <= job.to_epochs + 1e-9:
            epochs, status = full["epochs"], "early_stopped" if full["status"] != "max_epochs" else "max_epochs"
        else:
            epochs, status = float(job.to_epochs), "paused" if job.rung < search.top else "max_epochs"
        curve = [p for p in full["curve"] if p[0] <= epochs + 1e-9]
        best = min(v for _, v in curve)
        search.job_done(job, Outcome(epochs, best, 0.0, epochs, status, curve))
        jobs += 1
    spent = {t.id: t.epochs for t in search.trials}
    best = search.best()
    assert best is not None
    return {
        "rungs": search.rungs,
        "epochs": round(sum(spent.values()), 1),
        "jobs": jobs,
        "usd": usd(run, spent, jobs),
        "pick": best.id,
        "val": best.best,
        "test": trials[best.id]["test"] if best.epochs >= trials[best.id]["epochs"] - 1e-9 else None,
    }


def usd(run: dict, spent: dict[int, float], jobs: int) -> float:
    per_epoch = {t["trial"]: (t["job_usd"] - PER_TRIAL_USD) / t["epochs"] for t in run["trials"]}
    extra_jobs = max(0, jobs - len(spent))
    trained = sum(per_epoch[i] * e for i, e in spent.items())
    return run["pack_usd"] + PER_TRIAL_USD * len(spent) + PER_JOB_USD * extra_jobs + trained


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collect", action="store_true", help="train every trial to its end first (minutes per preset)")
    p.add_argument("--datasets", default="ml-100k,ml-latest-small,ml-100k-wild,ml-latest-small-wild,criteo-shaped")
    p.add_argument("--curves", default=str(CURVES))
    p.add_argument("--reuse", help="with --collect: read RUNS/<REUSE>-<dataset> (runs made with the same arguments)")
    p.add_argument("--trials", type=int, help="with --collect: trials a search (default --quick's)")
    p.add_argument("--samplers", default="qmc,random", help="with --collect: the searches to train (qmc: ASHA's)")
    p.add_argument("--draws", default="qmc", help="the collected search ASHA replays over: qmc (--quick's) | random")
    p.add_argument("--rungs-below", type=int, help="rungs below the top (default: from the trials)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a tune field over --quick's")
    args = p.parse_args(argv)
    if args.collect:
        collect(args.datasets.split(","), Path(args.curves).stem, args.reuse, args.trials, args.samplers.split(","))
        return
    data = json.loads(Path(args.curves).read_text())
    overrides = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    print(f"--quick with {overrides or 'nothing changed'}")
    for name in args.datasets.split(","):
        d = data[name]
        r = replay(d[args.draws], d["model"], {"sampler": args.draws, **overrides}, args.rungs_below)
        # random search with as many trials (collected without it: the same draws, each to its end)
        full = d["random"] if "random" in d else d["qmc"]
        pool = full["trials"][: overrides.get("trials")]
        every = {t["trial"]: t["epochs"] for t in pool}
        random_usd = usd(full, every, len(every))
        rnd = min(pool, key=lambda t: (t["best_val"], t["trial"]))
        other = "random" if "random" in d else "every trial to its end"
        print(
            f"{name:22s} rungs {str(r['rungs']):10s} {r['epochs']:6.1f} epochs {r['jobs']:2d} jobs "
            f"${r['usd']:.5f} = {r['usd'] / d['defaults']['usd']:.2f}x one run, {r['usd'] / random_usd:.2f}x random; "
            f"pick t{r['pick']} val {r['val']:.4f} test {r['test'] or float('nan'):.4f} "
            f"({other}: val {rnd['best_val']:.4f} test {rnd['test']:.4f})"
        )


if __name__ == "__main__":
    main()
