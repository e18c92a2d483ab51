"""The rehearsal of pausing, resuming and tuning (docs/AWS.md "Tuning on AWS"): the stack in
moto with IAM enforced, as in test_rehearsal.py; the Tune machine's nested executions of the
training machine signed with the Tune machine's role, every handler under its own.

- A job paused at its `pause_after_steps` ends with its checkpoints and no Finalize; an
  execution of the same job with `resume: true` carries on from them (no round twice).
- A tiny search in trial packs (2 trials, rungs at 1 and 2 epochs, 2 fleets): its 3 jobs run
  in at most 2 executions of the training machine, each asking the search for its next job
  between jobs (NextJob; the fleets' decisions stored over each other's with If-Match); the
  best trial is promoted and resumed from its checkpoint (no round twice); the packs' fixed
  cost is shared into the trials' costs, which sum to tune.json's total; Conclude writes
  tune.json and best/.
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
    entered = _entered(first["history"])
    assert names.PAUSED in entered and names.FINALIZE not in entered and names.NEXT_JOB_STATE not in entered
    output = json.loads(first["output"])
    assert output == {"job_id": job, "spec_key": f"jobs/{job}/spec.json", "packed": False, "pack": None,
                      "pause_after_steps": 2, "status": "paused", "round": 1, "workers": [0, 1],
                      "steps": 2}  # fmt: skip
    assert not _exists(aws, f"jobs/{job}/report.json")  # no Finalize

    second = _wait(aws, _start(aws, "rehearse-pause-2", {**spec, "job_id": job, "resume": True}))
    assert second["status"] == "SUCCEEDED", second.get("cause")
    entered = _entered(second["history"])
    assert entered[:3] == ["Validate", "Prepare?", "Round"] and entered[-3:] == [
        "Finalize",
        names.IN_PACK_STATE,
        "Done",
    ]
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


def test_a_tiny_search_runs_in_trial_packs_promotes_the_best_and_resumes_it_from_its_checkpoint(aws):
    tune_id = "rehearse-tune-1"
    fleets = 2
    search = {
        # (from_base off: the base job, always promoted, would be a second promotion)
        "tune": {"trials": 2, "eta": 2, "min_epochs": 1, "max_epochs": 2, "seed": 1, "from_base": False,
                 "space": {"hyper.lr": {"log_uniform": [0.01, 0.1]}}},
        "job": {"model": "pmf", "workers": 1, "seed": 3, "hyper": {"rank": 3}, "data": "datasets/tune",
                "scaling": {"policy": "none"}},
        "fleets": fleets,
    }  # fmt: skip
    machine = aws.stack.output(names.TUNE_STATE_MACHINE_OUTPUT)
    started = aws.sfn.start_execution(stateMachineArn=machine, name=tune_id, input=json.dumps({"search": search}))
    run = _wait(aws, started["executionArn"])
    assert run["status"] == "SUCCEEDED", run.get("cause")
    entered = _entered(run["history"])
    # One pass: the packs train every job (first rungs and the promotion); then Ask has nothing more.
    assert entered.count(names.TRIALS_STATE) == 1 and entered[-2:] == [names.CONCLUDE_STATE, "Tuned"]

    result = json.loads(_stored(aws, f"tunes/{tune_id}/tune.json"))
    assert len(result["trials"]) == 2 and result["rungs"] == [1, 2] and len(result["launches"]) == 3
    # The search's 3 jobs ran in at most `fleets` executions of the training machine, a pack each.
    training = aws.stack.output(names.STATE_MACHINE_OUTPUT)
    executions = [e for e in aws.sfn.list_executions(stateMachineArn=training)["executions"]
                  if e["name"].startswith(f"{tune_id}-")]  # fmt: skip
    assert 1 <= len(executions) <= fleets and len(result["packs"]) == len(executions)
    assert {e["name"] for e in executions} == {p["execution"] for p in result["packs"]}
    assert {e["status"] for e in executions} == {"SUCCEEDED"}
    assert sorted((j["trial"], j["rung"]) for p in result["packs"] for j in p["jobs"]) == sorted(
        (x["trial"], x["rung"]) for x in result["launches"]
    )
    assert sum(len(p["jobs"]) for p in result["packs"]) == 3 and max(len(p["jobs"]) for p in result["packs"]) >= 2
    promoted = [x for x in result["launches"] if x["rung"] == 1]
    assert len(promoted) == 1 and promoted[0]["from_epochs"] == 1
    best = result["best"]["trial"]
    assert best == promoted[0]["trial"] and result["trials"][0]["trial"] == best
    assert result["trials"][0]["status"] == "max_epochs" and result["trials"][0]["epochs"] == 2
    assert {r["status"] for r in result["trials"][1:]} == {"pruned"}
    for key in ("report.json", "model.npz", "loss.png", "trial.json"):
        assert _stored(aws, f"tunes/{tune_id}/best/{key}"), key

    # The promoted trial did not train its first rung again: its supervisor's rounds run on
    # from where its first job paused, each round once; its second job resumed (in a pack's execution).
    job = f"{tune_id}-t{best:03d}"
    rounds = [c.event["round"] for c in _of_job(aws.runtime.of("supervisor"), job)]
    assert rounds == [0, 1]  # a round is an epoch (round_steps: one worker's epoch)
    validated = [(c.event["execution"], c.result["round"]) for c in aws.runtime.of("validate")
                 if c.result and c.result["job_id"] == job]  # fmt: skip
    assert [r for _, r in validated] == [0, 1]
    assert {e for e, _ in validated} <= {p["execution"] for p in result["packs"]}
    report = json.loads(_stored(aws, f"jobs/{job}/report.json"))
    assert report["rounds"] == 2 and report["status"] == "max_epochs"
    # Each pruned trial trained its first rung only, and has its report alone (as a local pack's).
    for row in result["trials"][1:]:
        other = f"{tune_id}-t{row['trial']:03d}"
        assert [c.event["round"] for c in _of_job(aws.runtime.of("supervisor"), other)] == [0]
        pruned = json.loads(_stored(aws, f"jobs/{other}/report.json"))
        assert pruned["status"] == "pruned" and pruned["model"] is None and pruned["test_metrics"]
        assert row["cost_usd"] == pytest.approx(pruned["cost"]["total_usd"], rel=1e-9)
        assert pruned["cost"]["pack_usd"] == pytest.approx(
            sum(p["shares"].get(str(row["trial"]), 0) for p in result["packs"])
        )

    # Cost: the jobs metered as the packs' (no execution of their own), each pack's fixed cost
    # shared out by its trials' seconds; the shares sum to what the packs paid, the trials' costs
    # to the total, and the best trial's report carries its share (cost.pack_usd) as locally.
    packs_usd = sum(p["usd"] for p in result["packs"])
    assert result["packs_usd"] == pytest.approx(packs_usd, abs=1e-6) and packs_usd > 0
    shares = {}
    for p in result["packs"]:
        assert sum(p["shares"].values()) == pytest.approx(p["usd"], rel=1e-9)
        assert p["waves"] == sum(j["rounds"] for j in p["jobs"]) and p["decisions"] == len(p["jobs"])
        for trial, usd in p["shares"].items():
            shares[int(trial)] = shares.get(int(trial), 0.0) + usd
    assert sum(shares.values()) == pytest.approx(packs_usd, rel=1e-9)
    assert result["total_usd"] == pytest.approx(sum(r["cost_usd"] for r in result["trials"]), abs=1e-5)
    cost = report["cost"]
    assert cost["pack_usd"] == pytest.approx(shares[best], rel=1e-9)
    assert cost["total_usd"] == pytest.approx(cost["job_usd"] + cost["pack_usd"], rel=1e-9)
    assert result["trials"][0]["cost_usd"] == pytest.approx(cost["total_usd"], rel=1e-9)
    # The job's own meter priced no execution (the pack's is in its share).
    assert cost["by_component"]["step_functions"] == 0 and cost["by_component"]["lambda_requests"] == 0
    assert result["cost_by_component"]["step_functions"] == pytest.approx(
        sum(p["by_component"]["step_functions"] for p in result["packs"]), rel=1e-9
    )
    # Ask, a NextJob after each of the 3 jobs and after each wait of a pack for another's promotion,
    # Tell, Ask, Conclude.
    calls = [c.event["action"] for c in aws.runtime.of("ebb.tune.handler") if c.event["tune_id"] == tune_id]
    waits = sum(p.get("polls", 0) for p in result["packs"])
    assert calls.count("next") == 3 + waits and calls.count("ask") == 2 and calls.count("tell") == 1
    assert len(calls) == 7 + waits
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
            "--trials", "2", "--eta", "2", "--min-epochs", "1", "--max-epochs", "2", "--fleets", "2",
            "--watch"]  # fmt: skip
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
    assert 1 <= len(json.loads(_stored(aws, f"tunes/{tune_id}/tune.json"))["packs"]) <= 2  # --fleets 2
    # The local dataset went to the bucket once, under datasets/, and the trials read it there.
    spec = json.loads(_stored(aws, f"jobs/{tune_id}-t000/spec.json"))
    assert spec["data"].startswith(f"s3://{aws.bucket}/datasets/prepared-")
    assert aws.stack.denied == []
