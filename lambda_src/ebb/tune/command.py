"""``ebb tune``: the command's flags and what it does (``ebb.cli`` only registers it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ebb.flags import JOB_FLAGS, LOCAL_FLAGS, Flag

# The job's flags, less what the search decides for each trial: how far it trains (the
# rungs), what it may spend (the search's budget) and where its redis-server is (shared).
TUNE_JOB_FLAGS = tuple(
    f for f in JOB_FLAGS + LOCAL_FLAGS if f.field not in ("stop.max_epochs", "stop.budget_usd", "redis_urls")
)
TUNE_FLAGS = (
    Flag("trials", metavar="N"),
    Flag("budget_usd", metavar="USD"),
    Flag("eta"),
    Flag("min_epochs", metavar="E"),
    Flag("max_epochs", metavar="E"),
    Flag("sampler"),
    Flag("scheduler"),
    Flag("ladder"),
    Flag("base_share", metavar="SHARE"),
    Flag("compare_within", metavar="FIELD"),
    Flag("parallel", metavar="CPUS"),
    Flag("seed", "--tune-seed"),
)

EPILOG = """\
examples:
  ebb tune --model pmf --data data/ml --quick          the built-in space, about 3x one run's cost
  ebb tune job.yaml --budget-usd 0.05                  the job file's tune: section
  ebb tune --data data/ml --param hyper.lr=log_uniform:0.005,0.1 --param hyper.rank=choice:10,20,40
  ebb tune --resume runs/my-job                        carry on after a kill
  ebb tune job.yaml --stack Ebb --watch                on a deployed stack: in trial packs, an execution each

