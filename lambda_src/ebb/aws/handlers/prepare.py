"""Prepare: a raw dataset in S3 → minibatches and manifest in S3 (the spec's ``prepare``)."""

from __future__ import annotations

from aws_lambda_powertools import Logger

from ebb.aws.config import aws_config
from ebb.aws.contract import JobRef, PrepareResult
from ebb.aws.jobs import Job
from ebb.data.prepare import prepare_from_spec
from ebb.ports.keys import MANIFEST_KEY

logger = Logger(service="ebb-prepare")


@logger.inject_lambda_context
def handler(event: dict, context) -> dict:
    ref = JobRef.model_validate(event)
    logger.append_keys(job_id=ref.job_id)
    job = Job.load(aws_config(), ref.job_id, ref.spec_key)
    manifest = prepare_from_spec(job.spec.prepare, job.data)
    logger.info("dataset prepared", extra={"train_parts": len(manifest.train.parts), "data": job.spec.data})
    return PrepareResult(
        manifest_key=f"{job.spec.data}/{MANIFEST_KEY}",
        train_parts=len(manifest.train.parts),
        train_rows=manifest.train.rows,
        test_rows=manifest.test.rows,
        val_rows=manifest.val.rows,
    ).model_dump()
