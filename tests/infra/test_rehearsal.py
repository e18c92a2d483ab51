"""The rehearsal: the synthesised stack, created by moto's CloudFormation with IAM enforced, runs
jobs through its own state machine with the real handlers, each under its own role
(tests/infra/moto_stack.py). What AWS would refuse, moto refuses here: a handler that needs a
grant its role lacks fails the job, and every refusal is recorded, so a swallowed one fails
the test too.

`EBB_REHEARSAL_TEMPLATE=PATH` rehearses the template at PATH instead of a fresh synthesis (a
template with one grant removed fails it: tests/infra/test_rehearsal_grants.py does that for two).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ebb.cli import main
from ebb.data.synth import synth_ratings
from ebb.engine.striping import PartSequence, position_of
from ebb.ports import deployment as names
from ebb.predict.run import predict_file, recommend_users
from ebb.stores.local import FolderObjectStore
from tests.helpers.infra import ROOT
from tests.helpers.moto_stack import STAND_INS, stack_in_moto

JOB = {
    "model": "pmf",
    "workers": 2,
    "seed": 3,
    "hyper": {"rank": 4},
    "scaling": {"policy": "none"},
    "sync": {"mode": "isp"},
    "round_steps": 2,
}
STEPS = 4  # two rounds of two steps: the fewest that show a round handing over to the next
EXECUTION_DEADLINE_S = 240  # a hung execution fails the test with its history, not the CI job
START_DEADLINE_S = 180  # a job that never starts training fails here (generous: CI runs the layers side by side)
# After an execution fails, every invocation of its job has returned within this (docs/AWS.md "Abort").
ORPHAN_DEADLINE_S = 20
# (pause_after_steps: Validate's, carried from round to round; 0, the job never pauses;
# packed and pack: a trial pack's, false and null for a job of its own)
FINISHED_OUTPUT = {
    "job_id",
    "spec_key",
    "packed",
    "pack",
    "status",
    "round",
    "workers",
    "steps",
    "stop_reason",
    "pause_after_steps",
    "report",
}


def rehearsal_template(default) -> dict:
    """EBB_REHEARSAL_TEMPLATE's template, else the session's default synthesis."""
    path = os.environ.get("EBB_REHEARSAL_TEMPLATE")
    return json.loads(Path(path).read_text()) if path else default.template


@pytest.fixture(scope="module")
def raw_ratings(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("raw") / "ratings.csv"
    synth_ratings(path, users=150, items=100, ratings=3000, rank=3, noise=0.3, seed=2)
    return path


@contextlib.contextmanager
def stood_up(template: dict, folder: Path, prepared: str | None):
    """The stack in moto with IAM enforced, a prepared dataset in its bucket under datasets/ml
    (uploaded by the administrator, as `ebb submit` would) and a queue subscribed to its events
    topic (as a user would)."""
    with stack_in_moto(template, folder) as running:
        stack = running.stack
        bucket = stack.output(names.BUCKET_OUTPUT)
        s3, sqs = stack.client("s3"), stack.client("sqs")
        if prepared:
            store = FolderObjectStore(prepared)
            for key in store.list():
                s3.put_object(Bucket=bucket, Key=f"datasets/ml/{key}", Body=store.get(key))
        events = sqs.create_queue(QueueName="job-events")["QueueUrl"]
        events_arn = sqs.get_queue_attributes(QueueUrl=events, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        stack.client("sns").subscribe(
            TopicArn=stack.output(names.EVENTS_TOPIC_OUTPUT),
            Protocol="sqs",
            Endpoint=events_arn,
            Attributes={"RawMessageDelivery": "true"},
        )
        yield SimpleNamespace(
            stack=stack,
            runtime=running.runtime,
            running=running,
            bucket=bucket,
            s3=s3,
            sqs=sqs,
            sfn=stack.client("stepfunctions"),
            events_queue=events,
            events=[],
            token=stack.cache_token,
        )


@pytest.fixture(scope="module")
def aws(default, small_ratings, tmp_path_factory):
    with stood_up(rehearsal_template(default), tmp_path_factory.mktemp("cache"), small_ratings[0]) as aws:
        yield aws


def _start(aws, name: str, spec: dict) -> str:
    return aws.sfn.start_execution(
        stateMachineArn=aws.stack.output(names.STATE_MACHINE_OUTPUT), name=name, input=json.dumps(spec)
    )["executionArn"]


def _wait(aws, arn: str) -> dict:
    """Wait for an execution to end; returns describe_execution plus its history."""
    deadline = time.monotonic() + EXECUTION_DEADLINE_S
    while (described := aws.sfn.describe_execution(executionArn=arn))["status"] == "RUNNING":
        if time.monotonic() > deadline:
            aws.runtime.stop_all()
            outputs = "\n".join(f"--- {c.function} {c.event}\n{c.output[-1500:]}" for c in aws.runtime.calls)
            pytest.fail(f"{arn} still RUNNING after {EXECUTION_DEADLINE_S} s; the handlers said:\n{outputs}")
        time.sleep(0.25)
    history = aws.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    return {**described, "history": history}


def _run(aws, name: str, spec: dict) -> dict:
    return _wait(aws, _start(aws, name, spec))


def _entered(history: list[dict]) -> list[str]:
    return [e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e]


def _events(aws, job: str) -> list[dict]:
    """The events published about `job` (the queue holds every job's: those read are kept)."""
    while got := aws.sqs.receive_message(QueueUrl=aws.events_queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
        "Messages", []
    ):
        aws.events += [json.loads(m["Body"]) for m in got]
        aws.sqs.delete_message_batch(
            QueueUrl=aws.events_queue,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
        )
    return [e for e in aws.events if e.get("job_id") == job]


def _stored(aws, key: str) -> bytes:
    return aws.s3.get_object(Bucket=aws.bucket, Key=key)["Body"].read()


def _of_job(calls, job: str):
    return [c for c in calls if c.event.get("job_id", c.event.get("execution")) == job]


def _train_parts(aws, data: str) -> list[str]:
    return [p["key"] for p in json.loads(_stored(aws, f"{data}/manifest.json"))["train"]["parts"]]


def _stop_once_training(aws, arn: str, job: str) -> None:
    """Stop execution ``arn`` once ``job`` has trained 3 steps, hand the status change to the
    stopped-execution rule's target (OnFailure) as AWS does at once, and wait for every
    invocation of the job to return."""
    deadline = time.monotonic() + START_DEADLINE_S
    while not (progress := _progress(aws, job)) or progress.get("step", 0) < 3:
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.2)
    aws.sfn.stop_execution(executionArn=arn)
    for delivery in aws.running.execution_status_changed(arn, "ABORTED"):
        delivery.join(timeout=60)
    _all_return(aws, job)


