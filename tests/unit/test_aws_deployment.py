"""What Validate checks against a deployment (ebb.aws.deployment), and the heartbeat the
supervisor keeps while it checks a dataset: the decisions, with the numbers they turn on.
The same checks run through the handlers in tests/test_aws_handlers.py and the rehearsal."""

from __future__ import annotations

import json
import time

import pytest

from ebb.aws.config import ConfigError
from ebb.aws.deployment import Deployment
from ebb.aws.jobs import JobSpecError, heartbeat_while, job_of_execution, split_control
from ebb.engine.clock import wall
from ebb.ports import deployment as names
from ebb.spec import parse_spec
from ebb.stores.local import FolderObjectStore
from ebb.stores.memory import MemoryUpdateStore

DEPLOYED = {
    "worker_memory_mb": 3008,
    "supervisor_memory_mb": 2048,
    "supervisor_timeout_s": 900,
    "arch": "arm64",
    "worker_reserved": None,
    "supervisor_reserved": None,
    "map": "inline",
    "cache_node_type": "cache.r7g.large",
    "cache_nodes": 2,
}
ACCOUNT = {"AccountLimit": {"ConcurrentExecutions": 10, "UnreservedConcurrentExecutions": 10}}


def spec(**fields):
    return parse_spec({"model": "pmf", "data": "s3://b/datasets/x", **fields}, "test")


def deployment(**changes) -> Deployment:
    return Deployment.from_env({names.DEPLOYMENT_ENV: json.dumps({**DEPLOYED, **changes})})


def test_a_job_is_priced_with_the_deployed_functions_not_its_aws_section():
    job = spec(aws={"memory_mb": 512, "supervisor_memory_mb": 128, "arch": "x86_64", "signal_channel": "sns_sqs"})
    priced = deployment().priced(job).aws
    assert (priced.memory_mb, priced.supervisor_memory_mb, priced.arch) == (3008, 2048, "arm64")
    assert (priced.cache_node_type, priced.cache_nodes, priced.signal_channel) == ("cache.r7g.large", 2, "sns_sqs")
    # A serverless cache has no node type: the spec's stays (the cost model prices nodes only).
    assert deployment(cache_node_type=None, cache_nodes=0).priced(job).aws.cache_node_type == "cache.t4g.medium"


def test_a_round_must_fit_the_accounts_unreserved_concurrency():
    deployment().check_concurrency(9, ACCOUNT, "eu-west-1")  # 9 workers + the supervisor: 10
    with pytest.raises(JobSpecError) as refused:
        deployment().check_concurrency(10, ACCOUNT, "eu-west-1")
    assert str(refused.value) == (
        "workers: a round runs 10 workers and the supervisor at once, 11 concurrent Lambda invocations from the "
        "unreserved pool, but this account's in eu-west-1 holds 10 (of 10): request a higher 'Concurrent executions' "
        "quota for AWS Lambda in Service Quotas (README, 'Quotas'), or run at most 9 workers"
    )
    # Workers with concurrency of their own draw nothing from the pool; the supervisor still does.
    deployment(worker_reserved=64).check_concurrency(64, ACCOUNT, "eu-west-1")
    deployment(worker_reserved=64, supervisor_reserved=1).check_concurrency(
        64, {"AccountLimit": {"ConcurrentExecutions": 1000, "UnreservedConcurrentExecutions": 0}}, "eu-west-1"
    )


