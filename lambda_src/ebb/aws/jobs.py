"""A job's places on AWS, resolved from its id: the data-access layer of the handlers.

Object keys (docs/AWS.md): the normalised spec at ``jobs/<id>/spec.json``, outputs under
the spec's ``out`` (default ``s3://<bucket>/jobs/<id>``), checkpoints under
``checkpoints/<id>/``, channel overflow under ``scratch/<id>/``. Imports stay light here:
the zip functions (validate, on_failure) have no numpy or torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

from ebb.aws.config import AwsConfig
from ebb.ports.keys import PROGRESS_KEY
from ebb.ports.objects import ObjectStore
from ebb.spec import JobSpec
from ebb.stores import open_object_store


def spec_key(job_id: str) -> str:
    return f"jobs/{job_id}/spec.json"


@dataclass
class Job:
    config: AwsConfig
    job_id: str
    spec: JobSpec

    @classmethod
    def load(cls, config: AwsConfig, job_id: str, key: str) -> Job:
        raw = cls.bucket_store(config).get(key)
        return cls(config, job_id, JobSpec.model_validate_json(raw))

    @staticmethod
    def bucket_store(config: AwsConfig) -> ObjectStore:
        return open_object_store(f"s3://{config.bucket}")

    @cached_property
    def data(self) -> ObjectStore:
        return open_object_store(self.spec.data)

    @cached_property
    def out(self) -> ObjectStore:
        return open_object_store(self.spec.out_location)

    @cached_property
    def checkpoints(self) -> ObjectStore:
        return open_object_store(f"s3://{self.config.bucket}/checkpoints/{self.job_id}")

    @cached_property
    def scratch(self) -> ObjectStore:
        return open_object_store(f"s3://{self.config.bucket}/scratch/{self.job_id}")

    @cached_property
    def cache(self):
        """The job's stores on the deployment's cache (TLS, AUTH token from Secrets Manager)."""
        from ebb.stores.elasticache import open_cache

        return open_cache(self.redis_job, environ=self.config.env)

    def update_store(self):
        """Where the steps' updates go: the deployment's cache."""
        return self.cache.updates

    def channel(self, round_: int):
        """The signal channel of one round: Redis or SNS/SQS, as the spec says."""
        if self.spec.aws.signal_channel == "sns_sqs":
            from ebb.stores.sns_sqs import SnsSqsSignalChannel

            return SnsSqsSignalChannel.from_env(self.redis_job, round_, self.scratch, environ=self.config.env)
        return self.cache.channel(round_)

    @property
    def redis_job(self) -> str:
        """The job's namespace in the shared cache: the execution's id, unique per run."""
        return self.job_id

    def write_progress(self, progress: dict) -> None:
        self.out.put(PROGRESS_KEY, json.dumps(progress, separators=(",", ":")).encode())


class JobSpecError(ValueError):
    """The execution's job spec cannot run on this deployment (the message names the field)."""


def normalise_for_aws(spec: JobSpec, config: AwsConfig, job_id: str) -> JobSpec:
    """The spec as it runs here: bucket-relative locations made s3:// URLs, outputs under
    ``jobs/<id>``, and what the deployment cannot do refused with the field's name."""
    bucket = f"s3://{config.bucket}"

    def absolute(location: str) -> str:
        return location if location.startswith("s3://") else f"{bucket}/{location.lstrip('/')}"

    if spec.redis_urls:
        raise JobSpecError("redis_urls: a deployed job uses the stack's cache; remove the field")
    if spec.workers > config.max_workers:
        raise JobSpecError(f"workers: {spec.workers} is more than this deployment's {config.max_workers} "
                           "(CDK context ebb:maxWorkers)")
    grows = max([spec.workers] + [e.workers for e in spec.scaling.schedule])
    if spec.scaling.policy == "schedule" and grows > spec.workers:
        raise JobSpecError(f"scaling.schedule: {grows} workers is more than the {spec.workers} the job starts with; "
                           "on AWS a schedule may only remove workers (start with the most you need)")
    update: dict = {"data": absolute(spec.data), "out": absolute(spec.out) if spec.out else f"{bucket}/jobs/{job_id}"}
    if spec.prepare is not None:
        if not update["data"].startswith(f"{bucket}/datasets/"):
            raise JobSpecError(f"data: with a prepare section, data must be under datasets/ in the bucket (the "
                               f"Prepare function writes only there), got {spec.data}")
        prepare = spec.prepare.model_copy(update={
            "input": absolute(spec.prepare.input),
            "test_input": absolute(spec.prepare.test_input) if spec.prepare.test_input else None})
        update["prepare"] = prepare
    return spec.model_copy(update=update)
