"""The search on a stack (ebb.tune.stack), in trial packs: what Ask starts, how a pack's NextJob
folds each job's end in and asks for the next, how the fleets' decisions are kept apart, what
Tell and Conclude write; the bucket in moto (in-process), each trial's state as its checkpoints
would say it (``outcome``, stood in for: the rehearsal, tests/infra/test_rehearsal_tune.py, reads
real ones)."""

from __future__ import annotations

import json

import boto3
import pytest

from ebb.aws.config import AwsConfig
from ebb.ports import deployment as names
from ebb.stores import open_object_store
from ebb.stores.local import FolderObjectStore
from ebb.tune import stack
from ebb.tune.stack import StackTune, TuneInputError, max_concurrency

BUCKET = "ebb-tune-unit"
SEARCH = {
    "tune": {"trials": 3, "eta": 3, "min_epochs": 1, "max_epochs": 3, "seed": 1,
             "space": {"hyper.lr": {"log_uniform": [0.01, 0.1]}}},
    "job": {"model": "pmf", "name": "unit", "workers": 1, "data": "datasets/ml", "hyper": {"rank": 3}},
}  # fmt: skip


DEPLOYED = {"worker_memory_mb": 2048, "supervisor_memory_mb": 1024, "supervisor_timeout_s": 900, "arch": "x86_64",
            "worker_reserved": None, "supervisor_reserved": None, "map": "inline", "cache_node_type": "cache.t4g.small",
            "cache_nodes": 1}  # fmt: skip
ACCOUNT = {"AccountLimit": {"UnreservedConcurrentExecutions": 10, "ConcurrentExecutions": 10}}


@pytest.fixture
def bucket(aws_mock, small_ratings):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    local = FolderObjectStore(small_ratings[0])
    for key in local.list():
        s3.put_object(Bucket=BUCKET, Key=f"datasets/ml/{key}", Body=local.get(key))
    return AwsConfig(bucket=BUCKET, env={names.DEPLOYMENT_ENV: json.dumps(DEPLOYED)})


@pytest.fixture
def outcomes(monkeypatch):
    """Each trial's state as its checkpoints would say it: ``outcomes[trial] = {...}`` (and its
    rounds so far, one per epoch)."""
    given: dict[int, dict] = {}

    def outcome(spec, unit, store):
        return dict(given[int(spec.name.rsplit("-t", 1)[1])])

    def latest_round(store):
        trial = int(store.url().rstrip("/").rsplit("-t", 1)[1])
        return int(given[trial]["epochs"]) if trial in given else 0

    def close(spec, status, outputs, store):  # a pruned trial's report alone (the rehearsal scores real ones)
        assert not outputs
        report = {
            "status": status,
            "model": None,
            "cost": {"total_usd": given[int(spec.name.rsplit("-t", 1)[1])]["cost_usd"]},
        }
        open_object_store(spec.out_location).put("report.json", json.dumps(report).encode())

    monkeypatch.setattr(stack, "outcome", outcome)
    monkeypatch.setattr(stack, "_latest_round", latest_round)
    monkeypatch.setattr(stack, "close", close)
    return given


def _state(epochs: float, best: float, status: str = "paused") -> dict:
    return {"epochs": epochs, "best_val": best, "cost_usd": 0.001 * epochs, "wall_seconds": 2.0 * epochs,
            "status": status, "curve": [[epochs, best]]}  # fmt: skip


def _step(config, tune_id, act, submitted=None):
    return StackTune.step(config, tune_id, act, submitted)[1]


