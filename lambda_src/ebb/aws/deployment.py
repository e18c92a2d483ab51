"""What a deployment runs a job on, and what Validate checks against it before a job starts.

The stack tells Validate (``EBB_DEPLOYMENT``, from ``stacks/settings.py``) the memory and
architecture of the functions, the cache, their reserved concurrency, the supervisor's
timeout and the Map's mode. Validate prices the job with those, never with the spec's
``aws:`` section (which only a local run's cost model reads), and refuses, in one line
naming the field, a job that the account's Lambda concurrency or the execution's event
history cannot hold (docs/AWS.md, "Validate").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from ebb.aws.config import ConfigError
from ebb.aws.jobs import JobSpecError
from ebb.ports import deployment as names
from ebb.spec import JobSpec

# Of the supervisor's timeout, what a round leaves for its last steps, every checkpoint
# and the supervisor's own state.
ROUND_MARGIN_S = 90.0


@dataclass(frozen=True)
class Deployment:
    worker_memory_mb: int
    supervisor_memory_mb: int
    supervisor_timeout_s: int
    arch: str
    worker_reserved: int | None  # reserved concurrency, or None (the account's unreserved pool)
    supervisor_reserved: int | None
    map: str  # inline | distributed
    cache_node_type: str | None  # None: a serverless cache
    cache_nodes: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Deployment:
        raw = env.get(names.DEPLOYMENT_ENV)
        if not raw:
            raise ConfigError(f"{names.DEPLOYMENT_ENV} is not set: Validate runs only inside the deployed Ebb stack")
        try:
            doc = json.loads(raw)
            return cls(**{f.name: doc[f.name] for f in fields(cls)})
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{names.DEPLOYMENT_ENV} is malformed ({type(exc).__name__}: {exc}): deploy the stack again"
            ) from None

    def priced(self, spec: JobSpec) -> JobSpec:
        """The spec with its ``aws:`` section replaced by what this deployment runs it on, so
        that the supervisor's cost meter, the budget and the report price the real functions."""
        update: dict = {
            "memory_mb": self.worker_memory_mb,
            "supervisor_memory_mb": self.supervisor_memory_mb,
            "arch": self.arch,
        }
        if self.cache_node_type is not None:
            update.update(cache_node_type=self.cache_node_type, cache_nodes=self.cache_nodes)
        return spec.model_copy(update={"aws": spec.aws.model_copy(update=update)})

    def round_seconds(self, spec: JobSpec) -> float:
        """How long a round of this job trains: its round_seconds, within the supervisor's timeout."""
        return min(spec.round_seconds, self.supervisor_timeout_s - ROUND_MARGIN_S)

    def check_history(self, spec: JobSpec, *, train_parts: int | None, has_val: bool) -> None:
        """Refuse a job whose rounds would overflow the execution's history (HISTORY_LIMIT
        events): each round of an inline Map adds events for every worker. A round ends
        after round_seconds or after round_steps steps, so the rounds are at most those
        that fill the job's time plus those that fill its steps (when the dataset is known)."""
        by_time = math.ceil(spec.stop.max_seconds / self.round_seconds(spec))
        by_steps = 0
        if spec.round_steps and train_parts:
            steps = math.ceil(spec.epoch_limit(has_val) * train_parts / spec.workers)
            by_steps = math.ceil(steps / spec.round_steps)
        rounds = by_time + by_steps + spec.faults.max_restarts
        per_worker = names.EVENTS_PER_INLINE_WORKER if self.map == "inline" else 0
        events = names.JOB_EVENTS + rounds * (names.ROUND_EVENTS + per_worker * spec.workers)
        if events <= names.HISTORY_LIMIT:
            return
        field = "round_steps" if by_steps > by_time else "stop.max_seconds"
        remedy = "a larger round_steps (or none)" if field == "round_steps" else "a smaller stop.max_seconds"
        raise JobSpecError(
            f"{field}: this job may run {rounds} rounds of {spec.workers} workers, about {events:,} events in its "
            f"execution's history, past the {names.HISTORY_LIMIT:,} a Step Functions execution holds: give it "
            f"{remedy} or fewer workers, or deploy with ebb:maxWorkers above {names.INLINE_MAP_LIMIT} (the workers "
            "then run as a Distributed Map, whose child executions keep their own histories)"
        )

    def check_concurrency(self, workers: int, account: Mapping, region: str) -> None:
        """Refuse a job whose round (P workers and the supervisor, all at once) needs more
        concurrent invocations than the account's unreserved pool (``GetAccountSettings``)."""
        needed = (0 if self.worker_reserved else workers) + (0 if self.supervisor_reserved else 1)
        limits = account["AccountLimit"]
        unreserved = limits["UnreservedConcurrentExecutions"]
        if needed <= unreserved:
            return
        raise JobSpecError(
            f"workers: a round runs {workers} workers and the supervisor at once, {needed} concurrent Lambda "
            f"invocations from the unreserved pool, but this account's in {region} holds {unreserved} (of "
            f"{limits['ConcurrentExecutions']}): request a higher 'Concurrent executions' quota for AWS Lambda in "
            f"Service Quotas (README, 'Quotas'), or run at most {max(unreserved - needed + workers, 0)} workers"
        )


def account_settings(client=None) -> dict:
    """Lambda's ``GetAccountSettings`` for this function's account and region."""
    if client is None:
        from ebb.stores.aws_clients import client as aws_client

        client = aws_client("lambda")
    return client.get_account_settings()
