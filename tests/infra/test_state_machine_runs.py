"""The synthesised state machine itself runs a job: its definition, read from the template
and resolved into moto's resources, executed by moto's Step Functions executor, each Lambda
invocation running the real handler in its own process (tests/infra/moto_stack.py).

Everything runs on a moto server in this process (the executor calls Lambda at
localhost:$MOTO_PORT), a TLS redis-server with the AUTH token from Secrets Manager stands in
for ElastiCache, and the Map's and Parallel's threads start the supervisor and the workers of
a round at once, so they really meet at their barriers.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from moto_stack import stack_in_moto

from ebb.engine.striping import PartSequence, position_of
from ebb.stores.local import FolderObjectStore

JOB = {"model": "pmf", "workers": 2, "seed": 3, "hyper": {"rank": 4}, "scaling": {"policy": "none"},
       "sync": {"mode": "isp"}, "round_steps": 2}
STEPS = 4  # two rounds of two steps: the fewest that show a round handing over to the next
EXECUTION_DEADLINE_S = 240  # a hung execution fails the test with its history, not the CI job
FINISHED_OUTPUT = {"job_id", "spec_key", "status", "round", "workers", "steps", "stop_reason", "report"}


@pytest.fixture(scope="module")
def aws(default, small_ratings, tmp_path_factory):
    """The default stack in moto, its functions run by the real handlers, a prepared dataset in
    its bucket under datasets/ml, and a queue subscribed to its events topic (as a user would)."""
    with stack_in_moto(default.template, tmp_path_factory.mktemp("cache")) as running:
        stack = running.stack
        bucket = stack.output("DataBucketName")
        s3, sqs = stack.client("s3"), stack.client("sqs")
        prepared = FolderObjectStore(small_ratings[0])
        for key in prepared.list():
            s3.put_object(Bucket=bucket, Key=f"datasets/ml/{key}", Body=prepared.get(key))
        events = sqs.create_queue(QueueName="job-events")["QueueUrl"]
        events_arn = sqs.get_queue_attributes(QueueUrl=events, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        stack.client("sns").subscribe(TopicArn=stack.output("EventsTopicArn"), Protocol="sqs", Endpoint=events_arn,
                                      Attributes={"RawMessageDelivery": "true"})
        yield SimpleNamespace(stack=stack, runtime=running.runtime, bucket=bucket, s3=s3, sqs=sqs,
                              sfn=stack.client("stepfunctions"), events_queue=events, token=stack.cache_token)


def _run(aws, name: str, spec: dict) -> dict:
    """Start an execution of the stack's state machine and wait for it to end; returns
    describe_execution plus its history."""
    arn = aws.sfn.start_execution(stateMachineArn=aws.stack.output("StateMachineArn"), name=name,
                                  input=json.dumps(spec))["executionArn"]
    deadline = time.monotonic() + EXECUTION_DEADLINE_S
    while (described := aws.sfn.describe_execution(executionArn=arn))["status"] == "RUNNING":
        if time.monotonic() > deadline:
            aws.runtime.stop_all()
            outputs = "\n".join(f"--- {c.function} {c.event}\n{c.output[-1500:]}" for c in aws.runtime.calls)
            pytest.fail(f"{name} still RUNNING after {EXECUTION_DEADLINE_S} s; the handlers said:\n{outputs}")
        time.sleep(0.25)
    history = aws.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    return {**described, "history": history}


def _entered(history: list[dict]) -> list[str]:
    return [e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e]


def _events(aws, job: str) -> list[dict]:
    got = aws.sqs.receive_message(QueueUrl=aws.events_queue, MaxNumberOfMessages=10,
                                  WaitTimeSeconds=1).get("Messages", [])
    return [body for m in got if (body := json.loads(m["Body"])).get("job_id") == job]


def _stored(aws, key: str) -> bytes:
    return aws.s3.get_object(Bucket=aws.bucket, Key=key)["Body"].read()


def _of_job(calls, job: str):
    return [c for c in calls if c.event.get("job_id", c.event.get("execution")) == job]


def _train_parts(aws, data: str) -> list[str]:
    return [p["key"] for p in json.loads(_stored(aws, f"{data}/manifest.json"))["train"]["parts"]]


def test_a_two_worker_job_runs_two_rounds_to_succeeded(aws):
    job = "sfn-ok-1"
    # Every step the two workers take two parts: stop when STEPS steps have covered theirs.
    epochs = STEPS * JOB["workers"] / len(_train_parts(aws, "datasets/ml"))
    run = _run(aws, job, {**JOB, "data": "datasets/ml", "stop": {"max_epochs": epochs}})
    assert run["status"] == "SUCCEEDED", run.get("cause")
    output = json.loads(run["output"])
    assert set(output) == FINISHED_OUTPUT and output["status"] == "finished"
    report_key = f"s3://{aws.bucket}/jobs/{job}/report.json"
    assert output["report"] == {"status": "max_epochs", "report_key": report_key,
                                "model_key": f"s3://{aws.bucket}/jobs/{job}/model.npz"}
    report = json.loads(_stored(aws, f"jobs/{job}/report.json"))
    assert report["rounds"] == 2 and report["steps"] == output["steps"] == STEPS
    for key in ("model.npz", "loss.png"):
        assert _stored(aws, f"jobs/{job}/{key}"), key
    assert [e["event"] for e in _events(aws, job)] == ["job.finished"]

    # The rounds ran as the definition says: Round twice, each a supervisor and both workers
    # of that round, started together (the Map and Parallel branches run at once).
    entered = _entered(run["history"])
    assert entered.count("Round") == 2 and entered[-2:] == ["Finalize", "Done"]
    supervisors = _of_job(aws.runtime.of("supervisor"), job)
    workers = _of_job(aws.runtime.of("worker"), job)
    assert [c.event["round"] for c in supervisors] == [0, 1]
    assert sorted((c.event["round"], c.event["worker"]) for c in workers) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for round_ in (0, 1):
        calls = [c for c in supervisors + workers if c.event["round"] == round_]
        assert max(c.started for c in calls) < min(c.ended for c in calls), f"round {round_} ran in turns"
    # The AUTH token went from Secrets Manager to the functions only.
    assert aws.token not in json.dumps(run, default=str)
    assert all(aws.token not in c.output for c in _of_job(aws.runtime.calls, job))


def test_a_worker_that_raises_ends_in_on_failure_a_failed_report_and_event(aws):
    job = "sfn-broken-1"
    # Keep the manifest, spoil the part worker 1 trains on first: it raises at step 0.
    parts = _train_parts(aws, "datasets/ml")
    spoiled = parts[PartSequence(len(parts), JOB["seed"]).part_at(position_of(0, [0, 1], 1))]
    listed = aws.s3.list_objects_v2(Bucket=aws.bucket, Prefix="datasets/ml/")["Contents"]
    for key in (o["Key"].removeprefix("datasets/ml/") for o in listed):
        body = b"spoiled" if key == spoiled else _stored(aws, f"datasets/ml/{key}")
        aws.s3.put_object(Bucket=aws.bucket, Key=f"datasets/broken/{key}", Body=body)

    run = _run(aws, job, {**JOB, "data": "datasets/broken", "stop": {"max_epochs": 1}})
    aws.runtime.stop_all()  # the round's supervisor, left waiting at its barrier
    assert run["status"] == "FAILED"
    assert run["error"] == "EngineError" and "does not match its checksum" in run["cause"]
    entered = _entered(run["history"])
    assert entered[-3:] == ["RoundFailed", "OnFailure", "JobFailed"]
    errors = {c.event["worker"]: c.error for c in _of_job(aws.runtime.of("worker"), job) if c.error}
    assert errors[1]["errorType"] == "EngineError" and "does not match its checksum" in errors[1]["errorMessage"]
    # Worker 0 may have left when the supervisor gave the round up, or been killed with the
    # branch the Round abandoned (stop_all above; its call records that as it ends): either
    # is an ending, not a second failure of the job.
    for worker, error in errors.items():
        assert worker == 1 or "gave the round up" in error["errorMessage"] or error["errorType"] == \
            "Runtime.ExitError", (worker, error)

    report = json.loads(_stored(aws, f"jobs/{job}/report.json"))
    assert report["status"] == "failed" and report["failed_state"] == "Round"
    # The worker's error, or the supervisor's that quotes it: whichever the Round heard first.
    assert report["error"].startswith("Round failed: EngineError: ")
    assert f"dataset part {spoiled} does not match its checksum in manifest.json" in report["error"]
    assert report["spec"]["data"] == f"s3://{aws.bucket}/datasets/broken"
    events = _events(aws, job)
    assert [e["event"] for e in events] == ["job.failed"] and events[0]["error"] == report["error"]
    assert events[0]["report"] == f"s3://{aws.bucket}/jobs/{job}/report.json"


def test_a_bad_spec_fails_in_validate_with_the_field_named(aws):
    run = _run(aws, "sfn-bad-1", {**JOB, "data": "datasets/ml", "workers": 0})
    assert run["status"] == "FAILED" and run["error"] == "JobSpecError"
    message = "execution input: workers: Input should be greater than or equal to 1"
    assert json.loads(run["cause"])["errorMessage"].startswith(message)
    assert _entered(run["history"]) == ["Validate", "ValidateFailed", "OnFailure", "JobFailed"]
    # No job was started, so no report; the event says why.
    failed, = _events(aws, "(not started)")
    assert failed["event"] == "job.failed" and failed["error"].startswith(f"Validate failed: JobSpecError: {message}")
    assert failed["report"] is None


def test_a_raw_file_with_a_bad_row_fails_in_prepare_naming_the_line(aws):
    job = "sfn-prepare-1"
    aws.s3.put_object(Bucket=aws.bucket, Key="raw/bad.csv",
                      Body=b"userId,movieId,rating,timestamp\n1,2,3.5,10\n1,x,4,11\n")
    spec = {**JOB, "data": "datasets/from-raw", "prepare": {"format": "movielens", "input": "raw/bad.csv"}}
    run = _run(aws, job, spec)
    assert run["status"] == "FAILED"
    assert _entered(run["history"]) == ["Validate", "Prepare?", "Prepare", "PrepareFailed", "OnFailure", "JobFailed"]
    prepare, = _of_job(aws.runtime.of("prepare"), job)
    assert prepare.event == {"job_id": job, "spec_key": f"jobs/{job}/spec.json"}
    report = json.loads(_stored(aws, f"jobs/{job}/report.json"))
    assert report["status"] == "failed" and report["failed_state"] == "Prepare"
    assert f"s3://{aws.bucket}/raw/bad.csv:3: " in report["error"]
    assert [e["event"] for e in _events(aws, job)] == ["job.failed"]
