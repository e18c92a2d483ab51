"""The Lambda handlers end to end: each invoked as Lambda would invoke it, in its own
process, against a moto_server (S3, SNS, SQS) and a real redis-server."""

from __future__ import annotations

import io
import json
import secrets
import zipfile

import numpy as np
import pytest

from ebb.local.redis_server import RedisServer
from ebb.local.runner import run_local
from ebb.ports.deployment import worker_filter_policy
from ebb.spec import parse_spec
from ebb.stores.local import FolderObjectStore
from tests.helpers.aws import server_client, unique_bucket
from tests.helpers.lambdas import LambdaError, invoke, run_job

JOB = {
    "model": "pmf",
    "workers": 2,
    "seed": 3,
    "hyper": {"rank": 6},
    "stop": {"max_epochs": 1},
    "scaling": {"policy": "none"},
    "sync": {"mode": "isp"},
    "round_steps": 6,
}


TOKEN = "ebb-auth-" + secrets.token_hex(12)  # the cache's AUTH token: must never show anywhere
# What the stack tells Validate (stacks/settings.py, Settings.deployment).
DEPLOYMENT = {
    "worker_memory_mb": 2048,
    "supervisor_memory_mb": 1536,
    "supervisor_timeout_s": 900,
    "arch": "arm64",
    "worker_reserved": None,
    "supervisor_reserved": None,
    "map": "inline",
    "cache_node_type": "cache.t4g.small",
    "cache_nodes": 1,
}


@pytest.fixture(scope="module")
def protected_redis():
    """A redis-server that wants the AUTH token, as ElastiCache does."""
    with RedisServer(password=TOKEN) as server:
        yield server


@pytest.fixture
def deployment(moto_server, moto_env, protected_redis, small_ratings):
    """What the stack would give a job: a bucket holding a prepared dataset, the cache's AUTH
    token in Secrets Manager, an events topic (with a queue to listen on), the control
    topic and queues of the SNS/SQS channel, and the functions' environment."""
    s3, sns, sqs, sm = (server_client(moto_server, s) for s in ("s3", "sns", "sqs", "secretsmanager"))
    bucket = unique_bucket()
    secret = sm.create_secret(Name=f"{bucket}-redis-auth", SecretString=json.dumps({"password": TOKEN}))["ARN"]
    control = sns.create_topic(Name=f"{bucket}-control")["TopicArn"]
    supervisor_queue = sqs.create_queue(QueueName=f"{bucket}-supervisor")["QueueUrl"]
    for w in range(4):
        url = sqs.create_queue(QueueName=f"{bucket}-worker-{w:03d}")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(
            TopicArn=control,
            Protocol="sqs",
            Endpoint=arn,
            Attributes={"RawMessageDelivery": "true", "FilterPolicy": json.dumps(worker_filter_policy(w))},
        )
    s3.create_bucket(Bucket=bucket)
    data_dir, _ = small_ratings
    local = FolderObjectStore(data_dir)
    for key in local.list():
        s3.put_object(Bucket=bucket, Key=f"datasets/ml/{key}", Body=local.get(key))
    topic = sns.create_topic(Name=f"{bucket}-events")["TopicArn"]
    queue = sqs.create_queue(QueueName=f"{bucket}-events")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
    env = {
        **moto_env,
        "EBB_BUCKET": bucket,
        "EBB_REDIS_URLS": f"redis://127.0.0.1:{protected_redis.port}",  # the AUTH token: the secret's
        "EBB_REDIS_SECRET_ARN": secret,
        "EBB_EVENTS_TOPIC_ARN": topic,
        "EBB_MAX_WORKERS": "4",
        "EBB_CONTROL_TOPIC_ARN": control,
        "EBB_SUPERVISOR_QUEUE_URL": supervisor_queue,
        "EBB_WORKER_QUEUE_URL_PREFIX": url[:-3],
        "EBB_DEPLOYMENT": json.dumps(DEPLOYMENT),
    }

    def events() -> list[dict]:
        got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        return [json.loads(m["Body"]) for m in got]

    return {"bucket": bucket, "env": env, "s3": s3, "events": events, "data_dir": data_dir, "endpoint": moto_server}


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("x.py", "def handler(event, context):\n    return event\n")
    return buffer.getvalue()


def _stored(d, key: str) -> bytes:
    return d["s3"].get_object(Bucket=d["bucket"], Key=key)["Body"].read()


