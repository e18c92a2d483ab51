"""The search on a stack (ebb.tune.stack): what Ask starts, how Tell folds each execution's end in,
and what Conclude writes; the bucket in moto (in-process), each trial's state as its checkpoints
would say it (``outcome``, stood in for: the rehearsal, tests/infra/test_rehearsal_tune.py, reads
real ones)."""

from __future__ import annotations

import json

import boto3
import pytest

from ebb.aws.config import AwsConfig
from ebb.ports import deployment as names
from ebb.stores.local import FolderObjectStore
from ebb.tune import stack
from ebb.tune.stack import StackTune, TuneInputError, max_concurrency

BUCKET = "ebb-tune-unit"
SEARCH = {
    "tune": {"trials": 3, "eta": 3, "min_epochs": 1, "max_epochs": 3, "seed": 1,
             "space": {"hyper.lr": {"log_uniform": [0.01, 0.1]}}},
    "job": {"model": "pmf", "name": "unit", "workers": 1, "data": "datasets/ml", "hyper": {"rank": 3}},
}  # fmt: skip


@pytest.fixture
def bucket(aws_mock, small_ratings):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    local = FolderObjectStore(small_ratings[0])
    for key in local.list():
        s3.put_object(Bucket=BUCKET, Key=f"datasets/ml/{key}", Body=local.get(key))
    return AwsConfig(bucket=BUCKET)


@pytest.fixture
def outcomes(monkeypatch):
    """Each trial's state as its checkpoints would say it: ``outcomes[trial] = {...}``."""
    given: dict[int, dict] = {}

    def outcome(spec, unit, store):
        return given[int(spec.name.rsplit("-t", 1)[1])]

    monkeypatch.setattr(stack, "outcome", outcome)
    return given


def _state(epochs: float, best: float, status: str = "paused") -> dict:
    return {"epochs": epochs, "best_val": best, "cost_usd": 0.001 * epochs, "wall_seconds": 2.0 * epochs,
            "status": status, "curve": [[epochs, best]]}  # fmt: skip


def test_ask_starts_every_trial_to_its_first_rung_then_promotes_the_best_resuming_it(bucket, outcomes):
    # Without from_base: its trial 0 would be promoted too, whatever its score.
    run = StackTune.load(bucket, "tune-a", {**SEARCH, "tune": {**SEARCH["tune"], "from_base": False}})
    first = run.ask()
    assert [(j.trial, j.rung, j.name) for j in first] == [(t, 0, f"tune-a-t{t:03d}-r0") for t in range(3)]
    spec, unit, parts = run.trial_spec(0)
    assert unit == parts  # sync.combine mean: an epoch at one worker's pace is every part
    for j in first:
        doc = j.input
        assert doc[names.JOB_ID_FIELD] == f"tune-a-t{j.trial:03d}" and doc[names.RESUME_FIELD] is False
        assert doc[names.PAUSE_FIELD] == unit  # the first rung: 1 epoch
        assert doc["round_steps"] == unit and doc["name"] == f"unit-t{j.trial:03d}"
        assert doc["data"] == f"s3://{BUCKET}/datasets/ml"
        assert doc["out"] == f"s3://{BUCKET}/jobs/tune-a-t{j.trial:03d}"  # the trial's job's outputs
        assert doc["stop"]["max_epochs"] == pytest.approx(3 * unit / parts)  # the last rung, in passes
    assert len({j.input["hyper"]["lr"] for j in first}) == 3  # three sampled settings

    # The state is kept in the bucket between the steps: a new invocation loads it.
    run = StackTune.load(bucket, "tune-a")
    outcomes.update({0: _state(1, 0.9), 1: _state(1, 0.8), 2: _state(1, 1.1)})
    run.tell([{"trial": t, "rung": 0, "ok": True} for t in range(3)])
    assert run.summary() == {"trials_started": 3, "trials_finished": 0, "best_val": 0.8}

    run = StackTune.load(bucket, "tune-a")
    (promotion,) = run.ask()
    assert (promotion.trial, promotion.rung, promotion.name) == (1, 1, "tune-a-t001-r1")
    assert promotion.input[names.RESUME_FIELD] is True  # carries on from its checkpoints
    assert promotion.input[names.PAUSE_FIELD] == 3 * unit
    assert promotion.input[names.JOB_ID_FIELD] == "tune-a-t001"

    outcomes[1] = _state(3, 0.7, "max_epochs")
    StackTune.load(bucket, "tune-a").tell([{"trial": 1, "rung": 1, "ok": True}])
    run = StackTune.load(bucket, "tune-a")
    assert run.ask() == []  # the search is over
    boto3.client("s3").put_object(Bucket=BUCKET, Key="jobs/tune-a-t001/report.json",
                                  Body=json.dumps({"status": "max_epochs", "cost": {"total_usd": 0.004}}))  # fmt: skip
    result = run.conclude()
    assert result["best"]["trial"] == 1 and result["best"]["folder"] == f"s3://{BUCKET}/jobs/tune-a-t001"
    assert [(r["trial"], r["status"]) for r in result["trials"]] == [(1, "max_epochs"), (0, "pruned"), (2, "pruned")]
    stored = json.loads(boto3.client("s3").get_object(Bucket=BUCKET, Key="tunes/tune-a/tune.json")["Body"].read())
    assert stored == result
    best = boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="tunes/tune-a/best/")["Contents"]
    assert {o["Key"].rsplit("/", 1)[1] for o in best} == {"report.json", "trial.json"}  # what the trial has


def test_a_failed_execution_is_a_failed_trial_with_its_error(bucket, outcomes):
    run = StackTune.load(bucket, "tune-b", {**SEARCH, "tune": {**SEARCH["tune"], "trials": 2}})
    run.ask()
    outcomes.update({0: _state(1, 0.9), 1: _state(0.5, 0.95)})
    cause = json.dumps({"Error": "EngineError", "Cause": "dataset part x does not match its checksum"})
    run.tell([{"trial": 0, "rung": 0, "ok": True}, {"trial": 1, "rung": 0, "ok": False,
              "error": {"Error": "States.TaskFailed", "Cause": cause}}])  # fmt: skip
    failed = run.search.trials[1]
    assert failed.done and failed.status == "failed"
    assert failed.error == "States.TaskFailed: EngineError: dataset part x does not match its checksum"


def test_a_bad_search_fails_ask_before_anything_starts(bucket):
    with pytest.raises(TuneInputError, match="job: model: unknown|job: .*model"):
        StackTune.load(bucket, "tune-c", {**SEARCH, "job": {**SEARCH["job"], "model": "nope"}})
    with pytest.raises(TuneInputError, match="tune.space: nothing to search"):
        StackTune.load(bucket, "tune-c", {**SEARCH, "tune": {"trials": 2}})
    with pytest.raises(TuneInputError, match="longer than 64"):
        StackTune.load(bucket, "t" * 65, SEARCH)


def test_trials_at_once_are_what_the_unreserved_concurrency_holds():
    account = {"AccountLimit": {"UnreservedConcurrentExecutions": 10, "ConcurrentExecutions": 10}}
    assert max_concurrency(2, account) == 3  # each trial: 2 workers and its supervisor
    assert max_concurrency(12, account) == 1  # at least one (Validate refuses what cannot run)