def _all_return(aws, job: str) -> float:
    """Seconds until every invocation of `job` has returned (none is stopped for it); fails past
    ORPHAN_DEADLINE_S."""
    started = time.monotonic()
    while running := [c for c in _of_job(aws.runtime.running(), job)]:
        if time.monotonic() - started > ORPHAN_DEADLINE_S:
            pytest.fail(
                f"{[(c.function, c.event) for c in running]} still ran {ORPHAN_DEADLINE_S} s after the execution failed"
            )
        time.sleep(0.2)
    return time.monotonic() - started


def test_two_worker_jobs_run_two_rounds_to_succeeded_with_and_without_out(aws, raw_ratings):
    """One job on an uploaded dataset, its outputs where Validate puts them; one whose dataset
    the Prepare state makes from a raw file, its outputs where its `out` says. At once."""
    plain, prepared = "rehearse-ok-1", "rehearse-prep-1"
    # Every step the two workers take two parts: stop when STEPS steps have covered theirs.
    epochs = STEPS * JOB["workers"] / len(_train_parts(aws, "datasets/ml"))
    aws.s3.put_object(Bucket=aws.bucket, Key="raw/ratings.csv", Body=raw_ratings.read_bytes())
    out = "jobs/rehearsal/prepared"
    arns = {
        plain: _start(aws, plain, {**JOB, "data": "datasets/ml", "stop": {"max_epochs": epochs}}),
        prepared: _start(
            aws,
            prepared,
            {
                **JOB,
                "data": "datasets/from-raw",
                "out": out,
                "stop": {"max_epochs": 1.6},
                "prepare": {"format": "movielens", "input": "raw/ratings.csv", "batch_size": 500},
            },
        ),
    }
    runs = {job: _wait(aws, arn) for job, arn in arns.items()}

    for job, out_key in ((plain, f"jobs/{plain}"), (prepared, out)):
        run = runs[job]
        assert run["status"] == "SUCCEEDED", (job, run.get("cause"))
        output = json.loads(run["output"])
        assert set(output) == FINISHED_OUTPUT and output["status"] == "finished"
        assert output["report"] == {
            "status": "max_epochs",
            "report_key": f"s3://{aws.bucket}/{out_key}/report.json",
            "model_key": f"s3://{aws.bucket}/{out_key}/model.npz",
        }
        report = json.loads(_stored(aws, f"{out_key}/report.json"))
        assert report["rounds"] >= 2 and report["steps"] == output["steps"]
        for key in ("model.npz", "loss.png"):
            assert _stored(aws, f"{out_key}/{key}"), key
        progress = json.loads(_stored(aws, f"{out_key}/progress.json"))
        assert progress["state"] == "finished" and progress["step"] == report["steps"] - 1
        assert [e["event"] for e in _events(aws, job)] == [names.JOB_FINISHED]
        # Priced with the deployed functions (cdk.json), not the spec's aws: defaults.
        assert (report["spec"]["aws"]["memory_mb"], report["spec"]["aws"]["supervisor_memory_mb"]) == (1769, 1024)
    assert json.loads(_stored(aws, f"jobs/{plain}/report.json"))["steps"] == STEPS
    entered = _entered(runs[prepared]["history"])
    assert entered[:3] == ["Validate", "Prepare?", "Prepare"] and entered[-3:] == [
        "Finalize",
        names.IN_PACK_STATE,
        "Done",
    ]
    manifest = json.loads(_stored(aws, "datasets/from-raw/manifest.json"))
    assert manifest["source"]["input"] == f"s3://{aws.bucket}/raw/ratings.csv"

    # The rounds ran as the definition says: Round twice, each a supervisor and both workers
    # of that round, started together (the Map and Parallel branches run at once).
    entered = _entered(runs[plain]["history"])
    assert entered.count("Round") == 2 and entered[-3:] == ["Finalize", names.IN_PACK_STATE, "Done"]
    supervisors = _of_job(aws.runtime.of("supervisor"), plain)
    workers = _of_job(aws.runtime.of("worker"), plain)
    assert [c.event["round"] for c in supervisors] == [0, 1]
    assert sorted((c.event["round"], c.event["worker"]) for c in workers) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for round_ in (0, 1):
        calls = [c for c in supervisors + workers if c.event["round"] == round_]
        assert max(c.started for c in calls) < min(c.ended for c in calls), f"round {round_} ran in turns"
    # Every call was one its role allows; the AUTH token went from Secrets Manager to the functions only.
    assert aws.stack.denied == []
    for job in runs:
        assert aws.token not in json.dumps(runs[job], default=str)
        assert all(aws.token not in c.output for c in _of_job(aws.runtime.calls, job))