def test_one_pack_trains_every_job_asking_the_search_between_them_and_shares_its_cost(bucket, outcomes):
    # Without from_base: its trial 0 would be promoted too, whatever its score.
    search = {**SEARCH, "tune": {**SEARCH["tune"], "from_base": False}}
    (pack,) = _step(bucket, "tune-a", lambda r: r.ask(ACCOUNT), search)  # one fleet: one pack
    assert (pack.pack, pack.name) == (0, "tune-a-p000")
    run = StackTune.load(bucket, "tune-a")
    spec, unit, parts = run.trial_spec(0)
    assert unit == parts  # sync.combine mean: an epoch at one worker's pace is every part
    doc = pack.input
    assert doc[names.PACK_FIELD] == {"tune_id": "tune-a", "pack": 0}
    assert doc[names.JOB_ID_FIELD] == "tune-a-t000" and doc[names.RESUME_FIELD] is False
    assert doc[names.PAUSE_FIELD] == unit  # the first rung: 1 epoch
    assert doc["round_steps"] == unit and doc["name"] == "unit-t000"
    assert doc["data"] == f"s3://{BUCKET}/datasets/ml"
    assert doc["out"] == f"s3://{BUCKET}/jobs/tune-a-t000"  # the trial's job's outputs
    assert doc["stop"]["max_epochs"] == pytest.approx(3 * unit / parts)  # the last rung, in passes

    # Each job's end: told, and the pack's next job asked for (the state kept in the bucket between).
    inputs = [doc]
    for trial, state in ((0, _state(1, 0.9)), (1, _state(1, 0.8)), (2, _state(1, 1.1))):
        outcomes[trial] = state
        inputs.append(_step(bucket, "tune-a", lambda r: r.next(0))["input"])
    assert [d[names.JOB_ID_FIELD] for d in inputs] == [f"tune-a-t00{t}" for t in (0, 1, 2, 1)]
    assert len({d["hyper"]["lr"] for d in inputs[:3]}) == 3  # three sampled settings
    promotion = inputs[-1]  # the best of the first rung
    assert promotion[names.RESUME_FIELD] is True and promotion[names.PAUSE_FIELD] == 3 * unit
    outcomes[1] = _state(3, 0.7, "max_epochs")
    assert _step(bucket, "tune-a", lambda r: r.next(0)) == {"done": True}  # the search is over: the pack ends
    _step(bucket, "tune-a", lambda r: r.tell([{"pack": 0, "ok": True}]))
    run = StackTune.load(bucket, "tune-a")
    assert run.summary() == {"trials_started": 3, "trials_finished": 1, "best_val": 0.7}
    assert run.ask(ACCOUNT) == []

    (record,) = run.packs
    assert not record["open"] and record["decisions"] == 4
    assert [(j["trial"], j["rung"], j["rounds"]) for j in record["jobs"]] == [
        (0, 0, 1),
        (1, 0, 1),
        (2, 0, 1),
        (1, 1, 2),
    ]
    assert record["waves"] == 5  # a wave of invocations per round
    assert sum(record["shares"].values()) == pytest.approx(record["usd"])
    # shared by the trials' seconds in the pack: trial 1 trained 6 of its 10
    assert record["shares"]["1"] == pytest.approx(record["usd"] * 6 / 10)
    boto3.client("s3").put_object(Bucket=BUCKET, Key="jobs/tune-a-t001/report.json",
                                  Body=json.dumps({"status": "max_epochs", "cost": {"total_usd": 0.004}}))  # fmt: skip
    result = run.conclude()
    assert result["best"]["trial"] == 1 and result["best"]["folder"] == f"s3://{BUCKET}/jobs/tune-a-t001"
    assert [(r["trial"], r["status"]) for r in result["trials"]] == [(1, "max_epochs"), (0, "pruned"), (2, "pruned")]
    assert result["packs_usd"] == pytest.approx(record["usd"], abs=1e-6) and "open" not in result["packs"][0]
    assert result["total_usd"] == pytest.approx(0.004 + 0.001 + 0.001 + record["usd"], abs=2e-6)
    for trial, job_usd in ((1, 0.004), (0, 0.001), (2, 0.001)):  # the pruned trials' reports too, as locally
        key = f"jobs/tune-a-t00{trial}/report.json"
        cost = json.loads(boto3.client("s3").get_object(Bucket=BUCKET, Key=key)["Body"].read())["cost"]
        assert cost["job_usd"] == job_usd and cost["pack_usd"] == pytest.approx(record["shares"][str(trial)])
    stored = json.loads(boto3.client("s3").get_object(Bucket=BUCKET, Key="tunes/tune-a/tune.json")["Body"].read())
    assert stored == result
    best = boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="tunes/tune-a/best/")["Contents"]
    assert {o["Key"].rsplit("/", 1)[1] for o in best} == {"report.json", "trial.json"}  # what the trial has


