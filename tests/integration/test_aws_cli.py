"""`ebb submit`, `ebb watch` and `ebb report` as subprocesses against a moto_server holding a
stack whose outputs name the state machine and the bucket (docs/AWS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from ebb.local.runner import run_local
from ebb.spec import load_spec
from ebb.stores.local import FolderObjectStore
from tests.helpers.aws import server_client, unique_bucket


def ebb(*args, env, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "ebb.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def stack(moto_server, moto_env):
    """A stack with the outputs `ebb submit` reads; its state machine waits a moment, then succeeds."""
    request = urllib.request.Request(
        f"{moto_server}/moto-api/config",
        method="POST",
        data=json.dumps({"stepfunctions": {"execute_state_machine": True}}).encode(),
    )
    urllib.request.urlopen(request).read()
    s3, sfn, cfn = (server_client(moto_server, s) for s in ("s3", "stepfunctions", "cloudformation"))
    bucket = unique_bucket()
    s3.create_bucket(Bucket=bucket)
    definition = {
        "StartAt": "Train",
        "States": {"Train": {"Type": "Wait", "Seconds": 2, "Next": "Done"}, "Done": {"Type": "Pass", "End": True}},
    }
    machine = sfn.create_state_machine(
        name=f"{bucket}-train", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/ebb-sfn"
    )["stateMachineArn"]
    template = {
        "Resources": {"Events": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {"StateMachineArn": {"Value": machine}, "DataBucketName": {"Value": bucket}},
    }
    name = f"Ebb-{bucket[-8:]}"
    cfn.create_stack(StackName=name, TemplateBody=json.dumps(template))
    return {"name": name, "bucket": bucket, "machine": machine, "s3": s3, "sfn": sfn, "env": moto_env}


def test_submit_watch_report_against_a_deployed_stack(stack, small_ratings, tmp_path):
    data_dir, _ = small_ratings
    job = tmp_path / "job.yaml"
    job.write_text(f"name: ml-small\nmodel: pmf\ndata: {data_dir}\nworkers: 2\nstop:\n  max_epochs: 2\n")
    env, s3, bucket = stack["env"], stack["s3"], stack["bucket"]

    sub = ebb("submit", str(job), "--workers", "3", "--stack", stack["name"], env=env)
    assert sub.returncode == 0, sub.stderr
    arn = next(line.strip() for line in sub.stdout.splitlines() if ":execution:" in line and "https" not in line)
    name = arn.rsplit(":", 1)[-1]
    assert name.startswith("ml-small-") and "console.aws.amazon.com/states" in sub.stdout
    # The local dataset went to the bucket, once; the execution's input points at it.
    spec = json.loads(stack["sfn"].describe_execution(executionArn=arn)["input"])
    assert spec["data"].startswith(f"s3://{bucket}/datasets/") and spec["workers"] == 3
    prefix = spec["data"].split(f"s3://{bucket}/")[1]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]}
    assert keys == {f"{prefix}/{k}" for k in FolderObjectStore(data_dir).list()}
    again = ebb("submit", str(job), "--stack", stack["name"], env=env)
    assert again.returncode == 0 and "dataset already uploaded" in again.stderr

    # What the job's functions would have left: progress, then the outputs (from a real local run).
    report, _ = run_local(
        load_spec(
            overrides={
                "model": "pmf",
                "data": data_dir,
                "workers": 1,
                "out": str(tmp_path / "run"),
                "stop.max_epochs": 2,
            }
        )
    )
    for key in report["files"].values():  # report.json, model.npz, loss.png and the model artifact
        s3.put_object(Bucket=bucket, Key=f"jobs/{name}/{key}", Body=(tmp_path / "run" / key).read_bytes())
    progress = {"state": "running", "round": 1, "step": 41, "loss": 0.8123, "workers": 3, "cost_usd": 0.0123}
    s3.put_object(Bucket=bucket, Key=f"jobs/{name}/progress.json", Body=json.dumps(progress).encode())

    watched = ebb("watch", name, "--stack", stack["name"], "--every", "0.3", env=env)
    assert watched.returncode == 0, watched.stderr
    lines = watched.stdout.strip().splitlines()
    assert "round 1  step 41  loss 0.8123  3 workers  $0.0123" in lines[-1] and "succeeded" in lines[-1]

    fetched = ebb("report", arn, "--stack", stack["name"], "--out", str(tmp_path / "got"), env=env)
    assert fetched.returncode == 0, fetched.stderr
    assert json.loads((tmp_path / "got" / "report.json").read_text())["steps"] == report["steps"]
    assert (tmp_path / "got" / "model.npz").read_bytes() == (tmp_path / "run" / "model.npz").read_bytes()
    assert (tmp_path / "got" / "loss.png").stat().st_size > 1000
    assert (tmp_path / "got" / "model.json").is_file()  # the artifact comes too: ebb.load_model reads it
    assert "max_epochs" in fetched.stdout and "test rmse" in fetched.stdout
    # A local run folder is summarised as it is: no stack, no AWS.
    local = ebb("report", str(tmp_path / "run"), env={k: v for k, v in env.items() if not k.startswith("AWS_")})
    assert local.returncode == 0, local.stderr
    assert local.stdout.splitlines()[0] == fetched.stdout.splitlines()[0] and "test rmse" in local.stdout


def test_aws_commands_fail_in_one_line(stack, tmp_path):
    env = stack["env"]
    job = tmp_path / "job.yaml"
    job.write_text("model: pmf\ndata: /nonexistent/data\n")
    cases = [
        (
            ("submit", str(job), "--stack", "NoSuchStack"),
            "ebb submit: stack NoSuchStack does not exist in us-east-1: "
            "deploy it (`npx cdk deploy`), pass --stack NAME",
        ),
        (("submit", str(job), "--stack", stack["name"]), "ebb submit: data: /nonexistent/data is neither"),
        (("watch", "no-such-run", "--stack", stack["name"]), "ebb watch: execution arn:aws:states:"),
        (("report", "arn:aws:sns:us-east-1:1:x", "--stack", stack["name"]), "ebb report: arn:aws:sns"),
    ]
    for argv, start in cases:
        r = ebb(*argv, env=env)
        assert r.returncode == 2, (argv, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(start), (argv, r.stderr)
    # What the user must set, when their AWS configuration lacks it.
    no_region = {k: v for k, v in env.items() if k not in ("AWS_DEFAULT_REGION", "AWS_REGION")}
    no_keys = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    for broken, start in (
        (no_region, "ebb watch: no AWS region: set AWS_DEFAULT_REGION"),
        (no_keys, "ebb watch: no usable AWS credentials (Unable to locate credentials): set AWS_PROFILE"),
    ):
        r = ebb("watch", "some-run", "--stack", stack["name"], env=broken)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith(start), r.stderr
    missing_report = ebb(
        "submit", "--model", "pmf", "--data", f"s3://{stack['bucket']}/x", "--stack", stack["name"], env=env
    )
    arn = next(
        line.strip() for line in missing_report.stdout.splitlines() if ":execution:" in line and "https" not in line
    )
    r = ebb("report", arn, "--stack", stack["name"], "--out", str(tmp_path / "none"), env=env)
    assert r.returncode == 2 and "has no report yet" in r.stderr
