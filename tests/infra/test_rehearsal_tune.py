"""The rehearsal of pausing, resuming and tuning (docs/AWS.md "Tuning on AWS"): the stack in
moto with IAM enforced, as in test_rehearsal.py; the Tune machine's nested executions of the
training machine signed with the Tune machine's role, every handler under its own.

- A job paused at its `pause_after_steps` ends with its checkpoints and no Finalize; an
  execution of the same job with `resume: true` carries on from them (no round twice).
- A tiny search (3 trials, rungs at 1 and 3 epochs): every trial trains its first rung, the
  best one is promoted and resumed from its checkpoint, and Conclude writes tune.json and best/.
"""

from __future__ import annotations

import json
import re

import pytest

from ebb.cli import main
from ebb.ports import deployment as names
from ebb.stores import aws_clients
from ebb.stores.local import FolderObjectStore
from tests.helpers.data import planted_ratings
from tests.infra.test_rehearsal import (
    JOB,
    _entered,
    _of_job,
    _progress,
    _start,
    _stop_once_training,
    _stored,
    _wait,
    rehearsal_template,
    stood_up,
)


@pytest.fixture(scope="module")
def aws(default, small_ratings, tmp_path_factory):
    """The stack, with datasets/ml (no validation split) and datasets/tune (one: trials are
    compared on it)."""
    with stood_up(rehearsal_template(default), tmp_path_factory.mktemp("cache"), small_ratings[0]) as aws:
        root = tmp_path_factory.mktemp("tune-data")
        data, _ = planted_ratings(root, users=150, items=100, ratings=4000, rank=3, noise=0.3, seed=4, batch_size=500)
        prepared = FolderObjectStore(data)
        for key in prepared.list():
            aws.s3.put_object(Bucket=aws.bucket, Key=f"datasets/tune/{key}", Body=prepared.get(key))
        aws.tune_data = data  # for `ebb tune --stack`, which uploads it
        yield aws


def test_a_paused_job_ends_without_finalize_and_resumes_from_its_checkpoints(aws):
    job = "rehearse-pause-job"
    steps = 2 * JOB["round_steps"]  # two rounds: the first pauses, the second resumes and finishes
    spec = {
        **JOB,
        "name": "rehearse-pause",  # the same job in both executions: its checkpoints carry its name
        "data": "datasets/ml",
        "stop": {"max_epochs": steps * JOB["workers"] / len(_parts(aws, "datasets/ml"))},
    }
    first = _wait(aws, _start(aws, "rehearse-pause-1", {**spec, "job_id": job, "pause_after_steps": 2}))
    assert first["status"] == "SUCCEEDED", first.get("cause")
    assert _entered(first["history"])[-1] == names.PAUSED
    output = json.loads(first["output"])
    assert output == {"job_id": job, "spec_key": f"jobs/{job}/spec.json", "status": "paused", "round": 1,
                      "workers": [0, 1], "steps": 2}  # fmt: skip
    assert not _exists(aws, f"jobs/{job}/report.json")  # no Finalize

    second = _wait(aws, _start(aws, "rehearse-pause-2", {**spec, "job_id": job, "resume": True}))
    assert second["status"] == "SUCCEEDED", second.get("cause")
    entered = _entered(second["history"])
    assert entered[:3] == ["Validate", "Prepare?", "Round"] and entered[-2:] == ["Finalize", "Done"]
    # Round 0 ran once, in the first execution; the second began at round 1.
    assert [c.event["round"] for c in _of_job(aws.runtime.of("supervisor"), job)] == [0, 1]
    validated = [c.result for c in aws.runtime.of("validate") if c.event["execution"].startswith("rehearse-pause-")]
    assert [(v["job_id"], v["round"]) for v in validated] == [(job, 0), (job, 1)]
    report = json.loads(_stored(aws, f"jobs/{job}/report.json"))
    assert report["steps"] == steps and report["rounds"] == 2
    assert aws.stack.denied == []


def test_a_stopped_trial_execution_stops_the_job_its_input_names(aws):
    """A trial's execution is named `<job>-rK`, not after its job: the stopped-execution rule
    hands OnFailure the execution's input, whose job_id is the job to abort and report (as when
    a tune is stopped, and Step Functions stops its nested executions)."""
    job = "rehearse-trial-stop"
    spec = {**JOB, "data": "datasets/ml", "round_steps": None, "stop": {"max_epochs": 10_000},
            "faults": {"worker_timeout_s": 2}, "job_id": job}  # fmt: skip
    arn = _start(aws, f"{job}-r0", spec)
    _stop_once_training(aws, arn, job)
    (handed,) = [c for c in aws.runtime.of("on_failure") if c.event.get("job_id") == f"{job}-r0"]
    assert handed.result == {"status": "failed", "report_key": f"s3://{aws.bucket}/jobs/{job}/report.json"}
    (supervisor,) = _of_job(aws.runtime.of("supervisor"), job)
    assert supervisor.error["errorType"] == "JobStopped", supervisor.error
    assert _progress(aws, job)["state"] == "failed"
    _wait(aws, arn)
    assert aws.stack.denied == []