def test_fleets_start_a_pack_each_decide_one_after_another_and_wait_for_a_promotion(bucket, outcomes):
    search = {**SEARCH, "fleets": 2, "tune": {**SEARCH["tune"], "from_base": False}}
    packs = _step(bucket, "tune-f", lambda r: r.ask(ACCOUNT), search)
    assert [(p.pack, p.input[names.JOB_ID_FIELD]) for p in packs] == [(0, "tune-f-t000"), (1, "tune-f-t001")]
    # Two fleets decide at once: the second store is refused (If-Match), and its step runs again.
    outcomes.update({0: _state(1, 0.9), 1: _state(1, 0.8)})
    first, second = StackTune.load(bucket, "tune-f"), StackTune.load(bucket, "tune-f")
    assert first.next(0)["input"][names.JOB_ID_FIELD] == "tune-f-t002" and first.save()
    second.next(1)
    assert not second.save()  # stale: it would have given trial 2 again
    with pytest.raises(stack.TuneInputError, match="pack 0: job tune-f-t000 is not the job it runs"):
        StackTune.load(bucket, "tune-f").next(0, "tune-f-t000")  # told already: a repeated NextJob
    # Nothing for pack 1 until trial 2's rung is in (synchronous halving), which pack 0 trains:
    # it waits and asks again (its job told once, however often it asks).
    for _ in range(2):
        assert _step(bucket, "tune-f", lambda r: r.next(1, "tune-f-t001")) == {"wait": True}
    run = StackTune.load(bucket, "tune-f")
    assert run.search.trials[1].scores == {0: 0.8} and [len(p["jobs"]) for p in run.packs] == [1, 1]
    outcomes[2] = _state(1, 1.1)
    promotion = _step(bucket, "tune-f", lambda r: r.next(0, "tune-f-t002"))["input"]  # the rung is in
    assert promotion[names.JOB_ID_FIELD] == "tune-f-t001" and promotion[names.RESUME_FIELD] is True
    assert _step(bucket, "tune-f", lambda r: r.next(1, "tune-f-t001")) == {"wait": True}  # pack 0 trains
    outcomes[1] = _state(3, 0.7, "max_epochs")
    assert _step(bucket, "tune-f", lambda r: r.next(0, "tune-f-t001")) == {"done": True}
    assert _step(bucket, "tune-f", lambda r: r.next(1, "tune-f-t001")) == {"done": True}  # nothing runs: over
    run = StackTune.load(bucket, "tune-f")
    assert [p["open"] for p in run.packs] == [False, False] and [len(p["jobs"]) for p in run.packs] == [3, 1]
    assert run.packs[1]["polls"] == 3 and run.packs[1]["decisions"] == 1  # a wait is no decision of the fleet's
    assert run.packs[1]["transitions"] == stack.PACK_JOB_STATES + 3 * 3  # its job's states, each wait's
    assert run.summary() == {"trials_started": 3, "trials_finished": 1, "best_val": 0.7}


def test_a_failed_pack_fails_its_job_with_its_error(bucket, outcomes):
    _step(bucket, "tune-b", lambda r: r.ask(ACCOUNT), {**SEARCH, "tune": {**SEARCH["tune"], "trials": 2}})
    outcomes.update({0: _state(0.5, 0.95)})
    cause = json.dumps({"Error": "EngineError", "Cause": "dataset part x does not match its checksum"})
    run, _ = StackTune.step(
        bucket,
        "tune-b",
        lambda r: r.tell([{"pack": 0, "ok": False, "error": {"Error": "States.TaskFailed", "Cause": cause}}]),
    )
    failed = run.search.trials[0]
    assert failed.done and failed.status == "failed"
    assert failed.error == "States.TaskFailed: EngineError: dataset part x does not match its checksum"
    assert not run.packs[0]["open"]


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
