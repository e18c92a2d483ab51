"""``ebb``: generate data, prepare it into minibatches, and train on it — here, or on
a deployed stack.

    ebb synth ratings --out data/ratings.csv            # planted low-rank ratings
    ebb prepare --format movielens --input data/ratings.csv --out data/ml
    ebb train --model pmf --data data/ml --workers 4    # local: processes + redis
    ebb submit job.yaml --stack Ebb                     # the same job on AWS Lambda
    ebb watch EXECUTION                                 # its progress, until it ends
    ebb report EXECUTION --out runs/x                   # its report, model and plot
    ebb predict --model runs/x --input rows.csv --out p.csv   # score rows with a trained model
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
  ebb train --model pmf --data data/ml --l2 0.05 --patience-evals 8
  ebb train --data data/ml --target-val 0.85 --set scaling.knee_min_drop=0.1

Flags override the job file; with no job file the flags alone define the job, and
every unset hyper-parameter takes its model's default. With a validation split (`ebb
prepare` keeps 10 %) the job stops when --patience-evals scorings in a row are no
better, and writes the best model it scored. Every field of the job file (`ebb spec`)
can be set with --set. The job writes OUT/report.json (status, wall_seconds, steps,
epochs, final_loss, test_metrics, history, totals, cost), OUT/model.npz and
OUT/loss.png, and exits 1 when the job fails.
"""


class _Renamed(argparse.Action):
    """A flag that was renamed: one line saying to what."""

    def __init__(self, option_strings, dest, renamed_to: str, **kwargs):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)
        self.renamed_to = renamed_to

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} was renamed to {self.renamed_to}")


def _add_job_flags(p) -> None:
    """The flags that override fields of a job file (``ebb train`` and ``ebb submit``),
    generated from the spec's fields (``ebb.flags``)."""
    from ebb.flags import JOB_FLAGS, add_job_arguments

    add_job_arguments(p, JOB_FLAGS)
    p.add_argument("--target-test", action=_Renamed, renamed_to="--target-val")