def test_a_worker_that_raises_ends_in_on_failure_a_failed_report_and_event(aws):
    job = "rehearse-broken-1"
    # Keep the manifest, spoil the part worker 1 trains on first: it raises at step 0.
    parts = _train_parts(aws, "datasets/ml")
    spoiled = parts[PartSequence(len(parts), JOB["seed"]).part_at(position_of(0, [0, 1], 1))]
    listed = aws.s3.list_objects_v2(Bucket=aws.bucket, Prefix="datasets/ml/")["Contents"]
    for key in (o["Key"].removeprefix("datasets/ml/") for o in listed):
        body = b"spoiled" if key == spoiled else _stored(aws, f"datasets/ml/{key}")
        aws.s3.put_object(Bucket=aws.bucket, Key=f"datasets/broken/{key}", Body=body)

    run = _run(
        aws, job, {**JOB, "data": "datasets/broken", "stop": {"max_epochs": 1}, "faults": {"worker_timeout_s": 2}}
    )
    assert run["status"] == "FAILED"
    assert run["error"] == "EngineError" and "does not match its checksum" in run["cause"]
    assert _entered(run["history"])[-3:] == ["RoundFailed", "OnFailure", "JobFailed"]
    _all_return(aws, job)  # the supervisor gave the round up and told the other worker: nobody is killed
    errors = {c.event["worker"]: c.error for c in _of_job(aws.runtime.of("worker"), job) if c.error}
    assert errors[1]["errorType"] == "EngineError" and "does not match its checksum" in errors[1]["errorMessage"]
    assert all(worker == 1 or "gave the round up" in e["errorMessage"] for worker, e in errors.items()), errors

    report = json.loads(_stored(aws, f"jobs/{job}/report.json"))
    assert report["status"] == "failed" and report["failed_state"] == "Round"
    # The worker's error, or the supervisor's that quotes it: whichever the Round heard first.
    assert report["error"].startswith("Round failed: EngineError: ")
    assert f"dataset part {spoiled} does not match its checksum in manifest.json" in report["error"]
    assert report["spec"]["data"] == f"s3://{aws.bucket}/datasets/broken"
    assert json.loads(_stored(aws, f"jobs/{job}/progress.json"))["state"] == "failed"
    events = _events(aws, job)
    assert [e["event"] for e in events] == [names.JOB_FAILED] and events[0]["error"] == report["error"]
    assert events[0]["report"] == f"s3://{aws.bucket}/jobs/{job}/report.json"
    assert aws.stack.denied == []


