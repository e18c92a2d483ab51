"""``ebb predict``: the command's flags and what it prints (the work is in ``ebb.predict.run``,
and on a deployed stack in ``ebb.predict.cli.stack``)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from ebb.flags import Flag, add_flags, given, option_of
from ebb.predict.spec import PredictSpec

PREDICT_FLAGS = (
    Flag("model", metavar="RUN"),
    Flag("input", metavar="FILE"),
    Flag("out", metavar="PATH"),
    Flag("recommend", metavar="K"),
    Flag("users", metavar="FILE|all"),
    Flag("include_seen"),
    Flag("with_labels"),
    Flag("skip_bad_rows"),
    Flag("workers", metavar="N"),
    Flag("stack", metavar="NAME"),
    Flag("shards", metavar="N"),
)

EPILOG = """\
examples:
  ebb predict --model runs/ml --input data/test.csv --out preds.csv          predicted ratings
  ebb predict --model runs/ml --recommend 10 --users all --out top10.parquet   top-10 per user
  ebb predict --model runs/ctr --input day_1.tsv --out p.csv --with-labels    + log-loss, accuracy, AUC
  ebb predict --model s3://b/jobs/x --input s3://b/in.csv --out preds.csv --stack Ebb     on AWS, 4 shards

A ratings model scores rows of `user item [rating [timestamp]]` (tab, `::` or comma
separated) into CSV `user,item,rating,prediction`; with ratings in every row it prints the
RMSE. A logistic model scores rows in its training format (Criteo TSV, LibSVM, CSV with
its header) into `probability` (with --with-labels `label,probability` and the metrics).
Unknown users and items get the bias-only prediction and are counted.
"""


def add_predict(sub) -> None:
    """Register ``ebb predict``."""
    p = sub.add_parser(
        "predict",
        help="score a file or recommend top-K items with a trained model",
        description="Score rows (or recommend items) with a trained model: a run's folder or s3:// prefix "
        "holding model.npz and model.json. Input and output may be s3:// objects.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(p, PredictSpec, PREDICT_FLAGS)
    p.set_defaults(func=cmd_predict)


def _fail(message: str, code: int = 2) -> int:
    print(f"ebb predict: {message}", file=sys.stderr)
    return code


class _Bar:
    """A one-line progress count on stderr: rows so far and their rate."""

    def __init__(self, what: str):
        self.what, self.n, self.t0, self.last = what, 0, time.perf_counter(), 0.0

    def __call__(self, rows: int, *, final: bool = False) -> None:
        self.n += rows
        now = time.perf_counter()
        if final or now - self.last > 0.5:
            self.last = now
            rate = self.n / max(now - self.t0, 1e-9)
            print(f"\r{self.what} {self.n:,} rows  {rate:,.0f} rows/s", end="", file=sys.stderr, flush=True)


def cmd_predict(cli) -> int:
    from pydantic import ValidationError

    from ebb.data.readers import DataError
    from ebb.ports.objects import is_s3
    from ebb.predict.artifact import ArtifactError
    from ebb.stores import local_copy, parse_s3_url

    try:
        args = PredictSpec.model_validate({k: v for k, v in given(cli, PREDICT_FLAGS).items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        return _fail(f"{option_of(str(err['loc'][0]), PREDICT_FLAGS)}: {err['msg']}")
    if args.recommend is None and not args.input:
        return _fail("give --input FILE (rows to score) or --recommend K")
    if args.stack:
        from ebb.predict.cli.stack import submit_predict

        return submit_predict(args)
    try:
        with ExitStack() as stack:
            out_s3 = is_s3(args.out)
            out_path = args.out
            if out_s3:
                parse_s3_url(args.out)
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ebb-predict-out-"))
                out_path = str(Path(tmp, Path(args.out).name or "predictions.csv"))
            if args.recommend is not None:
                summary = _recommend(args, out_path, stack, local_copy)
            else:
                if not is_s3(args.input) and not Path(args.input).is_file():
                    return _fail(f"--input: no such file: {args.input}")
                local = stack.enter_context(local_copy(args.input))
                from ebb.predict.run import predict_file

                bar = _Bar("scored")
                summary = predict_file(
                    args.model,
                    local,
                    out_path,
                    name=args.input,
                    with_labels=args.with_labels,
                    skip_bad_rows=args.skip_bad_rows,
                    workers=args.workers,
                    progress=bar,
                )
                bar(0, final=True)
                print(file=sys.stderr)
            if out_s3:
                from ebb.stores.s3 import S3ObjectStore

                bucket, key = parse_s3_url(args.out)
                S3ObjectStore(bucket).put_file(key, out_path)
    except (ArtifactError, DataError) as exc:
        print(file=sys.stderr)
        return _fail(str(exc))
    except (KeyError, OSError) as exc:
        print(file=sys.stderr)
        return _fail(str(exc).strip("'\""), code=1)
    _print(summary, args.out)
    return 0


def _recommend(args, out_path: str, stack: ExitStack, local_copy) -> dict:
    from ebb.predict.inputs import ids_file
    from ebb.predict.run import recommend_users

    users = None
    if args.users != "all":
        users = ids_file(stack.enter_context(local_copy(args.users)))
    return recommend_users(
        args.model, users, args.recommend, out_path, exclude_seen=not args.include_seen, workers=args.workers
    )


def _print(summary: dict, out: str) -> None:
    if "users" in summary:
        print(
            f"recommended {summary['k']} items to {summary['users']:,} users ({summary['rows']:,} rows, "
            f"{summary['format']}) in {summary['seconds']:.2f} s: {summary['users_per_second']:,.0f} users/s -> {out}"
        )
    else:
        rate = summary["rows_per_second"] or 0.0
        print(f"scored {summary['rows']:,} rows in {summary['seconds']:.2f} s: {rate:,.0f} rows/s -> {out}")
        if summary["skipped_rows"]:
            print(f"skipped {summary['skipped_rows']:,} bad rows, e.g. {summary['bad_row_examples'][0]}")
        if summary.get("metrics"):
            print("metrics: " + json.dumps(summary["metrics"]))
        per_million = (summary.get("cost_on_lambda") or {}).get("usd_per_million_rows")
        if per_million:
            print(f"on Lambda at this pace (1769 MB): ${per_million:.4f} per million rows (ebb.cost.model)")
    unknown = {k: v for k, v in summary.get("unknown", {}).items() if v}
    if unknown:
        print("unknown (scored with the biases alone): " + ", ".join(f"{v:,} {k}" for k, v in unknown.items()))
