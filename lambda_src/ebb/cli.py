"""``ebb``: generate data, prepare it into minibatches, and train on it.

    ebb synth ratings --out data/ratings.csv            # planted low-rank ratings
    ebb prepare --format movielens --input data/ratings.csv --out data/ml
    ebb train --model pmf --data data/ml --workers 4    # local: processes + redis
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

EPILOG_TRAIN = """\
examples:
  ebb train job.yaml                          everything from the job file
  ebb train job.yaml --workers 8 --sync isp   the job file, two fields overridden
  ebb train --model pmf --data data/ml --target-loss 0.82 --max-epochs 20

Flags override the job file; with no job file the flags alone define the job, and
every unset hyper-parameter takes its model's default. The job writes OUT/report.json
(status, wall_seconds, steps, epochs, final_loss, test_metrics, history, totals, cost),
OUT/model.npz and OUT/loss.png, and exits 1 when the job fails.
"""


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a model (locally: worker processes + a private redis-server)",
                       description="Train a model on a prepared dataset.", epilog=EPILOG_TRAIN,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", nargs="?", help="job file (YAML); see README 'Job file'")
    p.add_argument("--name", help="job name (default: random); outputs go to runs/<name>")
    p.add_argument("--model", choices=["pmf", "sparse_lr", "lr"], help="pmf: ratings; sparse_lr: hashed/LibSVM; lr: dense CSV")
    p.add_argument("--data", metavar="DIR", help="prepared dataset folder (from `ebb prepare`)")
    p.add_argument("--rank", type=int, help="PMF latent dimension (default 20)")
    p.add_argument("--lr", type=float, help="learning rate (default per model)")
    p.add_argument("--workers", type=int, help="number of workers at the start (default 1)")
    p.add_argument("--sync", choices=["bsp", "ssp", "isp"], help="synchronisation model (default isp)")
    p.add_argument("--significance", type=float, metavar="V", help="ISP threshold v; v_t = v/sqrt(t) (default 0.7)")
    p.add_argument("--slack", type=int, metavar="S", help="SSP staleness bound (default 3)")
    p.add_argument("--quantize", action=argparse.BooleanOptionalAction, default=None,
                   help="ISP: send significant values as int8 with a per-row scale, the rounding kept pending "
                        "(default on; --no-quantize sends float32)")
    p.add_argument("--redis", action="append", metavar="URL", help="use this Redis (repeat to shard) instead of a private one")
    p.add_argument("--policy", choices=["autotune", "none", "schedule"], help="scaling policy (default autotune)")
    p.add_argument("--min-workers", type=int, help="never scale in below this many workers")
    p.add_argument("--budget-usd", type=float, help="stop before the estimated AWS cost exceeds this")
    p.add_argument("--memory-mb", type=int, help="Lambda memory per worker, for the cost model (default 1769)")
    p.add_argument("--target-loss", type=float, help="stop once the training loss stays at or below this")
    p.add_argument("--target-test", type=float, help="stop once the test RMSE / log-loss is at or below this")
    p.add_argument("--eval-every", type=int, metavar="N", help="score the test split every N steps (default 50 with --target-test)")
    p.add_argument("--max-seconds", type=float, help="stop after this wall time (default 3600)")
    p.add_argument("--max-epochs", type=float, help="stop after this many passes over the data (default 10)")
    p.add_argument("--seed", type=int, help="seed for the initial model and the minibatch order")
    p.add_argument("--out", metavar="DIR", help="output folder (default runs/<name>)")
    p.set_defaults(func=cmd_train)


TRAIN_OVERRIDES = {
    "name": "name", "model": "model", "data": "data", "rank": "hyper.rank", "lr": "hyper.lr",
    "workers": "workers", "sync": "sync.mode", "significance": "sync.significance", "slack": "sync.slack",
    "quantize": "sync.quantize",
    "redis": "redis_urls", "policy": "scaling.policy", "min_workers": "scaling.min_workers",
    "budget_usd": "stop.budget_usd", "memory_mb": "aws.memory_mb", "target_loss": "stop.target_loss", "target_test": "stop.target_test", "eval_every": "stop.eval_every",
    "max_seconds": "stop.max_seconds", "max_epochs": "stop.max_epochs", "seed": "seed", "out": "out",
}


def cmd_train(args) -> int:
    import torch

    from ebb.engine.outputs import write_outputs
    from ebb.local.progress import ProgressSink
    from ebb.local.runner import run_local
    from ebb.spec import SpecError, load_spec

    try:
        spec = load_spec(args.job, {field: getattr(args, flag) for flag, field in TRAIN_OVERRIDES.items()})
    except SpecError as exc:
        print(f"ebb train: {exc}", file=sys.stderr)
        return 2
    if not Path(spec.data, "manifest.json").is_file():
        print(f"ebb train: data: {spec.data} has no manifest.json; prepare it first with `ebb prepare`", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    from ebb.models import LOSS_NAMES

    sink = ProgressSink(spec.stop.max_epochs, LOSS_NAMES[spec.model])
    started = time.monotonic()
    replica = None
    try:
        report, supervisor = run_local(spec, sink, cost_meter=_cost_meter(spec))
        replica = supervisor.replica
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (runner.Terminated)
        sink.close({})
        report = {"status": "failed", "error": str(exc) or "interrupted (Ctrl-C)"}
    except Exception as exc:  # the job failed: still leave a report behind
        sink.close({})
        report = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    report.setdefault("wall_seconds", round(time.monotonic() - started, 3))
    report["spec"] = spec.model_dump(mode="json")
    files = write_outputs(spec.out_dir, report, replica)
    _print_summary(report, files)
    return 0 if report["status"] != "failed" else 1


def _cost_meter(spec):
    try:
        from ebb.cost.meter import meter_for
    except ImportError:
        return None
    return meter_for(spec)


def _print_summary(report: dict, files: dict) -> None:
    if report["status"] == "failed":
        print(f"job failed: {report.get('error')}", file=sys.stderr)
    else:
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in report.get("test_metrics", {}).items())
        line = (f"{report['status']}: {report['steps']} steps, {report['epochs']:.2f} epochs in "
                f"{report['wall_seconds']:.1f} s; final training {report['loss_name']} {report['final_loss']:.4f}; "
                f"test {metrics}")
        if "cost" in report:
            line += f"; est. AWS cost ${report['cost']['total_usd']:.4f}"
        print(line)
    print(f"report: {files['report']}")


def _add_synth(sub) -> None:
    p = sub.add_parser("synth", help="generate a seeded dataset with planted structure",
                       description="Generate data with known structure, in the real formats `ebb prepare` reads. "
                                   "A sidecar OUT.meta.json records the truth (noise floor, Bayes log-loss).")
    kinds = p.add_subparsers(dest="kind", required=True, metavar="ratings|logistic")
    r = kinds.add_parser("ratings", help="planted low-rank ratings with popularity skew (MovieLens format)")
    r.add_argument("--out", required=True, help="output file: .csv (ratings.csv), .dat (::), else u.data (tab)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--users", type=int, default=2000)
    r.add_argument("--items", type=int, default=1500)
    r.add_argument("--ratings", type=int, default=200_000)
    r.add_argument("--rank", type=int, default=10, help="planted rank")
    r.add_argument("--noise", type=float, default=0.5, help="Gaussian noise σ: the RMSE floor")
    r.set_defaults(func=cmd_synth)
    lg = kinds.add_parser("logistic", help="sparse logistic data with known true weights")
    lg.add_argument("--out", required=True, help="output file: .svm/.libsvm/.txt (LibSVM) or .csv (dense)")
    lg.add_argument("--seed", type=int, default=0)
    lg.add_argument("--rows", type=int, default=200_000)
    lg.add_argument("--features", type=int, default=1000)
    lg.add_argument("--nnz", type=int, default=20, help="non-zero features per row (LibSVM)")
    lg.set_defaults(func=cmd_synth)


def cmd_synth(args) -> int:
    from ebb.data import synth

    if args.kind == "ratings":
        meta = synth.synth_ratings(args.out, users=args.users, items=args.items, ratings=args.ratings, rank=args.rank,
                                   noise=args.noise, seed=args.seed)
    else:
        meta = synth.synth_logistic(args.out, rows=args.rows, features=args.features, nnz=args.nnz, seed=args.seed)
    print(json.dumps({k: v for k, v in meta.items() if not isinstance(v, (list, dict))}, indent=None))
    return 0


def _add_prepare(sub) -> None:
    p = sub.add_parser("prepare", help="parse, shuffle, split and cut a dataset into minibatches",
                       description="Parse a dataset (streamed; any size), shuffle it with a seed, split train/test "
                                   "and write fixed-size minibatches plus manifest.json into OUT.")
    p.add_argument("--format", required=True, choices=["movielens", "criteo", "libsvm", "csv"])
    p.add_argument("--input", required=True, metavar="FILE")
    p.add_argument("--test-input", metavar="FILE", help="a separate test file (else --test-fraction of the input)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--batch-size", type=int, default=6250, help="rows per minibatch (MLLess: 6,250)")
    p.add_argument("--test-fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-bad-rows", action="store_true", help="count and skip malformed rows instead of stopping")
    p.add_argument("--num-features", type=int, default=100_000, help="hashing-trick dimension (criteo)")
    p.add_argument("--numeric-scaling", choices=["log", "minmax"], default="log", help="criteo integer columns")
    p.set_defaults(func=cmd_prepare)


def cmd_prepare(args) -> int:
    from ebb.data.prepare import prepare_dataset
    from ebb.data.readers import DataError
    from ebb.stores.local import FolderObjectStore

    if not 0 <= args.test_fraction < 1:
        print(f"ebb prepare: --test-fraction must be in [0, 1), got {args.test_fraction}", file=sys.stderr)
        return 2
    if args.batch_size < 1:
        print(f"ebb prepare: --batch-size must be positive, got {args.batch_size}", file=sys.stderr)
        return 2
    for path in (args.input, args.test_input):
        if path and not Path(path).is_file():
            print(f"ebb prepare: no such file: {path}", file=sys.stderr)
            return 2

    def progress(rows: int, note: str) -> None:
        print(f"\r{note}: {rows:,} rows", end="", file=sys.stderr, flush=True)

    try:
        manifest = prepare_dataset(args.format, args.input, FolderObjectStore(args.out), test_input=args.test_input,
                                   batch_size=args.batch_size, test_fraction=args.test_fraction, seed=args.seed,
                                   skip_bad_rows=args.skip_bad_rows, num_features=args.num_features,
                                   numeric_scaling=args.numeric_scaling, progress=progress)
    except DataError as exc:
        print(f"\nebb prepare: {exc}", file=sys.stderr)
        return 2
    print(file=sys.stderr)
    dims = (f"{manifest.num_users} users x {manifest.num_items} items" if manifest.kind == "ratings"
            else f"{manifest.num_features} features")
    print(f"prepared {manifest.train.rows:,} train rows in {len(manifest.train.parts)} parts, "
          f"{manifest.test.rows:,} test rows; {dims}; skipped {manifest.source.get('skipped_rows', 0)} bad rows -> {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ebb", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{synth,prepare,train}")
    _add_synth(sub)
    _add_prepare(sub)
    _add_train(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