def test_a_lost_worker_fails_the_job_and_no_invocation_runs_on(aws):
    """A worker killed as Lambda kills one (a timeout, out of memory) fails the round's Map; the
    supervisor, which would go on without it, stops at OnFailure's abort marker and tells the
    other worker to, and the progress stays "failed"."""
    job = "rehearse-lost-1"
    spec = {
        **JOB,
        "data": "datasets/ml",
        "round_steps": None,
        "stop": {"max_epochs": 10_000},
        "faults": {"worker_timeout_s": 2, "on_worker_loss": "evict"},
    }
    arn = _start(aws, job, spec)
    deadline = time.monotonic() + START_DEADLINE_S
    while not (progress := _progress(aws, job)) or progress.get("step", 0) < 3:
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.2)
    (victim,) = [c for c in _of_job(aws.runtime.of("worker"), job) if c.event["worker"] == 1]
    victim.invocation.proc.kill()
    run = _wait(aws, arn)
    assert run["status"] == "FAILED" and run["error"] == "Runtime.ExitError"
    took = _all_return(aws, job)
    (supervisor,) = _of_job(aws.runtime.of("supervisor"), job)
    assert supervisor.error["errorType"] == "JobStopped", supervisor.error
    assert supervisor.error["errorMessage"].startswith("the job was stopped: Round failed: Runtime.ExitError")
    (survivor,) = [c for c in _of_job(aws.runtime.of("worker"), job) if c.event["worker"] == 0]
    # The survivor leaves at the abort marker, or (when the supervisor's last directive reached
    # it first) returns from its round: either way it has returned (_all_return above).
    assert survivor.error is None or "gave the round up (the job was stopped" in survivor.error["errorMessage"], (
        survivor.error
    )
    time.sleep(1)  # nothing writes after the invocations have returned
    assert _progress(aws, job)["state"] == "failed", (took, _progress(aws, job))
    assert json.loads(_stored(aws, f"jobs/{job}/abort.json"))["reason"].startswith("Round failed: Runtime.ExitError")
    assert aws.stack.denied == []