def _add_train(sub) -> None:
    from ebb.flags import LOCAL_FLAGS, add_flags
    from ebb.spec import JobSpec

    p = sub.add_parser(
        "train",
        help="train a model (locally: worker processes + a private redis-server)",
        description="Train a model on a prepared dataset.",
        epilog=EPILOG_TRAIN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_job_flags(p)
    add_flags(p, JobSpec, LOCAL_FLAGS, required=False)
    p.add_argument(
        "--resume",
        metavar="OUT",
        help="continue an interrupted job from the last round it completed in OUT (its job spec is "
        "read from OUT/checkpoints/spec.json; no job file or other flags)",
    )
    p.set_defaults(func=cmd_train, spec_flags="train")


def _spec_flags(args):
    from ebb.flags import JOB_FLAGS, LOCAL_FLAGS

    return JOB_FLAGS + LOCAL_FLAGS if args.spec_flags == "train" else JOB_FLAGS


def cmd_train(args) -> int:
    from ebb.ports.keys import MANIFEST_KEY
    from ebb.ports.objects import is_s3
    from ebb.stores import open_object_store

    spec = _train_spec(args)
    if spec is None:
        return 2
    try:
        out = open_object_store(spec.out_location)
        data = open_object_store(spec.data)
        has_manifest = data.exists(MANIFEST_KEY)
    except (ValueError, OSError) as exc:  # a bad location (missing bucket, no credentials): one line
        print(f"ebb train: {exc}", file=sys.stderr)
        return 2
    from ebb.local.out_lock import OutLock, OutLocked

    if not is_s3(spec.out_location) and Path(spec.out_location).exists() and not Path(spec.out_location).is_dir():
        print(f"ebb train: out: {spec.out_location} is a file; give --out a folder", file=sys.stderr)
        return 2
    new_folder = not is_s3(spec.out_location) and not Path(spec.out_location).exists()
    lock = OutLock(out, spec.out_location)
    try:  # before anything is written to OUT: one job per folder
        lock.acquire(resume=bool(args.resume))
    except OutLocked as exc:
        print(f"ebb train: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # unwritable, no credentials...
        print(f"ebb train: out: cannot write to {spec.out_location}: {exc}", file=sys.stderr)
        return 2
    try:
        return _train_locked(args, spec, out, data, has_manifest)
    finally:
        lock.release()
        if new_folder and Path(spec.out_location).is_dir() and not any(Path(spec.out_location).iterdir()):
            Path(spec.out_location).rmdir()  # refused before it wrote anything: leave no trace


def _train_locked(args, spec, out, data, has_manifest: bool) -> int:
    """``ebb train`` once the job holds the lock on its OUT."""
    from ebb.engine.preflight import PreflightError, preflight
    from ebb.ports.keys import MANIFEST_KEY

    if not has_manifest and spec.prepare is not None and not args.resume:
        from ebb.data.prepare import InputError, prepare_from_spec

        print(f"preparing {spec.prepare.input} into {spec.data} (the job's prepare section)", file=sys.stderr)
        try:
            prepare_from_spec(spec.prepare, data)
        except InputError as exc:
            print(f"ebb train: prepare.{exc.field}: {exc}", file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"ebb train: prepare: {exc}", file=sys.stderr)
            return 2
    elif not has_manifest:
        print(
            f"ebb train: data: {spec.data} has no {MANIFEST_KEY}; prepare it first with `ebb prepare` "
            "(or give the job a prepare section)",
            file=sys.stderr,
        )
        return 2
    try:  # before torch and the engine are imported (seconds): a bad dataset is refused at once
        preflight(spec, data)
    except PreflightError as exc:
        print(f"ebb train: {exc}", file=sys.stderr)
        return 2
    import torch

    from ebb.catalogue import entry
    from ebb.local.progress import ProgressSink
    from ebb.local.runner import JobFailed, run_local

    torch.set_num_threads(1)
    sink = ProgressSink(entry(spec.model).loss_name, clock=spec.clock.kind)
    started = time.monotonic()
    try:
        report, _ = run_local(spec, sink, resume=bool(args.resume), preflighted=True)
    except PreflightError as exc:  # nothing ran: nothing to report
        sink.close({})
        print(f"ebb train: {exc}", file=sys.stderr)
        return 2
    except JobFailed as exc:  # a crash, Ctrl-C or SIGTERM: still leave a report behind
        sink.close({})
        report = exc.report
    except (Exception, KeyboardInterrupt) as exc:  # outside the rounds (finalize, a full disk...): the same
        sink.close({})
        _debug_traceback()
        report = {
            "status": "failed",
            "error": one_line(exc) if not isinstance(exc, KeyboardInterrupt) else "interrupted",
        }
    if report["status"] == "failed":
        report["wall_seconds"] = round(time.monotonic() - started, 3)
        report["spec"] = spec.model_dump(mode="json")
        if not _write_failed_report(out, report):
            _print_summary(report, None)
            return 1
    _print_summary(report, spec.out_location)
    from ebb.plan.cli import smaller_fleet_note

    if note := smaller_fleet_note(report):
        print(note, file=sys.stderr)
    return 0 if report["status"] != "failed" else 1


def _write_failed_report(out, report: dict) -> bool:
    """The failed report, which a second Ctrl-C does not cut short; if it cannot be written
    (a full disk, an unwritable folder) the reason joins the one-line summary."""
    import signal

    from ebb.engine.outputs import write_outputs
    from ebb.ports.keys import MODEL_KEY

    report["model"] = None  # no model was written by this job
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
    try:
        out.delete(MODEL_KEY)  # never beside another run's model (ours has none)
        write_outputs(out, report, None)
    except OSError as exc:
        report["error"] = f"{report.get('error')}; the failed report could not be written either ({one_line(exc)})"
        return False
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return True


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one line of at most ``limit`` characters. Ebb's own errors (and the
    OS's) say what is wrong in their message; any other is named by its type too."""
    text = " ".join(str(exc).split())
    if not text or not isinstance(exc, (ValueError, OSError, RuntimeError)):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _debugging() -> bool:
    import os

    return os.environ.get("EBB_DEBUG", "") not in ("", "0")


def _debug_traceback() -> None:
    if _debugging():
        import traceback

        traceback.print_exc()


def _train_spec(args):
    """The job spec from the job file and flags, or from OUT/checkpoints with --resume."""
    from ebb.flags import given
    from ebb.spec import SpecError, load_spec

    flags = _spec_flags(args)
    overrides = given(args, flags)
    if args.resume:
        named = [f.option for f in flags if overrides[f.field] is not None] + [f"--set {a}" for a in args.assignments]
        if args.job or named:
            extra = named[0] if named else f"the job file {args.job}"
            print(f"ebb train: --resume continues a job exactly as it started: drop {extra}", file=sys.stderr)
            return None
        return _resume_spec(args.resume)
    try:
        return load_spec(args.job, overrides, args.assignments)
    except SpecError as exc:
        print(f"ebb train: {exc}", file=sys.stderr)
        return None


def _resume_spec(location: str):
    """The spec of the job in ``location`` (its ``checkpoints/spec.json``), with ``out``
    set to ``location`` itself: a copied or moved run folder continues where it now is,
    from any directory. None (after one line on stderr) if there is no such job."""
    from pydantic import ValidationError

    from ebb.ports.keys import SPEC_KEY
    from ebb.ports.objects import is_s3
    from ebb.spec import JobSpec
    from ebb.stores import join_location, open_object_store

    def refuse(message: str) -> None:
        print(f"ebb train: --resume: {message}", file=sys.stderr)

    if not is_s3(location) and Path(location).exists() and not Path(location).is_dir():
        return refuse(f"{location} is a file; give the folder of the run to continue (its --out)")
    where = f"{location.rstrip('/')}/checkpoints/{SPEC_KEY}"
    try:
        raw = open_object_store(join_location(location, "checkpoints")).get(SPEC_KEY)
    except KeyError:
        return refuse(f"{location} holds no checkpoints of a job (no checkpoints/{SPEC_KEY})")
    except (ValueError, OSError) as exc:
        return refuse(f"{where}: cannot be read: {exc}")
    try:
        spec = JobSpec.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "the file"
        return refuse(
            f"{where} is not the spec of a job this version can continue ({field}: {err['msg']}); "
            "was it edited? start the job again instead"[:400]
        )
    return spec.model_copy(update={"out": location})


def _print_summary(report: dict, out: str | None) -> None:
    if report["status"] == "failed":
        print(f"job failed: {report.get('error')}", file=sys.stderr)
    else:
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in report.get("test_metrics", {}).items())
        rounds = f" in {report['rounds']} rounds" if report.get("rounds", 1) > 1 else ""
        line = (
            f"{report['status']}: {report['steps']} steps{rounds}, {report['epochs']:.2f} epochs in "
            f"{report['wall_seconds']:.1f} s; final training {report['loss_name']} {report['final_loss']:.4f}; "
        )
        if report.get("model") == "best":
            line += f"best validation {report['best_val']:.4f} at step {report['best_step']}; "
        line += f"test {metrics}"
        if "cost" in report:
            line += f"; est. AWS cost ${report['cost']['total_usd']:.4f}"
        print(line)
    if out is not None:
        print(f"report: {out.rstrip('/')}/report.json")


SYNTH_PRESETS = (
    "ml-100k",
    "ml-latest-small",
    "ml-10m",
    "ml-100k-wild",
    "ml-latest-small-wild",
)  # ebb.data.synth.RATING_PRESETS (imported lazily)
PLANTED_RATINGS = {"users": 2000, "items": 1500, "ratings": 200_000, "noise": 0.5, "rank": 10}


def _add_synth(sub) -> None:
    p = sub.add_parser(
        "synth",
        help="generate a seeded dataset with planted structure",
        description="Generate data with known structure, in the real formats `ebb prepare` reads. "
        "A sidecar OUT.meta.json records the truth (noise floor, Bayes log-loss).",
    )
    kinds = p.add_subparsers(dest="kind", required=True, metavar="ratings|logistic")
    r = kinds.add_parser(
        "ratings",
        help="planted low-rank ratings (MovieLens format), dense or shaped like a real file",
        description="Without --preset: planted rank-r ratings with Zipf popularity, neither rounded nor clipped "
        "(the RMSE floor is --noise). With --preset: the shape of a public MovieLens file — every user "
        "with at least 20 ratings, heavy-tailed counts per user, a long tail of items rated a few "
        "times, whole or half stars clipped to the scale — over the same kind of planted structure; "
        "the sidecar records the preset, the realised shape and the best achievable RMSE.",
        epilog="presets: ml-100k (943 users, 1,682 items, 100,000 ratings 1-5), ml-latest-small (610 users, "
        "9,724 items, 100,836 half stars, 35% of items rated once), ml-10m (69,878 users, 10,677 items, "
        "10,000,054 half stars; about a minute); ml-100k-wild and ml-latest-small-wild: the same counts with "
        "real raters' irregularities (rank 30, a slow spectrum, a noise σ per user, heavy raters harsher, rare "
        "items' biases wider)",
    )
    r.add_argument("--out", required=True, help="output file: .csv (ratings.csv), .dat (::), else u.data (tab)")
    r.add_argument("--preset", choices=SYNTH_PRESETS, help="shape the ratings like this MovieLens file")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--users", type=int, help="number of users (default 2000, or the preset's)")
    r.add_argument("--items", type=int, help="number of items (default 1500, or the preset's)")
    r.add_argument("--ratings", type=int, help="number of ratings (default 200,000, or the preset's)")
    r.add_argument("--rank", type=int, help="planted rank (default 10, or the preset's)")
    r.add_argument("--noise", type=float, help="Gaussian noise σ (default 0.5: the RMSE floor; a preset has its own)")
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

    if args.kind == "ratings" and args.preset:
        meta = synth.synth_shaped_ratings(
            args.out,
            preset=args.preset,
            users=args.users,
            items=args.items,
            ratings=args.ratings,
            rank=args.rank,
            noise=args.noise,
            seed=args.seed,
        )
    elif args.kind == "ratings":
        sizes = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in PLANTED_RATINGS.items()}
        meta = synth.synth_ratings(args.out, seed=args.seed, **sizes)
    else:
        meta = synth.synth_logistic(args.out, rows=args.rows, features=args.features, nnz=args.nnz, seed=args.seed)
    print(json.dumps({k: v for k, v in meta.items() if not isinstance(v, (list, dict))}, indent=None))
    return 0


def _prepare_flags():
    from ebb.flags import Flag

    return (
        Flag("format"),
        Flag("input", metavar="FILE"),
        Flag("test_input", metavar="FILE"),
        Flag("batch_size"),
        Flag("test_fraction"),
        Flag("val_fraction"),
        Flag("seed"),
        Flag("skip_bad_rows"),
        Flag("num_features"),
        Flag("numeric_scaling"),
        Flag("max_dimension"),
    )


def _add_prepare(sub) -> None:
    from ebb.flags import add_flags
    from ebb.spec import PrepareSpec

    p = sub.add_parser(
        "prepare",
        help="parse, shuffle, split and cut a dataset into minibatches",
        description="Parse a dataset (streamed; any size), shuffle it with a seed, split train / validation "
        "/ test and write fixed-size minibatches plus manifest.json into OUT. Inputs and OUT may be on S3 "
        "(s3://bucket/...); boto3's usual configuration applies (credentials, region, AWS_ENDPOINT_URL). "
        "The same fields make a job file's `prepare` section.",
    )
    flags = _prepare_flags()
    add_flags(p, PrepareSpec, flags[:3])
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where the dataset goes: a folder or s3://bucket/prefix (existing parts are replaced)",
    )
    add_flags(p, PrepareSpec, flags[3:])
    p.set_defaults(func=cmd_prepare)


