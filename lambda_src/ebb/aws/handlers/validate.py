"""Validate: the execution's job spec → the normalised spec in S3, or a clear error."""

from __future__ import annotations

from aws_lambda_powertools import Logger

from ebb.aws.config import aws_config
from ebb.aws.contract import ValidateEvent, ValidateResult
from ebb.aws.jobs import Job, JobSpecError, normalise_for_aws, spec_key
from ebb.ports.keys import MANIFEST_KEY
from ebb.spec import SpecError, parse_spec
from ebb.stores import open_object_store

logger = Logger(service="ebb-validate")


@logger.inject_lambda_context
def handler(event: dict, context) -> dict:
    req = ValidateEvent.model_validate(event)
    config = aws_config()
    logger.append_keys(job_id=req.execution)
    try:
        spec = normalise_for_aws(parse_spec(req.spec, "execution input"), config, req.execution)
    except SpecError as exc:
        raise JobSpecError(str(exc)) from None
    key = spec_key(req.execution)
    Job.bucket_store(config).put(key, spec.model_dump_json(indent=2).encode())
    prepare = spec.prepare is not None and not open_object_store(spec.data).exists(MANIFEST_KEY)
    logger.info("job validated", extra={"spec_key": key, "workers": spec.workers, "prepare": prepare})
    return ValidateResult(job_id=req.execution, spec_key=key, prepare=prepare,
                          workers=list(range(spec.workers))).model_dump()