Every trial is an ordinary job in OUT/trials/tNNN (checkpoints, report.json, model.npz).
Trials are compared on the validation metric at rungs of min_epochs x eta^k epochs (at one
worker's pace); the best 1/eta go on, resuming from their checkpoints (ASHA). At the end:
a leaderboard, OUT/tune.json, OUT/best/ (the best trial's model and report), OUT/tune.png.
Here the jobs run in trial packs: one warm fleet trains them one after another (one cold
start, one load of the data, one execution to pay); --fleets N runs N at once, --no-packs
gives every job a fleet of its own.
With --stack the search runs on the stack's Tune state machine, in trial packs too: each
pack (--fleets N at once) one nested execution of the training state machine that trains the
search's jobs back to back, every trial's job under jobs/<tune>-tNNN, the leaderboard and the
best trial under s3://<bucket>/tunes/<tune>/ (docs/AWS.md).
"""


def add_tune(sub) -> None:
    from ebb.flags import add_flags, add_job_arguments
    from ebb.tune.space import TuneSpec

    p = sub.add_parser(
        "tune",
        help="search hyper-parameters: successive halving over resumable trials (here or on a stack)",
        description="Search hyper-parameters of a job: sample settings with Optuna, train each as a job, "
        "stop the weaker ones early (successive halving, ASHA) and resume the better ones from their checkpoints.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_arguments(p, TUNE_JOB_FLAGS, "job file (YAML), with an optional tune: section")
    search = p.add_argument_group("search (the job file's tune: section)")
    add_flags(search, TuneSpec, TUNE_FLAGS, required=False)
    search.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="FIELD=KIND:A,B",
        help="search FIELD (any hyper.* or sync.* field) over log_uniform:LO,HI, uniform:LO,HI or choice:A,B,...; "
        "repeatable",
    )
    search.add_argument(
        "--quick",
        action="store_true",
        help="the built-in space and rungs of the model (lr, l2, optimizer, rank for PMF)",
    )
    search.add_argument(
        "--no-packs",
        dest="packs",
        action="store_false",
        help="run each job of a trial on a fleet of its own (cold start, data loading, execution each), "
        "not in trial packs: warm fleets that train one job after another (the default; cheaper)",
    )
    search.add_argument(
        "--fleets",
        type=int,
        default=1,
        metavar="N",
        help="trial packs: warm fleets at once, within --parallel (default 1, the cheapest: each fleet "
        "pays its own cold start and execution; more finish sooner); with --stack, pack executions at once",
    )
    p.add_argument("--resume", metavar="OUT", help="carry on with the search in OUT (after a kill); no other arguments")
    aws = p.add_argument_group("on a deployed stack")
    aws.add_argument(
        "--stack",
        metavar="NAME",
        help="run the search on this deployed stack's Tune state machine (a local dataset is uploaded first)",
    )
    aws.add_argument("--watch", action="store_true", help="with --stack: follow it, then print the leaderboard")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args) -> int:
    from ebb.flags import given
    from ebb.spec import SpecError
    from ebb.tune.runner import Base, LocalTune, TuneError, leaderboard_text
    from ebb.tune.space import tune_spec

    def say(line: str) -> None:
        print(line, flush=True)

    if args.stack:
        return _tune_on_stack(args)
    if args.watch:
        print("ebb tune: --watch follows a search on a stack: give --stack NAME", file=sys.stderr)
        return 2
    try:
        if args.resume:
            if args.job or args.params or args.quick or not args.packs or args.fleets != 1:
                print(
                    "ebb tune: --resume carries on the search as it started: drop the other arguments", file=sys.stderr
                )
                return 2
            run = LocalTune.resume(Path(args.resume), say)
        else:
            section, job_yaml, overrides = _job_input(args)
            first = Base(job_yaml, overrides, args.assignments).spec()
            overrides["name"] = first.name  # one name (a drawn one, when none was given) for all trials
            base = Base(job_yaml, overrides, args.assignments)
            out = Path(first.out_location)  # --out, the job file's out, else runs/<name>
            tspec = tune_spec(section, first.model, given(args, TUNE_FLAGS), args.params, args.quick)
            if args.fleets < 1:
                print("ebb tune: --fleets must be at least 1", file=sys.stderr)
                return 2
            run = LocalTune(out, tspec, base, say, packs=args.packs, fleets=args.fleets)
            run.start()
        say(
            f"tuning {len(run.tspec.space)} fields over {run.tspec.trials} trials, {run.tspec.rungs_text()}"
            + (f", budget ${run.tspec.budget_usd:g}" if run.tspec.budget_usd else "")
            + f"; trials in {run.out / 'trials'}"
        )
        result = run.run()
    except (SpecError, TuneError) as exc:
        print(f"ebb tune: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ebb tune: interrupted; carry on with ebb tune --resume {run.out}", file=sys.stderr)
        return 1
    print(leaderboard_text(result, "rmse" if run.base.spec().model == "pmf" else "logloss"))
    if result["best"] is not None:
        print(f"best: trial {result['best']['trial']} -> {run.out / 'best'}; leaderboard {run.out / 'tune.json'}")
        return 0
    print("no trial finished a rung", file=sys.stderr)
    return 1


def _tune_on_stack(args) -> int:
    """``ebb tune --stack NAME``: the same search, run by the stack; with --watch, its leaderboard."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ebb.deployed import Deployment, DeploymentError, configuration_problem
    from ebb.flags import given
    from ebb.spec import SpecError
    from ebb.tune.runner import Base, leaderboard_text
    from ebb.tune.space import tune_spec
    from ebb.tune.stack import submit_tune, watch_tune

    if args.resume:
        print("ebb tune: --resume carries on a local search; a stack's search carries on by itself", file=sys.stderr)
        return 2
    if not args.packs:
        print(
            "ebb tune: --no-packs is a local search's: a stack runs the search in trial packs, an execution per "
            "fleet (docs/AWS.md, Tuning on AWS)",
            file=sys.stderr,
        )
        return 2
    if args.fleets < 1:
        print("ebb tune: --fleets must be at least 1", file=sys.stderr)
        return 2
    try:
        section, job_yaml, overrides = _job_input(args)
        spec = Base(job_yaml, overrides, args.assignments).spec()
        tspec = tune_spec(section, spec.model, given(args, TUNE_FLAGS), args.params, args.quick)
        dep = Deployment.from_stack(args.stack)
        started = submit_tune(dep, spec, tspec, progress=lambda line: print(line, file=sys.stderr), fleets=args.fleets)
        print(
            f"started tune {started['name']}: {len(tspec.space)} fields over {tspec.trials} trials, "
            f"{tspec.rungs_text()}\n  {started['executionArn']}\n  {started['console']}",
            flush=True,
        )
        if not args.watch:
            return 0
        status, result = watch_tune(dep, started["executionArn"])
    except SpecError as exc:
        print(f"ebb tune: {exc}", file=sys.stderr)
        return 2
    except (DeploymentError, BotoCoreError, ClientError, OSError) as exc:
        print(f"ebb tune: {configuration_problem(exc) or exc}", file=sys.stderr)
        return 2
    if result is None:
        return 1
    print(leaderboard_text(result, "rmse" if spec.model == "pmf" else "logloss", where="on the stack"))
    if result["best"] is None:
        print("no trial finished a rung", file=sys.stderr)
        return 1
    tune = f"s3://{dep.bucket}/tunes/{started['name']}"
    print(f"best: trial {result['best']['trial']} -> {tune}/best/; leaderboard {tune}/tune.json")
    return 0


def _job_input(args) -> tuple[dict | None, str | None, dict]:
    """The job file's tune: section, the rest of it as YAML (None: no file) and the flags
    given for the job's fields."""
    from ebb.flags import given
    from ebb.tune.space import split_job_file

    section, job_yaml = split_job_file(args.job)
    overrides = {k: v for k, v in given(args, TUNE_JOB_FLAGS).items() if v is not None}
    if job_yaml is None and args.job:
        job_yaml = Path(args.job).read_text()
    return section, job_yaml, overrides