def test_rounds_that_could_overflow_the_execution_history_are_refused():
    # The defaults: at most 5 rounds of 810 s in an hour, 3 restarts: 8 rounds of 40 workers fit.
    deployment().check_history(spec(workers=40), train_parts=None, has_val=True)
    with pytest.raises(
        JobSpecError,
        match=r"^stop\.max_seconds: this job may run 110 rounds of 40 workers, about "
        r"37,880 events in its execution's history, past the 25,000",
    ):
        deployment().check_history(spec(workers=40, stop={"max_seconds": 86_400}), train_parts=None, has_val=True)
    # The Distributed Map's children keep their own histories: only the rounds count.
    deployment(map="distributed").check_history(
        spec(workers=40, stop={"max_seconds": 86_400}), train_parts=None, has_val=True
    )
    # Short rounds: 2 steps each over 50 epochs of 100 parts at 4 workers (1,250 steps).
    with pytest.raises(JobSpecError, match=r"^round_steps: this job may run 633 rounds .* a larger round_steps"):
        deployment().check_history(
            spec(workers=4, round_steps=2, stop={"max_epochs": 50}), train_parts=100, has_val=False
        )


def test_the_deployment_description_must_be_there_and_whole():
    with pytest.raises(ConfigError, match="EBB_DEPLOYMENT is not set: Validate runs only inside the deployed"):
        Deployment.from_env({})
    broken = {k: v for k, v in DEPLOYED.items() if k != "arch"}
    with pytest.raises(ConfigError, match=r"EBB_DEPLOYMENT is malformed \(KeyError: 'arch'\): deploy the stack"):
        Deployment.from_env({names.DEPLOYMENT_ENV: json.dumps(broken)})


def test_the_supervisor_beats_while_it_checks_a_dataset():
    """Workers give a silent supervisor up after faults.supervisor_timeout_s: a preflight that takes longer
    must not look like silence."""
    store = MemoryUpdateStore()
    started = wall()
    with heartbeat_while(lambda: store.heartbeat(-1, wall()), every_s=0.2):
        time.sleep(1.0)
        assert wall() - store.heartbeats([-1])[-1] < 0.5
    assert store.heartbeats([-1])[-1] > started + 0.6


def test_an_executions_control_fields_are_taken_out_of_its_job_spec():
    spec, control = split_control({"model": "pmf", "data": "d", "job_id": "t-t001", "resume": True,
                                   "pause_after_steps": 12})  # fmt: skip
    assert spec == {"model": "pmf", "data": "d"}
    assert (control.job_id, control.resume, control.pause_after_steps) == ("t-t001", True, 12)
    assert split_control({"model": "pmf"})[1].model_dump() == {
        "job_id": None, "resume": False, "pause_after_steps": 0, "pack": None
    }  # fmt: skip
    with pytest.raises(JobSpecError, match="execution input: pause_after_steps: Input should be greater than"):
        split_control({"model": "pmf", "pause_after_steps": -1})
    with pytest.raises(JobSpecError, match="execution input: job_id: String should match pattern"):
        split_control({"model": "pmf", "job_id": "../other"})


def test_a_stopped_execution_is_the_job_its_input_names_else_its_own(tmp_path):
    assert job_of_execution("t-t001-r1", json.dumps({"model": "pmf", "job_id": "t-t001"})) == "t-t001"
    assert job_of_execution("my-job", json.dumps({"model": "pmf"})) == "my-job"
    assert job_of_execution("my-job", json.dumps({"job_id": "bad/id"})) == "my-job"  # Validate refused it too
    assert job_of_execution("my-job", "not json") == "my-job"
    # A trial pack's execution names its first job; the one it trains now is in its search's state.
    bucket = FolderObjectStore(tmp_path)
    bucket.put(
        names.tune_state_key("t"), json.dumps({"packs": [{"job": {"job_id": "t-t002"}}, {"job": None}]}).encode()
    )
    pack_input = {"model": "pmf", "job_id": "t-t000", "pack": {"tune_id": "t", "pack": 0}}
    assert job_of_execution("t-p000", json.dumps(pack_input), bucket) == "t-t002"
    between = {**pack_input, "pack": {"tune_id": "t", "pack": 1}}  # between jobs: the input's
    assert job_of_execution("t-p001", json.dumps(between), bucket) == "t-t000"
    assert job_of_execution("t-p000", json.dumps(pack_input), FolderObjectStore(tmp_path / "none")) == "t-t000"
