"""Storage: the bucket for datasets, checkpoints, models and reports, plus its access logs."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_s3 as s3
from constructs import Construct


class Storage(Construct):
    """Encrypted, SSL-only, versioned buckets; nothing public."""

    def __init__(self, scope: Construct, construct_id: str, *, retain: bool) -> None:
        super().__init__(scope, construct_id)
        removal = RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY
        common = dict(
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=removal,
            auto_delete_objects=False,
        )
        self.access_logs = s3.Bucket(
            self, "AccessLogs", **common,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(90))],
        )
        Validations.of(self.access_logs).acknowledge(Acknowledgment(
            id="AwsSolutions-S1", reason="This is the access-log bucket itself; logging it into itself would loop."))
        self.data = s3.Bucket(
            self, "Data", **common,
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="data/",
            lifecycle_rules=[s3.LifecycleRule(noncurrent_version_expiration=Duration.days(30))],
        )
