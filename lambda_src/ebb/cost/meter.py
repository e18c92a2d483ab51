"""Live cost of a running job: what the supervisor measured, priced as the job's AWS
configuration (``spec.aws``) would be billed.

The mapping, stated once: every worker invocation is a Lambda billed from its launch
until it leaves, finishes or checkpoints at the end of its round, at ``aws.memory_mb``;
the supervisor is one invocation per round billed for the job's wall time; the cache is
billed pro rata for the wall time; each object-store read a worker makes is one S3 GET,
each checkpoint and output one PUT; with the SNS/SQS channel every step costs one SQS
send per report, one SNS publish per directive and one SQS receive + delete per worker;
Step Functions counts the states of each round and two per worker invocation.

A job trained inside a *trial pack* (``ebb tune``: one execution whose warm fleet trains
several trials' jobs back to back, ``packed()``) is priced for what it adds to the pack:
its workers', supervisor's and cache's time, its S3 requests, its outputs where it writes
them. The execution (its transitions and invocations), the cold start and loading the
data are the pack's, paid once (``pack_cost``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from ebb.cost.model import Usage, estimate_cost, load_prices

_STATES_PER_ROUND = 4  # parallel, supervisor, map, choice
_STATES_PER_JOB = 4  # validate, prepare choice, finalize, succeed
_OUTPUT_PUTS = 3  # model, report, plot


@dataclass
class JobAccount:
    """What a job has used so far, in the units the cost model prices."""

    wall_seconds: float = 0.0
    worker_seconds: float = 0.0
    rounds: int = 1
    worker_invocations: int = 0
    object_gets: int = 0
    object_puts: int = 0  # checkpoints (outputs are added here)
    reports: int = 0
    directives: int = 0
    # The outputs' PUTs (model, report, plot) a job in a pack is priced for: those its
    # report writes (a job paused at a rung writes none). A lone job's meter prices all three.
    output_puts: int = 3


_PACKED: ContextVar[bool] = ContextVar("ebb_packed", default=False)


@contextlib.contextmanager
def packed() -> Iterator[None]:
    """Within: the jobs metered are trained inside a trial pack (see the module doc)."""
    token = _PACKED.set(True)
    try:
        yield
    finally:
        _PACKED.reset(token)


def usage_of(spec, account: JobAccount) -> Usage:
    """The AWS usage a job with ``spec`` would have had for what ``account`` measured."""
    usage = Usage(
        worker_seconds=account.worker_seconds,
        memory_mb=spec.aws.memory_mb,
        supervisor_seconds=account.wall_seconds,
        supervisor_memory_mb=spec.aws.supervisor_memory_mb,
        arch=spec.aws.arch,
        invocations=account.worker_invocations + account.rounds,
        wall_seconds=account.wall_seconds,
        cache_node_type=spec.aws.cache_node_type,
        cache_nodes=spec.aws.cache_nodes,
        s3_get=account.object_gets,
        s3_put=account.object_puts + _OUTPUT_PUTS,
        sfn_transitions=_STATES_PER_JOB + account.rounds * _STATES_PER_ROUND + 2 * account.worker_invocations,
    )
    if _PACKED.get():  # the execution and its invocations are the pack's
        usage.invocations = usage.sfn_transitions = 0
        usage.s3_put = account.object_puts + account.output_puts
    if spec.aws.signal_channel == "sns_sqs":
        usage.sqs_chunks = 3 * account.reports  # send, receive, delete (reports are < 64 KB)
        usage.sns_chunks = account.directives
    return usage


def meter_for(spec) -> Callable[[JobAccount], dict]:
    """A cost meter: ``meter(account) -> estimate_cost(...)`` for a job with ``spec``."""
    prices = load_prices()
    return lambda account: estimate_cost(usage_of(spec, account), prices)


def pack_usage(
    spec, *, seconds: float, waves: int, object_gets: int, object_puts: int = 0, transitions: int = 0
) -> Usage:
    """What a trial pack pays once, beside its jobs (``packed``): one execution of ``waves``
    rounds of invocations (a fleet of ``spec.workers`` and a supervisor, each wave re-invoked
    warm when the last reached the functions' time limit), billed for ``seconds`` of fleet
    time (its cold start and loading the data before the first job trains, the search's
    decisions between jobs), the S3 requests those made, and ``transitions`` more states
    (a stack's pack passes each job's own states: Validate, NextJob, ...)."""
    workers = spec.workers
    return Usage(
        worker_seconds=workers * seconds,
        memory_mb=spec.aws.memory_mb,
        supervisor_seconds=seconds,
        supervisor_memory_mb=spec.aws.supervisor_memory_mb,
        arch=spec.aws.arch,
        invocations=waves * (workers + 1),
        wall_seconds=seconds,
        cache_node_type=spec.aws.cache_node_type,
        cache_nodes=spec.aws.cache_nodes,
        s3_get=object_gets,
        s3_put=object_puts,
        sfn_transitions=_STATES_PER_JOB + waves * (_STATES_PER_ROUND + 2 * workers) + transitions,
    )


def pack_cost(
    spec, *, seconds: float, waves: int, object_gets: int, object_puts: int = 0, transitions: int = 0
) -> dict:
    """``pack_usage`` priced (``estimate_cost``'s form)."""
    usage = pack_usage(
        spec, seconds=seconds, waves=waves, object_gets=object_gets, object_puts=object_puts, transitions=transitions
    )
    return estimate_cost(usage, load_prices())