@pytest.mark.parametrize("signals", ["redis", "sns_sqs"])
def test_a_job_runs_end_to_end_through_the_handlers_and_matches_a_local_run(deployment, tmp_path, signals):
    d = deployment
    spec = {**JOB, "data": "datasets/ml", "aws": {"signal_channel": signals}}
    final, rounds = run_job(spec, "job-e2e-1", d["env"])
    assert final["status"] == "max_epochs"
    assert final["report_key"] == f"s3://{d['bucket']}/jobs/job-e2e-1/report.json"
    assert len(rounds) >= 2 and [r["status"] for r in rounds][-1] == "finished"
    report = json.loads(_stored(d, "jobs/job-e2e-1/report.json"))
    assert report["rounds"] == len(rounds) and report["spec"]["data"] == f"s3://{d['bucket']}/datasets/ml"
    # The same job, run locally with the same seed, ends at the same place.
    local, local_model = run_local(
        parse_spec({**JOB, "data": d["data_dir"], "out": str(tmp_path), "aws": {"signal_channel": signals}}, "test")
    )
    assert report["steps"] == local["steps"]
    assert report["test_metrics"]["rmse"] == pytest.approx(local["test_metrics"]["rmse"], rel=0.01)
    with np.load(__import__("io").BytesIO(_stored(d, "jobs/job-e2e-1/model.npz"))) as model:
        assert all(np.allclose(model[k], local_model[k], rtol=1e-4, atol=1e-5) for k in local_model)
    # Every round left its supervisor's metrics (EMF) in the function's output, by job id.
    emf = [
        json.loads(line)
        for r in rounds
        for line in r["invocations"][0].output.splitlines()
        if line.startswith("{") and '"_aws"' in line
    ]
    assert emf and all(m["JobId"] == "job-e2e-1" and "service" not in m for m in emf)
    assert {"Loss", "ActiveWorkers", "BytesExchanged", "CostUsd"} <= {
        metric["Name"] for m in emf for metric in m["_aws"]["CloudWatchMetrics"][0]["Metrics"]
    }
    assert emf[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Ebb"
    progress = json.loads(_stored(d, "jobs/job-e2e-1/progress.json"))
    assert progress["state"] == "finished" and progress["step"] == report["steps"] - 1
    # Every log line of a worker names its job, worker and round.
    worker_logs = [
        json.loads(line)
        for line in rounds[0]["invocations"][1].output.splitlines()
        if line.startswith("{") and '"level"' in line
    ]
    assert worker_logs and all(
        line["job_id"] == "job-e2e-1" and line["worker"] == 0 and line["round"] == 0 for line in worker_logs
    )
    events = d["events"]()
    assert [e["event"] for e in events] == ["job.finished"]
    # The AUTH token was used by every worker and supervisor, and shows nowhere: no log line,
    # result, report, event, progress or stored spec.
    seen = [c.output for r in rounds for c in r["invocations"]] + [json.dumps(final), json.dumps(events)]
    seen += [_stored(d, f"jobs/job-e2e-1/{k}").decode() for k in ("report.json", "progress.json", "spec.json")]
    assert all(TOKEN not in text for text in seen)


def test_validate_names_the_bad_field_and_the_prepare_state_prepares(deployment, tmp_path):
    d = deployment
    with pytest.raises(LambdaError) as bad:
        invoke("validate", {"spec": {**JOB, "data": "datasets/ml", "workers": 0}, "execution": "bad-1"}, d["env"])
    assert bad.value.error_type == "JobSpecError"
    assert bad.value.message.startswith("execution input: workers: Input should be greater than or equal to 1")
    with pytest.raises(LambdaError, match="workers: 5 is more than this deployment's 4"):
        invoke("validate", {"spec": {**JOB, "data": "datasets/ml", "workers": 5}, "execution": "bad-2"}, d["env"])
    grow = {"policy": "schedule", "schedule": [{"epoch": 1, "workers": 3}]}
    with pytest.raises(LambdaError, match="scaling.schedule: 3 workers is more than the 2 the job starts with"):
        invoke("validate", {"spec": {**JOB, "data": "datasets/ml", "scaling": grow}, "execution": "bad-3"}, d["env"])
    bucket = f"s3://{d['bucket']}"
    for spec, message in (
        # Locations the functions cannot reach: the field and the prefix allowed.
        (
            {"out": "runs/x"},
            f"out: runs/x is outside what this stack may write; a job's outputs go under {bucket}/jobs/ ",
        ),
        ({"out": "s3://elsewhere/jobs/x"}, "out: s3://elsewhere/jobs/x is outside what this stack may write"),
        (
            {"data": "s3://elsewhere/ml"},
            f"data: s3://elsewhere/ml is outside this stack's bucket; the functions may read only {bucket}/",
        ),
        # 2-step rounds to 1,000 epochs of 2 workers: more rounds than an execution's history holds.
        (
            {"round_steps": 2, "stop": {"max_epochs": 1000}},
            "round_steps: this job may run 5508 rounds of 2 workers, about 220,360 events in its execution's history, "
            "past the 25,000 a Step Functions execution holds",
        ),
    ):
        with pytest.raises(LambdaError) as refused:
            invoke("validate", {"spec": {**JOB, "data": "datasets/ml", **spec}, "execution": "bad-4"}, d["env"])
        assert refused.value.error_type == "JobSpecError" and refused.value.message.startswith(message), (
            refused.value.message
        )
    # Another function of the account reserves 998 of its 1,000 concurrent executions: a round of
    # 2 workers and the supervisor cannot run at once.
    lam, iam = server_client(d["endpoint"], "lambda"), server_client(d["endpoint"], "iam")
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    }
    role = iam.create_role(RoleName=f"{d['bucket']}-hog", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    hog = lam.create_function(
        FunctionName=f"{d['bucket']}-hog",
        Runtime="python3.12",
        Handler="x.handler",
        Role=role,
        Code={"ZipFile": _zip()},
    )["FunctionName"]
    try:
        lam.put_function_concurrency(FunctionName=hog, ReservedConcurrentExecutions=998)
        with pytest.raises(LambdaError) as refused:
            invoke("validate", {"spec": {**JOB, "data": "datasets/ml"}, "execution": "bad-5"}, d["env"])
        assert refused.value.message == (
            "workers: a round runs 2 workers and the supervisor at once, 3 concurrent Lambda invocations from the "
            "unreserved pool, but this account's in us-east-1 holds 2 (of 1000): request a higher 'Concurrent "
            "executions' quota for AWS Lambda in Service Quotas (README, 'Quotas'), or run at most 1 workers"
        )
    finally:
        lam.delete_function(FunctionName=hog)
    # The job is priced with what the deployment runs it on, not with the spec's aws: section.
    state = invoke(
        "validate",
        {
            "spec": {
                **JOB,
                "data": "datasets/ml",
                "out": "jobs/mine",
                "aws": {"memory_mb": 512, "supervisor_memory_mb": 128},
            },
            "execution": "priced-1",
        },
        d["env"],
    )
    stored = json.loads(_stored(d, state["spec_key"]))
    assert stored["out"] == f"{bucket}/jobs/mine"
    assert {k: stored["aws"][k] for k in ("memory_mb", "supervisor_memory_mb", "arch", "cache_node_type")} == {
        "memory_mb": 2048,
        "supervisor_memory_mb": 1536,
        "arch": "arm64",
        "cache_node_type": "cache.t4g.small",
    }
    # A job with a prepare section and no prepared data yet: Validate says so, Prepare does it.
    from ebb.data.synth import synth_ratings

    synth_ratings(tmp_path / "raw.csv", users=150, items=100, ratings=3000, rank=3, noise=0.3, seed=2)
    d["s3"].put_object(Bucket=d["bucket"], Key="raw/r.csv", Body=(tmp_path / "raw.csv").read_bytes())
    spec = {
        **JOB,
        "data": "datasets/fresh",
        "prepare": {"format": "movielens", "input": "raw/r.csv", "batch_size": 500},
    }
    state = invoke("validate", {"spec": spec, "execution": "prep-1"}, d["env"])
    assert state["prepare"] is True and state["workers"] == [0, 1]
    prepared = invoke("prepare", {"job_id": state["job_id"], "spec_key": state["spec_key"]}, d["env"])
    assert prepared["train_rows"] + prepared["val_rows"] + prepared["test_rows"] == 3000
    assert prepared["val_rows"] == 300 and prepared["train_parts"] >= 5
    manifest = json.loads(_stored(d, "datasets/fresh/manifest.json"))
    assert manifest["source"]["input"] == f"s3://{d['bucket']}/raw/r.csv"


def test_a_failed_worker_ends_in_a_failed_report_that_says_why(deployment):
    d = deployment
    # A corrupt training part: the worker that reads it fails its invocation.
    d["s3"].put_object(
        Bucket=d["bucket"], Key="datasets/broken/manifest.json", Body=_stored(d, "datasets/ml/manifest.json")
    )
    for key in [o["Key"] for o in d["s3"].list_objects_v2(Bucket=d["bucket"], Prefix="datasets/ml/")["Contents"]]:
        body = b"corrupt" if key.endswith("train/part-000003") else _stored(d, key)
        d["s3"].put_object(Bucket=d["bucket"], Key=key.replace("/ml/", "/broken/"), Body=body)
    with pytest.raises(LambdaError) as failed:
        run_job({**JOB, "data": "datasets/broken", "round_steps": None}, "job-broken-1", d["env"], timeout_s=125)
    assert "does not match its checksum" in failed.value.message
    # The state machine's Catch hands this to on_failure (docs/AWS.md).
    cause = json.dumps({k: failed.value.payload[k] for k in ("errorType", "errorMessage")})
    result = invoke(
        "on_failure",
        {
            "job_id": "job-broken-1",
            "spec_key": "jobs/job-broken-1/spec.json",
            "failed_state": "Round",
            "error": {"Error": failed.value.error_type, "Cause": cause},
        },
        d["env"],
    )
    report = json.loads(_stored(d, "jobs/job-broken-1/report.json"))
    assert result["report_key"] == f"s3://{d['bucket']}/jobs/job-broken-1/report.json"
    assert report["status"] == "failed" and report["failed_state"] == "Round"
    assert report["error"].startswith("Round failed: EngineError: ") and "checksum" in report["error"]
    assert report["spec"]["data"] == f"s3://{d['bucket']}/datasets/broken"
    events = d["events"]()
    assert [e["event"] for e in events] == ["job.failed"] and events[0]["error"] == report["error"]