def test_a_stopped_execution_stops_its_invocations(aws):
    """Stopped by hand (or timed out), an execution runs no Catch: the rule on its status change
    hands it to OnFailure, whose marker stops the round's supervisor and workers."""
    job = "rehearse-stopped-1"
    arn = _start(
        aws,
        job,
        {
            **JOB,
            "data": "datasets/ml",
            "round_steps": None,
            "stop": {"max_epochs": 10_000},
            "faults": {"worker_timeout_s": 2},
        },
    )
    _stop_once_training(aws, arn, job)
    (handed,) = [c for c in _of_job(aws.runtime.of("on_failure"), job) if c.event["failed_state"] == "Execution"]
    assert handed.result == {"status": "failed", "report_key": f"s3://{aws.bucket}/jobs/{job}/report.json"}
    (supervisor,) = _of_job(aws.runtime.of("supervisor"), job)
    stopped = "Execution failed: ABORTED: the execution ended before its job did (stopped by hand, or past its timeout)"
    assert supervisor.error["errorMessage"] == f"the job was stopped: {stopped}", supervisor.error
    assert _progress(aws, job)["state"] == "failed"
    assert [e["error"] for e in _events(aws, job)][0] == stopped
    # (moto's executor does not stop an execution at once: it goes on to the Round's Catch once
    # the task it waits on returns, where AWS ends it ABORTED. Nothing above depends on that.)
    _wait(aws, arn)
    assert aws.stack.denied == []


def _progress(aws, job: str) -> dict | None:
    try:
        return json.loads(_stored(aws, f"jobs/{job}/progress.json"))
    except aws.s3.exceptions.NoSuchKey:
        return None


def test_a_bad_spec_fails_in_validate_with_the_field_named(aws):
    run = _run(aws, "rehearse-bad-1", {**JOB, "data": "datasets/ml", "workers": 0})
    assert run["status"] == "FAILED" and run["error"] == "JobSpecError"
    message = "execution input: workers: Input should be greater than or equal to 1"
    assert json.loads(run["cause"])["errorMessage"].startswith(message)
    assert _entered(run["history"]) == ["Validate", "ValidateFailed", "OnFailure", "JobFailed"]
    # No job was started, so no report; the event says why.
    (failed,) = _events(aws, "(not started)")
    assert failed["event"] == names.JOB_FAILED
    assert failed["error"].startswith(f"Validate failed: JobSpecError: {message}")
    assert failed["report"] is None


def test_validate_refuses_a_round_the_account_cannot_run_at_once(aws, monkeypatch):
    monkeypatch.setenv("MOTO_LAMBDA_CONCURRENCY_QUOTA", "2")  # a new account's quota can be this low
    run = _run(aws, "rehearse-quota-1", {**JOB, "data": "datasets/ml"})
    assert run["status"] == "FAILED" and run["error"] == "JobSpecError"
    assert json.loads(run["cause"])["errorMessage"].startswith(
        "workers: a round runs 2 workers and the supervisor at once, 3 concurrent Lambda invocations"
    )
    assert aws.stack.denied == []