def test_a_tiny_search_promotes_the_best_trial_and_resumes_it_from_its_checkpoint(aws):
    tune_id = "rehearse-tune-1"
    search = {
        # (from_base off: the base job, always promoted, would be a second promotion)
        "tune": {"trials": 3, "eta": 3, "min_epochs": 1, "max_epochs": 3, "seed": 1, "from_base": False,
                 "space": {"hyper.lr": {"log_uniform": [0.01, 0.1]}}},
        "job": {"model": "pmf", "workers": 1, "seed": 3, "hyper": {"rank": 3}, "data": "datasets/tune",
                "scaling": {"policy": "none"}},
    }  # fmt: skip
    machine = aws.stack.output(names.TUNE_STATE_MACHINE_OUTPUT)
    started = aws.sfn.start_execution(stateMachineArn=machine, name=tune_id, input=json.dumps({"search": search}))
    run = _wait(aws, started["executionArn"])
    assert run["status"] == "SUCCEEDED", run.get("cause")
    entered = _entered(run["history"])
    # Two passes (the first rung of all three, then the promotion), then Ask has nothing more.
    assert entered.count(names.TRIALS_STATE) == 2 and entered[-2:] == [names.CONCLUDE_STATE, "Tuned"]

    result = json.loads(_stored(aws, f"tunes/{tune_id}/tune.json"))
    assert len(result["trials"]) == 3 and result["rungs"] == [1, 3]
    promoted = [x for x in result["launches"] if x["rung"] == 1]
    assert len(promoted) == 1 and promoted[0]["from_epochs"] == 1
    best = result["best"]["trial"]
    assert best == promoted[0]["trial"] and result["trials"][0]["trial"] == best
    assert result["trials"][0]["status"] == "max_epochs" and result["trials"][0]["epochs"] == 3
    assert {r["status"] for r in result["trials"][1:]} == {"pruned"}
    for key in ("report.json", "model.npz", "loss.png", "trial.json"):
        assert _stored(aws, f"tunes/{tune_id}/best/{key}"), key

    # The promoted trial did not train its first rung again: its supervisor's rounds run on
    # from where the first execution paused, each round once; its second execution resumed.
    job = f"{tune_id}-t{best:03d}"
    rounds = [c.event["round"] for c in _of_job(aws.runtime.of("supervisor"), job)]
    assert rounds == [0, 1, 2]  # a round is an epoch (round_steps: one worker's epoch)
    validated = sorted((c.event["execution"], c.result["round"]) for c in aws.runtime.of("validate")
                       if c.result and c.result["job_id"] == job)  # fmt: skip
    assert validated == [(f"{job}-r0", 0), (f"{job}-r1", 1)]
    report = json.loads(_stored(aws, f"jobs/{job}/report.json"))
    assert report["rounds"] == 3 and report["status"] == "max_epochs"
    # Each pruned trial trained its first rung only.
    for row in result["trials"][1:]:
        other = f"{tune_id}-t{row['trial']:03d}"
        assert [c.event["round"] for c in _of_job(aws.runtime.of("supervisor"), other)] == [0]
    # Ask and Tell ran under the tune function's role, the nested executions under the Tune machine's.
    assert len(aws.runtime.of("ebb.tune.handler")) == 6  # Ask, Tell, Ask, Tell, Ask, Conclude
    assert aws.stack.denied == []


def _parts(aws, data: str) -> list[str]:
    return json.loads(_stored(aws, f"{data}/manifest.json"))["train"]["parts"]


def _exists(aws, key: str) -> bool:
    return aws.s3.list_objects_v2(Bucket=aws.bucket, Prefix=key).get("KeyCount", 0) > 0


def test_ebb_tune_stack_uploads_the_data_starts_the_search_and_prints_its_leaderboard(aws, monkeypatch, capsys):
    for key, value in aws.stack.user_env({}).items():
        monkeypatch.setenv(key, value)
    # The stores' boto3 session keeps the credentials it first resolved: an earlier test's
    # command in this process (another stack's administrator) must not lend it its own.
    monkeypatch.setattr(aws_clients, "_session", None)
    argv = ["tune", "--stack", "Ebb", "--model", "pmf", "--data", aws.tune_data, "--workers", "1", "--name", "cli",
            "--set", "hyper.rank=3", "--set", "scaling.policy=none", "--param", "hyper.lr=log_uniform:0.01,0.1",
            "--trials", "2", "--eta", "2", "--min-epochs", "1", "--max-epochs", "2", "--watch"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    started = re.search(
        r"started tune (cli-\d{8}-\d{6}-[0-9a-f]{4}): 1 fields over 2 trials, rungs at \[1, 2\]", printed
    )
    assert started, printed
    tune_id = started.group(1)
    assert re.search(r"^trial +val rmse +epochs +status", printed, re.MULTILINE), printed
    assert re.search(r"^total \$[\d.]+; 2 trials in [\d.]+ s on the stack \(", printed, re.MULTILINE), printed
    best = json.loads(_stored(aws, f"tunes/{tune_id}/tune.json"))["best"]["trial"]
    assert f"best: trial {best} -> s3://{aws.bucket}/tunes/{tune_id}/best/" in printed
    # The best of the first rung is promoted (and the base job, trial 0, always is).
    launches = json.loads(_stored(aws, f"tunes/{tune_id}/tune.json"))["launches"]
    promoted = {x["trial"] for x in launches if x["rung"] == 1}
    assert best in promoted and promoted <= {best, 0}
    # The local dataset went to the bucket once, under datasets/, and the trials read it there.
    spec = json.loads(_stored(aws, f"jobs/{tune_id}-t000/spec.json"))
    assert spec["data"].startswith(f"s3://{aws.bucket}/datasets/prepared-")
    assert aws.stack.denied == []
