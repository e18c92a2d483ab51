"""Storage: the bucket for datasets, checkpoints, models and reports, plus its access logs.

Or, with `existing_bucket_name`, a bucket that outlives deployments (one kept by an earlier
deployment with ebb:retainData): the stack then only grants access to it, and the bucket
keeps the lifecycle rules it was created with.

Unless they are kept (ebb:retainData), `cdk destroy` empties both buckets before deleting
them (CDK's auto-delete custom resource): CloudFormation deletes no bucket that holds objects.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_s3 as s3
from constructs import Construct

from ebb.ports.deployment import CHECKPOINTS, SCRATCH


class Storage(Construct):
    """Encrypted, SSL-only, versioned buckets; nothing public. Checkpoints and scratch expire."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        retain: bool,
        existing_bucket_name: str | None,
        checkpoint_expiry_days: int,
        scratch_expiry_days: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.access_logs: s3.IBucket | None = None
        if existing_bucket_name:
            self.data: s3.IBucket = s3.Bucket.from_bucket_name(self, "Data", existing_bucket_name)
            return
        removal = RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY
        common = {
            "encryption": s3.BucketEncryption.S3_MANAGED,
            "enforce_ssl": True,
            "block_public_access": s3.BlockPublicAccess.BLOCK_ALL,
            "object_ownership": s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            "removal_policy": removal,
            "auto_delete_objects": not retain,
        }
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            **common,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(90))],
        )
        Validations.of(self.access_logs).acknowledge(
            Acknowledgment(
                id="AwsSolutions-S1", reason="This is the access-log bucket itself; logging it into itself would loop."
            )
        )
        self.data = s3.Bucket(
            self,
            "Data",
            **common,
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="data/",
            lifecycle_rules=[
                s3.LifecycleRule(id="OldVersions", noncurrent_version_expiration=Duration.days(30)),
                # A finished job needs its checkpoints no more (finalize has merged the replicas);
                # a failed one can be resumed for a while. Versioning keeps each old checkpoint
                # object as a noncurrent version: expire those quickly too, they are large.
                s3.LifecycleRule(
                    id="Checkpoints",
                    prefix=CHECKPOINTS,
                    expiration=Duration.days(checkpoint_expiry_days),
                    noncurrent_version_expiration=Duration.days(1),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
                # Signal payloads sent by pointer live for one step.
                s3.LifecycleRule(
                    id="Scratch",
                    prefix=SCRATCH,
                    expiration=Duration.days(scratch_expiry_days),
                    noncurrent_version_expiration=Duration.days(1),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
                s3.LifecycleRule(id="ExpiredDeleteMarkers", expired_object_delete_marker=True),
            ],
        )
