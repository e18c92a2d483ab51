"""Live cost of a running job: what the supervisor measured, priced as the job's AWS
configuration (``spec.aws``) would be billed.

The mapping, stated once: every worker is a Lambda billed from its launch until it
leaves or finishes, at ``aws.memory_mb``; the supervisor is billed for the whole wall
time; each worker and the supervisor is one invocation per round of
``round_seconds``; the cache is billed pro rata for the wall time; each object-store
read a worker makes is one S3 GET, the model, report and plot are PUTs; with the SNS/SQS
channel every step costs one SQS send per report, one SNS publish per directive and one
SQS receive + delete per worker; Step Functions counts the states of each round.
"""

from __future__ import annotations

import math
from typing import Callable

from ebb.cost.model import Usage, estimate_cost, load_prices

_STATES_PER_ROUND = 6  # validate/prepare, parallel, supervisor, map, choice, finalize
_OUTPUT_PUTS = 3  # model, report, plot


def usage_of(spec, supervisor) -> Usage:
    """The AWS usage a job with ``spec`` would have had for what ``supervisor`` measured."""
    wall = supervisor.elapsed()
    rounds = max(1, math.ceil(wall / spec.round_seconds))
    workers_launched = len(supervisor.started_at)
    usage = Usage(
        worker_seconds=supervisor.worker_seconds(), memory_mb=spec.aws.memory_mb,
        supervisor_seconds=wall, supervisor_memory_mb=spec.aws.supervisor_memory_mb, arch=spec.aws.arch,
        invocations=rounds * (workers_launched + 1), wall_seconds=wall,
        cache_node_type=spec.aws.cache_node_type, cache_nodes=spec.aws.cache_nodes,
        s3_get=supervisor.totals.object_gets, s3_put=_OUTPUT_PUTS + workers_launched * rounds,
        sfn_transitions=rounds * (_STATES_PER_ROUND + 2 * workers_launched),
    )
    if spec.aws.signal_channel == "sns_sqs":
        reports = supervisor.totals.reports
        directives = supervisor.clock + 1
        usage.sqs_chunks = reports + 2 * reports  # send, receive, delete (reports are < 64 KB)
        usage.sns_chunks = directives
    return usage


def meter_for(spec) -> Callable[[object], dict]:
    """A cost meter for the supervisor: ``meter(supervisor) -> estimate_cost(...)``."""
    prices = load_prices()
    return lambda supervisor: estimate_cost(usage_of(spec, supervisor), prices)