def test_a_raw_file_with_a_bad_row_fails_in_prepare_naming_the_line(aws):
    job = "rehearse-badraw-1"
    aws.s3.put_object(
        Bucket=aws.bucket, Key="raw/bad.csv", Body=b"userId,movieId,rating,timestamp\n1,2,3.5,10\n1,x,4,11\n"
    )
    spec = {**JOB, "data": "datasets/bad-raw", "prepare": {"format": "movielens", "input": "raw/bad.csv"}}
    run = _run(aws, job, spec)
    assert run["status"] == "FAILED"
    assert _entered(run["history"]) == ["Validate", "Prepare?", "Prepare", "PrepareFailed", "OnFailure", "JobFailed"]
    (prepare,) = _of_job(aws.runtime.of("prepare"), job)
    assert prepare.event == {"job_id": job, "spec_key": f"jobs/{job}/spec.json", "packed": False}  # not a pack's job
    report = json.loads(_stored(aws, f"jobs/{job}/report.json"))
    assert report["status"] == "failed" and report["failed_state"] == "Prepare"
    assert f"s3://{aws.bucket}/raw/bad.csv:3: " in report["error"]
    assert [e["event"] for e in _events(aws, job)] == [names.JOB_FAILED]
    assert aws.stack.denied == []


# -- scripts/rehearse.sh: the same stack, used through the ebb command --------------------------
def test_rehearse_sh_creates_the_stack_and_runs_a_job_as_a_user_would(default):
    template = default.outdir / "Ebb.template.json"
    done = subprocess.run(
        ["bash", "scripts/rehearse.sh", "--template", str(template)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    created = re.search(
        r"stack Ebb: CREATE_COMPLETE in moto's CloudFormation at http://127\.0\.0\.1:\d+: (\d+) "
        r"resources created, (\d+) stood in for; IAM enforced",
        out,
    )
    assert created and sum(map(int, created.groups())) == len(default.resources), out[:2000]
    # Each type moto cannot create is named, with what stands in for it.
    present = {r["Type"] for r in default.resources.values()} & set(STAND_INS)
    assert present and all(f"{t}: moto cannot create it; in its place: {STAND_INS[t]}" in out for t in present)
    watched = out[out.index("==> ebb watch") : out.index("==> ebb report")]
    assert re.search(r"succeeded +round 0 +step 3", watched), watched
    assert re.search(r"max_epochs: 4 steps, .*; test rmse \d\.\d{4}; est\. AWS cost \$", out), out
    assert "0 requests refused by IAM" in out and out.rstrip().endswith("its report is above")

    missing = subprocess.run(
        ["bash", "scripts/rehearse.sh", "--template", str(template) + ".missing"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "no such file" in missing.stderr


# -- the Predict state machine (docs/AWS.md "Predicting"), on the same stack ---------------
# The predict handler under its own role, 4 shards; the joined output is byte for byte the
# local run's, and so are the metrics.

SHARDS = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small PMF run, and a test file of rows it can score (one of a user it never saw)."""
    tmp = tmp_path_factory.mktemp("predict")
    rng = np.random.default_rng(5)
    U, V = rng.normal(0, 1, (80, 2)), rng.normal(0, 1, (60, 2))
    rows = [(u + 1, i + 1, round(3 + U[u] @ V[i] + rng.normal(0, 0.3), 3), 0)
            for u in range(80) for i in rng.choice(60, 25, replace=False)]  # fmt: skip
    (tmp / "train.tsv").write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))
    test = [f"{u}\t{i}\t{r}\t0\n" for u, i, r, _ in rows[::7]] + ["999\t3\t4.0\t0\n"]
    (tmp / "test.tsv").write_text("".join(test))
    assert main(["prepare", "--format", "movielens", "--input", str(tmp / "train.tsv"), "--out", str(tmp / "d")]) == 0
    assert main(["train", "--model", "pmf", "--data", str(tmp / "d"), "--out", str(tmp / "run"), "--workers", "1",
                 "--set", "hyper.rank=2", "--set", "stop.max_epochs=5"]) == 0  # fmt: skip
    return tmp


def _request(aws, run: str, **fields) -> dict:
    base = {"run": run, "model": f"s3://{aws.bucket}/models/pmf", "input": None, "shards": SHARDS,
            "with_labels": False, "skip_bad_rows": False, "recommend": None, "users": "all",
            "exclude_seen": True}  # fmt: skip
    return {**base, **fields}


def _joined(aws, manifest: dict) -> bytes:
    return b"".join(aws.s3.get_object(Bucket=aws.bucket, Key=s["key"])["Body"].read() for s in manifest["shards"])


def test_predict_runs_in_four_shards_and_writes_what_a_local_run_writes(aws, trained):
    for key in ("model.json", "model.npz", "id_map.npz", "seen.npz"):
        aws.s3.put_object(Bucket=aws.bucket, Key=f"models/pmf/{key}", Body=(trained / "run" / key).read_bytes())
    aws.s3.put_object(Bucket=aws.bucket, Key="raw/test.tsv", Body=(trained / "test.tsv").read_bytes())
    machine = aws.stack.output(names.PREDICT_STATE_MACHINE_OUTPUT)
    runs = {
        "score": _request(aws, "p-score", input=f"s3://{aws.bucket}/raw/test.tsv"),
        "recommend": _request(aws, "p-rec", recommend=5),
    }
    arns = {k: aws.sfn.start_execution(stateMachineArn=machine, name=r["run"], input=json.dumps(r))["executionArn"]
            for k, r in runs.items()}  # fmt: skip
    done = {k: _wait(aws, arn) for k, arn in arns.items()}
    manifests = {}
    for k, run in done.items():
        assert run["status"] == "SUCCEEDED", (k, run.get("cause"))
        assert _entered(run["history"])[:2] == [names.PLAN_STATE, names.SHARDS_STATE]
        key = json.loads(run["output"])["manifest"]["manifest_key"]
        assert key == f"predictions/{runs[k]['run']}/manifest.json"
        manifests[k] = json.loads(aws.s3.get_object(Bucket=aws.bucket, Key=key)["Body"].read())
        assert len(manifests[k]["shards"]) == SHARDS
        shards = [c for c in aws.runtime.of("predict") if c.event.get("run") == runs[k]["run"]]
        assert sorted(c.event["index"] for c in shards if c.event["action"] == "shard") == list(range(SHARDS))

    local = predict_file(str(trained / "run"), trained / "test.tsv", trained / "local.csv")
    assert _joined(aws, manifests["score"]) == (trained / "local.csv").read_bytes()
    assert manifests["score"]["metrics"] == local["metrics"] and manifests["score"]["rows"] == local["rows"]
    assert manifests["score"]["unknown"]["users"] == 1
    cost = manifests["score"]["cost"]
    assert cost["total_usd"] > 0 and cost["usd_per_million_rows"] == pytest.approx(
        cost["total_usd"] / local["rows"] * 1e6
    )

    recommend_users(str(trained / "run"), None, 5, trained / "local-top.csv")
    assert _joined(aws, manifests["recommend"]) == (trained / "local-top.csv").read_bytes()
    # Every call was one its role allows: the predict function's and the Predict machine's.
    assert aws.stack.denied == []


def test_ebb_predict_stack_uploads_a_local_model_and_input_and_joins_the_shards(aws, trained, monkeypatch, capsys):
    for key, value in aws.stack.user_env({}).items():
        monkeypatch.setenv(key, value)
    out = trained / "via-stack.csv"
    argv = ["predict", "--stack", "Ebb", "--model", str(trained / "run"), "--input", str(trained / "test.tsv"),
            "--out", str(out), "--shards", "3"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    local = predict_file(str(trained / "run"), trained / "test.tsv", trained / "local2.csv")
    assert out.read_bytes() == (trained / "local2.csv").read_bytes()
    assert "in 3 shards" in printed and "per million rows" in printed and json.dumps(local["metrics"]) in printed
    assert aws.stack.denied == []
