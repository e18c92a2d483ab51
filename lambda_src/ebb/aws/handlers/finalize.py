"""Finalize: merge, score, write model, report.json and plot to S3; publish "job finished"."""

from __future__ import annotations

import time
from contextlib import nullcontext

from aws_lambda_powertools import Logger

from ebb.aws.config import aws_config
from ebb.aws.contract import FinalizeResult, JobRef
from ebb.aws.jobs import Job
from ebb.aws.notify import publish_job_event
from ebb.cost.meter import packed
from ebb.engine.finalize import finalize
from ebb.ports import deployment as names
from ebb.ports.keys import MODEL_KEY, REPORT_KEY

logger = Logger(service="ebb-finalize")


@logger.inject_lambda_context
def handler(event: dict, context) -> dict:
    ref = JobRef.model_validate(event)
    logger.append_keys(job_id=ref.job_id)
    config = aws_config()
    job = Job.load(config, ref.job_id, ref.spec_key)
    with packed() if ref.packed else nullcontext():  # a trial pack's job: priced as the pack's
        report, _ = finalize(job.spec, data=job.data, checkpoints=job.checkpoints, out=job.out)
    out = job.spec.out_location.rstrip("/")
    job.write_progress(
        {
            "state": "finished",
            "status": report["status"],
            "step": report["steps"] - 1,
            "round": report["rounds"] - 1,
            "cost_usd": report["cost"]["total_usd"],
            "updated_at": time.time(),
        }
    )
    publish_job_event(
        config,
        names.JOB_FINISHED,
        ref.job_id,
        {
            "status": report["status"],
            "steps": report["steps"],
            "test_metrics": report["test_metrics"],
            "cost_usd": report["cost"]["total_usd"],
            "report": f"{out}/{REPORT_KEY}",
        },
    )
    logger.info("job finished", extra={"status": report["status"], "step": report["steps"] - 1})
    return FinalizeResult(
        status=report["status"], report_key=f"{out}/{REPORT_KEY}", model_key=f"{out}/{MODEL_KEY}"
    ).model_dump()
