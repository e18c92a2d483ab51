"""Compute: the six Lambda functions of docs/AWS.md, their code, environment and grants.

Worker, supervisor, prepare and finalize run from one container image built from
`lambda_src/` at deploy time (torch fits no layer); each function's image command names
its handler. Validate and on_failure are zip functions: the light part of the `ebb`
package plus the layer staged in `layers/common` (pydantic, pyyaml, powertools).

Only the worker and supervisor talk to Redis, so only they are in the VPC. Every
permission comes from a CDK grant scoped to the resource (and S3 prefix) it needs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Size, Stack, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.cache import Cache
from stacks.messaging import Messaging
from stacks.settings import FunctionSettings
from stacks.storage import CHECKPOINTS_PREFIX, SCRATCH_PREFIX

HANDLER = "ebb.aws.handlers.{name}.handler"
# What the zip functions cannot import (it needs numpy, torch, scipy, redis or rich) or
# never run (the CLI, the local runner); and the image's build files. The light floor
# stays (ebb/ports, the spec and its model catalogue), and of the engine its checkpoint
# layout and the supervisor's typed state: on_failure reads the last complete round's.
ZIP_EXCLUDES = [
    "**/__pycache__", "**/*.pyc", "*.egg-info", "Dockerfile", ".dockerignore", "requirements-image.txt",
    "ebb/autotune", "ebb/data", "ebb/engine/*", "!ebb/engine/__init__.py", "!ebb/engine/checkpoint.py",
    "!ebb/engine/state.py", "!ebb/engine/errors.py",
    "ebb/local", "ebb/models", "ebb/sparse.py", "ebb/cli.py", "ebb/flags.py", "ebb/stores/redis_store.py",
]
# `scripts/build_layer.sh` records the platform it staged the layer for in this file.
LAYER_STAMP = ".ebb-layer.json"
_PLATFORMS = {"x86_64": ecr_assets.Platform.LINUX_AMD64, "arm64": ecr_assets.Platform.LINUX_ARM64}
_ARCHITECTURES = {"x86_64": lambda_.Architecture.X86_64, "arm64": lambda_.Architecture.ARM_64}


class LayerMissingError(RuntimeError):
    """layers/common is not staged (or staged for the other architecture)."""


@dataclass(frozen=True)
class _Role:
    name: str             # handler module and POWERTOOLS_SERVICE_NAME suffix
    image: bool           # container image (True) or zip + layer
    in_vpc: bool          # talks to Redis


_ROLES = {
    "worker": _Role("worker", image=True, in_vpc=True),
    "supervisor": _Role("supervisor", image=True, in_vpc=True),
    "prepare": _Role("prepare", image=True, in_vpc=False),
    "finalize": _Role("finalize", image=True, in_vpc=False),
    "validate": _Role("validate", image=False, in_vpc=False),
    "onFailure": _Role("on_failure", image=False, in_vpc=False),
}


class Compute(Construct):
    """The functions, by name: worker, supervisor, prepare, finalize, validate, onFailure."""

    def __init__(self, scope: Construct, construct_id: str, *, lambda_src: Path, layer_dir: Path,
                 architecture: str, sizes: Mapping[str, FunctionSettings], log_retention: logs.RetentionDays,
                 removal_policy: RemovalPolicy, vpc: ec2.IVpc, vpc_subnets: ec2.SubnetSelection,
                 security_group: ec2.ISecurityGroup, bucket: s3.IBucket, cache: Cache, messaging: Messaging,
                 max_workers: int, metrics_namespace: str) -> None:
        super().__init__(scope, construct_id)
        layer = lambda_.LayerVersion(
            self, "CommonLayer",
            code=lambda_.Code.from_asset(str(check_layer(layer_dir, architecture))),
            compatible_runtimes=[lambda_.Runtime.PYTHON_3_11],
            compatible_architectures=[_ARCHITECTURES[architecture]],
            description="pydantic, pyyaml and aws-lambda-powertools for the zip functions",
        )
        zip_code = lambda_.Code.from_asset(str(lambda_src), exclude=ZIP_EXCLUDES)

        common_env = {"EBB_BUCKET": bucket.bucket_name, "EBB_METRICS_NAMESPACE": metrics_namespace}
        redis_env = {"EBB_REDIS_URLS": cache.urls, "EBB_REDIS_CLUSTER": cache.cluster,
                     "EBB_REDIS_SECRET_ARN": cache.auth_secret.secret_arn}
        env = {
            "worker": {**common_env, **redis_env,
                       "EBB_SUPERVISOR_QUEUE_URL": messaging.supervisor_queue.queue_url,
                       "EBB_WORKER_QUEUE_URL_PREFIX": messaging.worker_queue_url_prefix,
                       "EBB_MAX_WORKERS": str(max_workers)},
            "supervisor": {**common_env, **redis_env,
                           "EBB_CONTROL_TOPIC_ARN": messaging.control_topic.topic_arn,
                           "EBB_SUPERVISOR_QUEUE_URL": messaging.supervisor_queue.queue_url,
                           "EBB_MAX_WORKERS": str(max_workers)},
            "prepare": dict(common_env),
            "finalize": {**common_env, "EBB_EVENTS_TOPIC_ARN": messaging.events_topic.topic_arn},
            "validate": {**common_env, "EBB_MAX_WORKERS": str(max_workers)},
            "onFailure": {**common_env, "EBB_EVENTS_TOPIC_ARN": messaging.events_topic.topic_arn},
        }

        self.functions: dict[str, lambda_.Function] = {}
        for key, role in _ROLES.items():
            size = sizes[key]
            log_group = logs.LogGroup(self, f"{key[0].upper()}{key[1:]}Logs", retention=log_retention,
                                      removal_policy=removal_policy)
            options = {
                "architecture": _ARCHITECTURES[architecture],
                "memory_size": size.memory_mb,
                "timeout": Duration.seconds(size.timeout_seconds),
                "reserved_concurrent_executions": size.reserved_concurrency,
                "ephemeral_storage_size": Size.mebibytes(size.ephemeral_mb),
                "tracing": lambda_.Tracing.ACTIVE,
                "log_group": log_group,
                "environment": {**env[key], "POWERTOOLS_SERVICE_NAME": f"ebb-{role.name.replace('_', '-')}"},
                "description": f"Ebb {role.name} (ebb.aws.handlers.{role.name})",
            }
            if role.in_vpc:
                options.update(vpc=vpc, vpc_subnets=vpc_subnets, security_groups=[security_group])
            construct_name = f"{key[0].upper()}{key[1:]}"
            if role.image:
                function = lambda_.DockerImageFunction(
                    self, construct_name,
                    code=lambda_.DockerImageCode.from_image_asset(
                        str(lambda_src), cmd=[HANDLER.format(name=role.name)], platform=_PLATFORMS[architecture]),
                    **options)
            else:
                function = lambda_.Function(
                    self, construct_name, runtime=lambda_.Runtime.PYTHON_3_11,
                    handler=HANDLER.format(name=role.name), code=zip_code, layers=[layer], **options)
                Validations.of(function).acknowledge(Acknowledgment(
                    id="AwsSolutions-L1",
                    reason="Python 3.11 on purpose: the container image, the layer's compiled wheels "
                           "(pydantic-core) and the engine's tests all use 3.11; one interpreter everywhere."))
            self.functions[key] = function

        self._grant(bucket, cache, messaging)
        for key, function in self.functions.items():
            _acknowledge_role_findings(function, in_vpc=_ROLES[key].in_vpc)
        self._acknowledge_prefix_grants(bucket)

    @property
    def worker(self) -> lambda_.Function:
        return self.functions["worker"]

    def _grant(self, bucket: s3.IBucket, cache: Cache, messaging: Messaging) -> None:
        f = self.functions
        # A spec's data may sit under any prefix of the bucket, so every function reads the bucket;
        # writes are confined to the prefixes of docs/AWS.md "Object keys".
        for function in f.values():
            bucket.grant_read(function)
        for key in ("worker", "supervisor"):
            bucket.grant_read_write(f[key], f"{CHECKPOINTS_PREFIX}*")
            bucket.grant_read_write(f[key], f"{SCRATCH_PREFIX}*")
            cache.auth_secret.grant_read(f[key])
        bucket.grant_put(f["prepare"], "datasets/*")
        for key in ("validate", "finalize", "onFailure"):
            bucket.grant_put(f[key], "jobs/*")
        bucket.grant_delete(f["finalize"], f"{CHECKPOINTS_PREFIX}*")

        for queue in messaging.worker_queues:
            queue.grant_consume_messages(f["worker"])
        messaging.supervisor_queue.grant_send_messages(f["worker"])
        messaging.supervisor_queue.grant_consume_messages(f["supervisor"])
        messaging.control_topic.grant_publish(f["supervisor"])
        messaging.events_topic.grant_publish(f["finalize"])
        messaging.events_topic.grant_publish(f["onFailure"])


    def _acknowledge_prefix_grants(self, bucket: s3.IBucket) -> None:
        """cdk-nag names each object-ARN wildcard of the grants above; each one is a key prefix."""
        created = bucket.node.default_child
        arn = (f"<{Stack.of(self).get_logical_id(created)}.Arn>" if created is not None
               else f"arn:<AWS::Partition>:s3:::{bucket.bucket_name}")  # a bucket the stack imported
        for pattern, why in (
            ("/*", "reads of any object: a job's data may sit under any prefix of the bucket"),
            (f"/{CHECKPOINTS_PREFIX}*",
             "worker and supervisor write their round checkpoints here; finalize removes them"),
            (f"/{SCRATCH_PREFIX}*",
             "the SNS/SQS channel's payloads over 256 KB, written and removed by worker and supervisor"),
            ("/datasets/*", "prepare writes a dataset's minibatches and manifest only here"),
            ("/jobs/*", "validate writes the normalised spec, finalize and on_failure the job's outputs, only here"),
        ):
            Validations.of(self).acknowledge(Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{arn}{pattern}]", reason=f"Object keys under one prefix: {why}."))


def check_layer(layer_dir: Path, architecture: str) -> Path:
    """`layer_dir` if it holds a layer staged for `architecture`; else a LayerMissingError saying what to run."""
    build = "bash scripts/build_layer.sh" + (" --arch arm64" if architecture == "arm64" else "")
    python = layer_dir / "python"
    if not python.is_dir() or not any(python.iterdir()):
        raise LayerMissingError(
            f"the Lambda layer folder {python} is missing or empty: run `{build}` "
            "(scripts/setup.sh does it) before `cdk synth` or `cdk deploy`")
    stamp = layer_dir / LAYER_STAMP
    staged_for = json.loads(stamp.read_text()).get("architecture") if stamp.is_file() else None
    if staged_for != architecture:
        raise LayerMissingError(
            f"the Lambda layer in {layer_dir} was staged for {staged_for or 'an unknown platform'}, "
            f"but ebb:architecture is {architecture}: run `{build}`")
    return layer_dir


def _acknowledge_role_findings(function: lambda_.Function, *, in_vpc: bool) -> None:
    """The cdk-nag findings the function roles share, each for a reason that holds for all of them."""
    role = function.role
    managed = [("service-role/AWSLambdaBasicExecutionRole",
                "The AWS-maintained minimum for writing the function's own log streams.")]
    if in_vpc:
        managed.append(("service-role/AWSLambdaVPCAccessExecutionRole",
                        ("The AWS-maintained minimum for Lambda's VPC network interfaces "
                         "(EC2 ENI actions take no resource scope).")))
    for policy, why in managed:
        Validations.of(role).acknowledge(Acknowledgment(
            id=f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{policy}]", reason=why))
    for finding, why in (
        ("Resource::*", "X-Ray's PutTraceSegments and PutTelemetryRecords take no resource scope (active tracing)."),
        ("Action::s3:GetObject*", "CDK's bucket read grant: GetObject and its version and attribute variants."),
        ("Action::s3:GetBucket*", "CDK's bucket read grant: the bucket's location and metadata."),
        ("Action::s3:List*", "CDK's bucket read grant: listing the bucket (datasets, checkpoints)."),
        ("Action::s3:DeleteObject*", ("CDK's delete grant, on checkpoints/ and scratch/ only: their writers "
                                      "remove old checkpoints and signal payloads.")),
        ("Action::s3:Abort*", "CDK's put grant: aborting its own multipart uploads (large checkpoints, datasets)."),
        ("Action::kms:GenerateDataKey*", ("CDK's publish grant on an encrypted topic: data keys from the topics' "
                                          "own KMS key, which encrypts nothing else.")),
    ):
        Validations.of(role).acknowledge(Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=why))
