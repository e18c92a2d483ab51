"""Worker: one round of one worker (from its checkpoint, or from the start)."""

from __future__ import annotations

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

from ebb.aws.config import aws_config
from ebb.aws.contract import WorkerEvent, WorkerResult
from ebb.aws.jobs import Job
from ebb.engine.worker import start_worker
from ebb.ports.keys import worker_key
from ebb.ports.launcher import WorkerStart

logger = Logger(service="ebb-worker")
copy_config_to_registered_loggers(source_logger=logger, include={"ebb"})


@logger.inject_lambda_context
def handler(event: dict, context) -> dict:
    req = WorkerEvent.model_validate(event)
    logger.append_keys(job_id=req.job_id, round=req.round, worker=req.worker)
    job = Job.load(aws_config(), req.job_id, req.spec_key)
    if req.packed:  # a trial pack: this warm function keeps the training split for the pack's next jobs
        job.keep_warm()
    start = WorkerStart(
        worker=req.worker,
        members=list(range(job.spec.workers)),
        round=req.round,
        resume=worker_key(req.round - 1, req.worker) if req.round > 0 else None,
    )
    worker = start_worker(
        job.spec,
        start,
        data=job.data,
        checkpoints=job.checkpoints,
        updates=job.update_store(),
        signals=job.channel(req.round),
    )
    outcome = worker.run()
    logger.info("round over", extra={"step": worker.applied_upto, "outcome": outcome})
    return WorkerResult(worker=req.worker, outcome=outcome).model_dump()
