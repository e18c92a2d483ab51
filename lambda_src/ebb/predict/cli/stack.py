"""``ebb predict --stack NAME``: the same run as an execution of the stack's Predict state
machine (``ebb.predict.shards``), watched to its end; the shards joined into ``--out``."""

from __future__ import annotations

import json
import secrets
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from ebb.deployed import Deployment, DeploymentError, _session, configuration_problem
from ebb.ports import deployment as names
from ebb.ports.keys import ID_MAP_COPY_KEY, MODEL_KEY, MODEL_META_KEY, SEEN_KEY
from ebb.ports.objects import is_s3
from ebb.stores import open_object_store

DONE = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")


def _upload(dep: Deployment, run: str, local: str, what: str) -> str:
    """A local file (or a run's model folder) copied to ``predictions/<run>/<what>/``."""
    prefix = f"{names.predict_prefix(run)}/{what}"
    bucket = open_object_store(f"s3://{dep.bucket}")
    path = Path(local)
    if path.is_dir():
        for key in (MODEL_META_KEY, MODEL_KEY, ID_MAP_COPY_KEY, SEEN_KEY):
            if (path / key).is_file():
                bucket.put_file(f"{prefix}/{key}", path / key)
        return f"s3://{dep.bucket}/{prefix}"
    bucket.put_file(f"{prefix}/{path.name}", path)
    return f"s3://{dep.bucket}/{prefix}/{path.name}"


def run_on_stack(dep: Deployment, request: dict, *, every_s: float = 2.0, emit=print) -> dict:
    """Start the Predict execution for ``request`` and wait for it; returns the manifest."""
    arn = dep.outputs.get(names.PREDICT_STATE_MACHINE_OUTPUT)
    if not arn:
        raise DeploymentError(f"stack {dep.stack} has no {names.PREDICT_STATE_MACHINE_OUTPUT}: deploy this version")
    sfn = _session().client("stepfunctions")
    execution = sfn.start_execution(stateMachineArn=arn, name=request["run"], input=json.dumps(request))
    emit(f"started {request['run']}\n  {execution['executionArn']}")
    while (desc := sfn.describe_execution(executionArn=execution["executionArn"]))["status"] not in DONE:
        time.sleep(every_s)
    if desc["status"] != "SUCCEEDED":
        raise DeploymentError(
            f"{request['run']}: {desc['status'].lower()}: {desc.get('error', '')} {desc.get('cause', '')}"
        )
    key = json.loads(desc["output"])["manifest"]["manifest_key"]
    return json.loads(open_object_store(f"s3://{dep.bucket}").get(key))


def join_shards(dep: Deployment, manifest: dict, out: str) -> None:
    """The shards' CSVs, in order, as one file at ``out`` (a path or s3://)."""
    bucket = open_object_store(f"s3://{dep.bucket}")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ebb-join-") as tmp:
        joined = Path(tmp, "joined")
        with open(joined, "wb") as f:
            for shard in manifest["shards"]:
                f.write(bucket.get(shard["key"]))
        if is_s3(out):
            from ebb.stores import parse_s3_url
            from ebb.stores.s3 import S3ObjectStore

            b, key = parse_s3_url(out)
            S3ObjectStore(b).put_file(key, joined)
        else:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_bytes(joined.read_bytes())


def submit_predict(args) -> int:
    """``ebb predict --stack``: upload what is local, run, join, print."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        dep = Deployment.from_stack(args.stack)
        run = f"predict-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        model = args.model if is_s3(args.model) else _upload(dep, run, args.model, "model")
        source = None
        if args.input:
            source = args.input if is_s3(args.input) else _upload(dep, run, args.input, "input")
        users = args.users
        if args.recommend is not None and users != "all" and not is_s3(users):
            users = _upload(dep, run, users, "users")
        request = {
            "run": run,
            "model": model,
            "input": source,
            "shards": args.shards,
            "with_labels": args.with_labels,
            "skip_bad_rows": args.skip_bad_rows,
            "recommend": args.recommend,
            "users": users,
            "exclude_seen": not args.include_seen,
        }
        manifest = run_on_stack(dep, request, emit=lambda line: print(line, file=sys.stderr))
        join_shards(dep, manifest, args.out)
    except (DeploymentError, BotoCoreError, ClientError, OSError) as exc:
        print(f"ebb predict: {configuration_problem(exc) or exc}", file=sys.stderr)
        return 2
    cost = manifest["cost"]
    per_million = cost.get("usd_per_million_rows")
    print(
        f"scored {manifest['rows']:,} rows in {len(manifest['shards'])} shards -> {args.out}; est. AWS cost "
        f"${cost['total_usd']:.6f}" + (f" (${per_million:.4f} per million rows)" if per_million else "")
    )
    if manifest.get("metrics"):
        print("metrics: " + json.dumps(manifest["metrics"]))
    if manifest.get("skipped_rows"):
        print(f"skipped {manifest['skipped_rows']:,} bad rows, e.g. {manifest['bad_row_examples'][0]}")
    return 0
