"""Validate: the execution's job spec → the normalised spec in S3, or a clear error.

The execution input's control fields (``JobControl``) are taken out of the spec first: a
given ``job_id`` (a trial's executions share one, and with it the spec, outputs and
checkpoints), ``resume`` (the rounds start after the checkpoints' last complete round,
with no fresh start), ``pause_after_steps`` (carried in the state to the Choice after
each round) and ``pack`` (a trial pack's job: carried to its NextJob, and ``packed`` to every
handler of the job). The spec is fitted to this deployment (docs/AWS.md, "Validate"): its locations to what the
functions may read and write, its pricing to the deployed functions, its rounds to the
execution's history and its fleet to the account's Lambda concurrency.
"""

from __future__ import annotations

import os

from aws_lambda_powertools import Logger

from ebb.aws.config import aws_config
from ebb.aws.contract import ValidateEvent, ValidateResult
from ebb.aws.deployment import Deployment, account_settings
from ebb.aws.jobs import Job, JobSpecError, normalise_for_aws, resume_point, split_control
from ebb.ports.deployment import spec_key
from ebb.ports.keys import MANIFEST_KEY
from ebb.ports.manifest import load_manifest
from ebb.spec import SpecError, parse_spec
from ebb.stores import open_object_store

logger = Logger(service="ebb-validate")


@logger.inject_lambda_context
def handler(event: dict, context) -> dict:
    req = ValidateEvent.model_validate(event)
    config = aws_config()
    fields, control = split_control(req.spec)
    job_id = control.job_id or req.execution
    logger.append_keys(job_id=job_id, execution=req.execution)
    deployment = Deployment.from_env(config.env)
    try:
        spec = deployment.priced(normalise_for_aws(parse_spec(fields, "execution input"), config, job_id))
    except SpecError as exc:
        raise JobSpecError(str(exc)) from None
    data = open_object_store(spec.data)
    manifest = load_manifest(data, spec.data) if data.exists(MANIFEST_KEY) else None
    deployment.check_history(
        spec, train_parts=manifest and len(manifest.train.parts), has_val=bool(manifest and manifest.val.parts)
    )
    deployment.check_concurrency(spec.workers, account_settings(), os.environ.get("AWS_REGION", "this region"))
    round_, workers = resume_point(config, job_id, spec.workers) if control.resume else (0, list(range(spec.workers)))
    key = spec_key(job_id)
    Job.bucket_store(config).put(key, spec.model_dump_json(indent=2).encode())
    prepare = spec.prepare is not None and manifest is None and round_ == 0
    logger.info(
        "job validated",
        extra={"spec_key": key, "workers": workers, "round": round_, "prepare": prepare, "aws": spec.aws.model_dump()},
    )
    return ValidateResult(
        job_id=job_id,
        spec_key=key,
        prepare=prepare,
        round=round_,
        workers=workers,
        pause_after_steps=control.pause_after_steps,
        pack=control.pack,
        packed=control.pack is not None,
    ).model_dump()
