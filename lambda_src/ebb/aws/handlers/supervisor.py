"""Supervisor: one round of the control loop; returns finished or unfinished.

It stops, and tells the round's workers to (the update store's abort blob), within seconds
of the job's abort marker appearing: a state failed or the execution was stopped, and an
invocation Step Functions no longer waits for must not train on (docs/AWS.md, "Abort").
"""

from __future__ import annotations

from contextlib import nullcontext

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

from ebb.aws.config import aws_config
from ebb.aws.contract import RoundEvent, RoundResult
from ebb.aws.deployment import ROUND_MARGIN_S
from ebb.aws.jobs import Job, heartbeat_while
from ebb.aws.launcher import MapLauncher
from ebb.aws.metrics import CloudWatchSink
from ebb.cost.meter import packed
from ebb.engine.clock import wall
from ebb.engine.preflight import preflight
from ebb.engine.supervisor import Supervisor
from ebb.ports.keys import SUPERVISOR_SLOT

logger = Logger(service="ebb-supervisor")
copy_config_to_registered_loggers(source_logger=logger, include={"ebb"})


@logger.inject_lambda_context
def handler(event: dict, context) -> dict:
    req = RoundEvent.model_validate(event)
    logger.append_keys(job_id=req.job_id, round=req.round)
    job = Job.load(aws_config(), req.job_id, req.spec_key)
    round_seconds = context.get_remaining_time_in_millis() / 1000 - ROUND_MARGIN_S
    if round_seconds < ROUND_MARGIN_S / 3:
        raise RuntimeError(
            f"the supervisor function's timeout leaves {round_seconds:.0f} s for a round after its "
            f"{ROUND_MARGIN_S:g} s margin: give it a longer timeout (CDK context)"
        )
    updates = job.update_store()
    if req.round == 0:  # a broken dataset fails the job before anyone trains; the workers hear us meanwhile
        with heartbeat_while(lambda: updates.heartbeat(SUPERVISOR_SLOT, wall())):
            preflight(job.spec, job.data)
    sink = CloudWatchSink(job)
    supervisor = Supervisor(
        job.spec,
        data=job.data,
        checkpoints=job.checkpoints,
        updates=updates,
        signals=job.channel(req.round),
        launcher=MapLauncher(),
        round_=req.round,
        sink=sink,
        round_seconds=round_seconds,
        interrupted=job.abort_check(),
    )
    with packed() if req.packed else nullcontext():  # a trial pack's job: its execution is the pack's
        result = supervisor.run_round()
    sink.flush()
    logger.info("round over", extra={"step": result["steps"] - 1, "status": result["status"]})
    return RoundResult(**result).model_dump()