def cmd_prepare(args) -> int:
    from pydantic import ValidationError

    from ebb.flags import given, option_of
    from ebb.ports.objects import is_s3
    from ebb.stores import open_object_store, parse_s3_url

    def fail(message: str, code: int = 2) -> int:
        print(f"ebb prepare: {message}", file=sys.stderr)
        return code

    from ebb.spec import PrepareSpec

    flags = _prepare_flags()
    try:
        prep = PrepareSpec.model_validate({k: v for k, v in given(args, flags).items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        message = err["msg"].removeprefix("Value error, ")
        if err["loc"]:
            return fail(f"{option_of(str(err['loc'][0]), flags)}: {message}")
        for flag in flags:  # a rule across fields: name them by their flags
            message = message.replace(flag.field, flag.option)
        return fail(message)
    for flag, location in (("--input", prep.input), ("--test-input", prep.test_input), ("--out", args.out)):
        if location and is_s3(location):
            try:
                parse_s3_url(location)
            except ValueError as exc:
                return fail(f"{flag}: {exc}")
        elif location and flag != "--out" and not Path(location).is_file():
            return fail(f"no such file: {location}")

    from ebb.data.prepare import InputError, prepare_from_spec
    from ebb.ports.keys import MANIFEST_KEY

    try:
        store = open_object_store(args.out)
        # Fail now rather than after a long parse: a missing bucket, no credentials, no endpoint.
        store.exists(MANIFEST_KEY)
    except (ValueError, OSError) as exc:
        return fail(f"--out: {exc}")

    def progress(rows: int, note: str) -> None:
        print(f"\r{note}: {rows:,} rows", end="", file=sys.stderr, flush=True)

    try:
        manifest = prepare_from_spec(prep, store, progress=progress)
    except InputError as exc:
        return fail(f"--{exc.field.replace('_', '-')}: {exc}")
    except ValueError as exc:  # DataError (file:line: what is wrong), or no rows at all
        print(file=sys.stderr)
        return fail(str(exc))
    except OSError as exc:  # failed part-way (an S3 error, a full disk...); the message names the object
        print(file=sys.stderr)
        return fail(str(exc), code=1)
    print(file=sys.stderr)
    dims = (
        f"{manifest.num_users} users x {manifest.num_items} items"
        if manifest.kind == "ratings"
        else f"{manifest.num_features} features"
    )
    val = f"{manifest.val.rows:,} validation rows, " if manifest.val.rows else ""
    print(
        f"prepared {manifest.train.rows:,} train rows in {len(manifest.train.parts)} parts, {val}"
        f"{manifest.test.rows:,} test rows; {dims}; "
        f"skipped {manifest.source.get('skipped_rows', 0)} bad rows -> {args.out}"
    )
    return 0


DEFAULT_STACK = "Ebb"  # cdk.json's ebb:stackName


def _stack_flag(p) -> None:
    import os

    p.add_argument(
        "--stack",
        default=os.environ.get("EBB_STACK", DEFAULT_STACK),
        help="the deployed stack's name (default: $EBB_STACK or Ebb); its outputs name the state "
        "machine and the bucket",
    )


def _add_aws(sub) -> None:
    p = sub.add_parser(
        "submit",
        help="run a job on a deployed stack (AWS Lambda)",
        description="Start a job as an execution of the stack's state machine. A local prepared "
        "dataset (data: a folder) is uploaded to the stack's bucket first, once.",
        epilog="examples:\n  ebb submit job.yaml\n  ebb submit job.yaml --workers 16 --stack Ebb-dev --watch",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_job_flags(p)
    _stack_flag(p)
    p.add_argument("--watch", action="store_true", help="then watch it until it ends (as `ebb watch`)")
    p.set_defaults(func=cmd_submit, spec_flags="submit")
    w = sub.add_parser(
        "watch",
        help="follow a job on AWS until it ends: state, round, step, loss, workers, $",
        description="Print a job's progress until its execution ends; exit 0 if it succeeded, "
        "1 if it failed, timed out or was aborted.",
    )
    w.add_argument("execution", help="execution ARN (printed by `ebb submit`) or name")
    _stack_flag(w)
    w.add_argument("--every", type=float, default=5.0, metavar="S", help="seconds between polls (default 5)")
    w.set_defaults(func=cmd_watch)
    r = sub.add_parser(
        "report",
        help="summarise a run: a local run folder, or a job on AWS (downloading its outputs)",
        description="Print a run's summary. Given a local run folder (runs/x), read its report.json; given an "
        "execution, download the job's report.json, model.npz and loss.png from the stack first.",
        epilog="examples:\n  ebb report runs/my-job\n  ebb report my-job-20261126-010255-7682 --out runs/aws-job",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("execution", help="a local run folder, or an execution ARN or name")
    _stack_flag(r)
    r.add_argument("--out", metavar="DIR", help="where to put the files (default runs/<execution name>)")
    r.set_defaults(func=cmd_report)


def _aws_errors(fn):
    """One line, exit 2, for what the user can fix (no stack, no such execution, no credentials)."""

    def wrapped(args) -> int:
        from botocore.exceptions import BotoCoreError, ClientError

        from ebb.deployed import DeploymentError, configuration_problem

        try:
            return fn(args)
        except (DeploymentError, BotoCoreError, ClientError, OSError) as exc:
            print(f"ebb {args.command}: {configuration_problem(exc) or exc}", file=sys.stderr)
            return 2

    return wrapped


@_aws_errors
def cmd_submit(args) -> int:
    from ebb.deployed import Deployment, Execution, watch
    from ebb.flags import given
    from ebb.spec import SpecError, load_spec

    try:
        spec = load_spec(args.job, given(args, _spec_flags(args)), args.assignments)
    except SpecError as exc:
        print(f"ebb submit: {exc}", file=sys.stderr)
        return 2
    dep = Deployment.from_stack(args.stack)
    started = dep.submit(spec, progress=lambda line: print(line, file=sys.stderr))
    print(f"started {started['name']}\n  {started['executionArn']}\n  {started['console']}")
    if args.watch:
        status = watch(Execution(started["executionArn"], dep))
        return 0 if status == "SUCCEEDED" else 1
    return 0


@_aws_errors
def cmd_watch(args) -> int:
    from ebb.deployed import Execution, watch

    status = watch(Execution.find(args.execution, args.stack), every_s=args.every)
    return 0 if status == "SUCCEEDED" else 1


def cmd_report(args) -> int:
    if Path(args.execution).is_dir():  # a local run: nothing to fetch
        try:
            report = json.loads((Path(args.execution) / "report.json").read_text())
        except (OSError, ValueError) as exc:
            print(
                f"ebb report: {args.execution} holds no readable report.json ({type(exc).__name__}): the run has "
                "not finished, or the folder is not a run's",
                file=sys.stderr,
            )
            return 2
        _print_summary(report, args.execution)
        return 0 if report["status"] != "failed" else 1
    return _report_from_aws(args)


@_aws_errors
def _report_from_aws(args) -> int:
    from ebb.deployed import Execution, fetch_report

    execution = Execution.find(args.execution, args.stack)
    into = args.out or str(Path("runs") / execution.job_id)
    report = fetch_report(execution, into)
    _print_summary(report, into)
    return 0 if report["status"] != "failed" else 1


def _add_spec(sub) -> None:
    p = sub.add_parser(
        "spec",
        help="print every field of a job file, with its default and meaning",
        description="Print a job file with every field at its default and a comment saying what it "
        "does: a starting point for your own (`ebb spec > job.yaml`).",
    )
    p.set_defaults(func=cmd_spec)


def cmd_spec(args) -> int:
    from ebb.spec import example_yaml

    print(example_yaml(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ebb", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--debug", action="store_true", help="print the full traceback of an error (also EBB_DEBUG=1)")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{synth,prepare,train,tune,spec,submit,watch,report,predict,plan}"
    )
    _add_synth(sub)
    _add_prepare(sub)
    _add_train(sub)
    _add_spec(sub)
    _add_aws(sub)
    from ebb.tune.command import add_tune  # ebb tune: hyper-parameter search (ebb/tune/)

    add_tune(sub)
    from ebb.predict.cli import add_predict  # ebb predict (issue 26)

    add_predict(sub)
    # ebb plan (issue 27): the command, and `--workers plan` on train and submit.
    from ebb.plan.cli import accept_workers_plan, add_plan

    add_plan(sub)
    for name in ("train", "submit"):
        accept_workers_plan(sub.choices[name])
    for command in sub.choices.values():  # `ebb train ... --debug` as well as `ebb --debug train ...`
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every command behind one guard: whatever escapes is one line on stderr (exit 1; 130
    for Ctrl-C), the traceback only under ``--debug`` or ``EBB_DEBUG=1``."""
    import os

    args = build_parser().parse_args(argv)
    if args.debug:
        os.environ["EBB_DEBUG"] = "1"
    try:
        from ebb.plan.cli import resolve_workers_plan

        if (code := resolve_workers_plan(args)) is not None:
            return code
        return args.func(args)
    except KeyboardInterrupt:
        _debug_traceback()
        print(f"ebb {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        _debug_traceback()
        hint = "" if _debugging() else " (--debug shows where)"
        print(f"ebb {args.command}: {one_line(exc)}{hint}", file=sys.stderr)
        return 1


def entry() -> int:
    """The ``ebb`` program: :func:`main`, then an exit that a late Ctrl-C cannot turn into a
    traceback (a second Ctrl-C after the job has stopped would otherwise land in the
    interpreter's shutdown, in a library's exit hook)."""
    import signal

    code = main()
    if _main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    sys.exit(entry())
