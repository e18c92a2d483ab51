"""Compute: the eight Lambda functions of docs/AWS.md, their code, environment and grants.

Worker, supervisor, prepare, finalize, predict and tune run from one container image built from
`lambda_src/` at deploy time (torch fits no layer); each function's image command names
its handler. Validate and on_failure are zip functions: the light part of the `ebb`
package plus the layer staged in `layers/common` (pydantic, pyyaml, powertools).

Only the worker and supervisor talk to Redis, so only they are in the VPC. Every
permission comes from a CDK grant scoped to the resource it needs; a function writes to
the bucket exactly where `ebb.ports.deployment.PUT` and `DELETE` say the runtime writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Size, Stack, Token, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from ebb.ports import deployment as names
from stacks.cache import Cache
from stacks.image import image_python
from stacks.messaging import Messaging
from stacks.settings import FunctionSettings

HANDLER = "ebb.aws.handlers.{name}.handler"
# The tune function's handler sits with the search it runs, above the AWS layer.
TUNE_HANDLER = "ebb.tune.handler.handler"
# What the zip functions cannot import (it needs numpy, torch, scipy, redis or rich) or
# never run (the CLI, the local runner); and the image's build files. The light floor
# stays (ebb/ports, the spec and its model catalogue), and of the engine its checkpoint
# layout and the supervisor's typed state: on_failure reads the last complete round's.
ZIP_EXCLUDES = [
    "**/__pycache__",
    "**/*.pyc",
    "**/*.so",
    "*.egg-info",
    "Dockerfile",
    ".dockerignore",
    "requirements-image.txt",
    "ebb/autotune",
    "ebb/data",
    "ebb/engine/*",
    "!ebb/engine/__init__.py",
    "!ebb/engine/checkpoint.py",
    "!ebb/engine/state.py",
    "!ebb/engine/errors.py",
    "ebb/local",
    "ebb/models",
    "ebb/predict",
    "ebb/sparse.py",
    "ebb/cli.py",
    "ebb/flags.py",
    "ebb/stores/redis_store.py",
]
# `scripts/build_layer.sh` records the platform it staged the layer for in this file.
LAYER_STAMP = ".ebb-layer.json"
_PLATFORMS = {"x86_64": ecr_assets.Platform.LINUX_AMD64, "arm64": ecr_assets.Platform.LINUX_ARM64}
_ARCHITECTURES = {"x86_64": lambda_.Architecture.X86_64, "arm64": lambda_.Architecture.ARM_64}


class LayerMissingError(RuntimeError):
    """layers/common is not staged (or staged for the other architecture)."""


@dataclass(frozen=True)
class _Role:
    name: str  # handler module and POWERTOOLS_SERVICE_NAME suffix
    image: bool  # container image (True) or zip + layer
    in_vpc: bool  # talks to Redis
    handler: str | None = None  # the handler, where it is not HANDLER's

    @property
    def command(self) -> str:
        return self.handler or HANDLER.format(name=self.name)


_ROLES = {
    "worker": _Role("worker", image=True, in_vpc=True),
    "supervisor": _Role("supervisor", image=True, in_vpc=True),
    "prepare": _Role("prepare", image=True, in_vpc=False),
    "finalize": _Role("finalize", image=True, in_vpc=False),
    "validate": _Role("validate", image=False, in_vpc=False),
    "onFailure": _Role("on_failure", image=False, in_vpc=False),
    "predict": _Role("predict", image=True, in_vpc=False),
    "tune": _Role("tune", image=True, in_vpc=False, handler=TUNE_HANDLER),
}


class Compute(Construct):
    """The functions, by name: worker, supervisor, prepare, finalize, validate, onFailure, predict, tune.

    `trace_in_vpc`: whether the in-VPC functions can reach X-Ray (a NAT gateway or an
    `xray` interface endpoint); without a route their traces would be lost, so they send
    none. `deployment` is what Validate learns of the deployment (`EBB_DEPLOYMENT`: memory,
    architecture, cache, concurrency, Map mode).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        lambda_src: Path,
        layer_dir: Path,
        architecture: str,
        sizes: Mapping[str, FunctionSettings],
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
        vpc: ec2.IVpc,
        vpc_subnets: ec2.SubnetSelection,
        security_group: ec2.ISecurityGroup,
        bucket: s3.IBucket,
        cache: Cache,
        messaging: Messaging,
        max_workers: int,
        trace_in_vpc: bool,
        deployment: Mapping[str, object],
    ) -> None:
        super().__init__(scope, construct_id)
        python = image_python(lambda_src)
        runtime = lambda_.Runtime(f"python{python}", lambda_.RuntimeFamily.PYTHON)
        layer = lambda_.LayerVersion(
            self,
            "CommonLayer",
            code=lambda_.Code.from_asset(str(check_layer(layer_dir, architecture, python))),
            compatible_runtimes=[runtime],
            compatible_architectures=[_ARCHITECTURES[architecture]],
            description="pydantic, pyyaml and aws-lambda-powertools for the zip functions",
        )
        zip_code = lambda_.Code.from_asset(str(lambda_src), exclude=ZIP_EXCLUDES)

        common_env = {names.BUCKET_ENV: bucket.bucket_name, names.METRICS_NAMESPACE_ENV: names.METRICS_NAMESPACE}
        redis_env = {
            names.REDIS_URLS_ENV: cache.urls,
            names.REDIS_CLUSTER_ENV: cache.cluster,
            names.REDIS_SECRET_ENV: cache.auth_secret.secret_arn,
        }
        workers = {names.MAX_WORKERS_ENV: str(max_workers)}
        events = {names.EVENTS_TOPIC_ENV: messaging.events_topic.topic_arn}
        env = {
            "worker": {
                **common_env,
                **redis_env,
                **workers,
                names.SUPERVISOR_QUEUE_ENV: messaging.supervisor_queue.queue_url,
                names.WORKER_QUEUE_PREFIX_ENV: messaging.worker_queue_url_prefix,
            },
            "supervisor": {
                **common_env,
                **redis_env,
                **workers,
                names.CONTROL_TOPIC_ENV: messaging.control_topic.topic_arn,
                names.SUPERVISOR_QUEUE_ENV: messaging.supervisor_queue.queue_url,
            },
            "prepare": dict(common_env),
            "finalize": {**common_env, **events},
            "validate": {
                **common_env,
                **workers,
                names.DEPLOYMENT_ENV: json.dumps(dict(deployment), separators=(",", ":")),
            },
            "onFailure": {**common_env, **events},
            "predict": {**common_env, **workers},
            # the deployment: a trial pack's fixed cost priced at the deployed functions (as Validate prices a job)
            "tune": {**common_env, names.DEPLOYMENT_ENV: json.dumps(dict(deployment), separators=(",", ":"))},
        }

        stack_name = Stack.of(self).stack_name
        self.log_groups: dict[str, logs.LogGroup] = {}
        self.functions: dict[str, lambda_.Function] = {}
        for key, role in _ROLES.items():
            size = sizes[key]
            construct_name = f"{key[0].upper()}{key[1:]}"
            log_group = logs.LogGroup(
                self,
                f"{construct_name}Logs",
                log_group_name=log_group_name(stack_name, key),
                retention=log_retention,
                removal_policy=removal_policy,
            )
            traced = trace_in_vpc or not role.in_vpc
            options = {
                "architecture": _ARCHITECTURES[architecture],
                "memory_size": size.memory_mb,
                "timeout": Duration.seconds(size.timeout_seconds),
                "reserved_concurrent_executions": size.reserved_concurrency,
                "ephemeral_storage_size": Size.mebibytes(size.ephemeral_mb),
                "tracing": lambda_.Tracing.ACTIVE if traced else lambda_.Tracing.DISABLED,
                "log_group": log_group,
                "environment": {**env[key], names.SERVICE_NAME_ENV: names.service_name(role.name)},
                "description": f"Ebb {role.name} ({role.command.removesuffix('.handler')})",
            }
            if role.in_vpc:
                options.update(vpc=vpc, vpc_subnets=vpc_subnets, security_groups=[security_group])
            if role.image:
                function = lambda_.DockerImageFunction(
                    self,
                    construct_name,
                    code=lambda_.DockerImageCode.from_image_asset(
                        str(lambda_src), cmd=[role.command], platform=_PLATFORMS[architecture]
                    ),
                    **options,
                )
            else:
                function = lambda_.Function(
                    self,
                    construct_name,
                    runtime=runtime,
                    handler=role.command,
                    code=zip_code,
                    layers=[layer],
                    **options,
                )
                Validations.of(function).acknowledge(
                    Acknowledgment(
                        id="AwsSolutions-L1",
                        reason=f"Python {python} on purpose: the container image's base (lambda_src/Dockerfile) runs "
                        f"it, and the zip functions and their layer match it: one interpreter on AWS.",
                    )
                )
            self.functions[key] = function
            self.log_groups[key] = log_group

        self._grant(bucket, cache, messaging)
        for key, function in self.functions.items():
            _acknowledge_role_findings(
                function,
                in_vpc=_ROLES[key].in_vpc,
                traced=trace_in_vpc or not _ROLES[key].in_vpc,
                reads_account_settings=key in ("validate", "tune"),
            )
        self._acknowledge_prefix_grants(bucket)

    @property
    def worker(self) -> lambda_.Function:
        return self.functions["worker"]

    def _grant(self, bucket: s3.IBucket, cache: Cache, messaging: Messaging) -> None:
        f = self.functions
        # A spec's data may sit under any prefix of the bucket, so every function reads the bucket;
        # writes are confined to the keys the runtime writes (ebb.ports.deployment, docs/AWS.md "Object keys").
        for key, function in f.items():
            bucket.grant_read(function)
            name = _ROLES[key].name
            for pattern in names.PUT[name]:
                bucket.grant_put(function, pattern)
            for pattern in names.DELETE.get(name, ()):
                bucket.grant_delete(function, pattern)
        for key in ("worker", "supervisor"):
            cache.auth_secret.grant_read(f[key])
        # Validate checks that the account can run a round's invocations at once; tune caps a
        # pass's trials running together by it.
        for key in ("validate", "tune"):
            f[key].add_to_role_policy(iam.PolicyStatement(actions=["lambda:GetAccountSettings"], resources=["*"]))

        for queue in messaging.worker_queues:
            queue.grant_consume_messages(f["worker"])
        messaging.supervisor_queue.grant_send_messages(f["worker"])
        messaging.supervisor_queue.grant_consume_messages(f["supervisor"])
        messaging.control_topic.grant_publish(f["supervisor"])
        messaging.events_topic.grant_publish(f["finalize"])
        messaging.events_topic.grant_publish(f["onFailure"])

    def _acknowledge_prefix_grants(self, bucket: s3.IBucket) -> None:
        """cdk-nag names each object-ARN wildcard of the grants above; each one is a key pattern."""
        created = bucket.node.default_child
        arn = (
            f"<{Stack.of(self).get_logical_id(created)}.Arn>"
            if created is not None
            else f"arn:{nag_partition(self)}:s3:::{bucket.bucket_name}"
        )  # a bucket the stack imported
        patterns = {p for grants in (names.PUT, names.DELETE) for ps in grants.values() for p in ps}
        for pattern in sorted(patterns | {"*"}):
            Validations.of(self).acknowledge(
                Acknowledgment(
                    id=f"AwsSolutions-IAM5[Resource::{arn}/{pattern}]",
                    reason=f"Object keys matching one pattern: {_WHY_WRITES[pattern]}.",
                )
            )


# Why each key pattern of ebb.ports.deployment.PUT / DELETE is granted (a new pattern needs a reason here).
_WHY_WRITES = {
    "*": "reads of any object: a job's data may sit under any prefix of the bucket",
    f"{names.CHECKPOINTS}*": "worker and supervisor write and remove their round checkpoints; finalize removes them",
    f"{names.SCRATCH}*": "the SNS/SQS channel's payloads over 256 KB, written and removed by worker and supervisor",
    f"{names.DATASETS}*": "prepare writes (and replaces) a dataset's minibatches and manifest only here",
    f"{names.JOBS}*": "finalize writes a job's outputs, on_failure its failed report and abort marker, only here",
    f"{names.JOBS}*/{names.SPEC_FILE}": "validate writes the normalised job spec, and nothing else",
    f"{names.JOBS}*/{names.PROGRESS_KEY}": "the supervisor writes the job's progress for `ebb watch`, nothing else",
    f"{names.PREDICTIONS}*": "the predict function writes a predict run's shards and manifest only here",
    f"{names.TUNES}*": "the tune function writes a search's state, leaderboard and best trial only here",
    f"{names.JOBS}*/{names.REPORT_KEY}": "the tune function adds a trial's share of its packs' cost to its report, "
    "and writes nothing else under jobs/",
}


def log_group_name(stack_name: str, function: str) -> str:
    """The log group of a function (README "Logs"): /ebb/<stack>/<function>."""
    return f"/ebb/{stack_name}/{_ROLES[function].name.replace('_', '-')}"


def nag_partition(scope: Construct) -> str:
    """How cdk-nag spells the partition in an ARN: the literal once the region is known
    (`@aws-cdk/core:enablePartitionLiterals`), else the pseudo parameter."""
    partition = Stack.of(scope).partition
    return "<AWS::Partition>" if Token.is_unresolved(partition) else partition


def check_layer(layer_dir: Path, architecture: str, python: str) -> Path:
    """`layer_dir` if it holds a layer staged for `architecture` and Python `python`; else a
    LayerMissingError saying what to run."""
    build = "bash scripts/build_layer.sh" + (" --arch arm64" if architecture == "arm64" else "")
    folder = layer_dir / "python"
    if not folder.is_dir() or not any(folder.iterdir()):
        raise LayerMissingError(
            f"the Lambda layer folder {folder} is missing or empty: run `{build}` "
            "(scripts/setup.sh does it) before `cdk synth` or `cdk deploy`"
        )
    stamp = layer_dir / LAYER_STAMP
    staged = json.loads(stamp.read_text()) if stamp.is_file() else {}
    if staged.get("architecture") != architecture:
        raise LayerMissingError(
            f"the Lambda layer in {layer_dir} was staged for {staged.get('architecture') or 'an unknown platform'}, "
            f"but ebb:architecture is {architecture}: run `{build}`"
        )
    if staged.get("python") != python:
        raise LayerMissingError(
            f"the Lambda layer in {layer_dir} was staged for Python {staged.get('python')}, but the functions run "
            f"{python} (lambda_src/Dockerfile): run `{build}`"
        )
    return layer_dir


def _acknowledge_role_findings(
    function: lambda_.Function, *, in_vpc: bool, traced: bool, reads_account_settings: bool
) -> None:
    """The cdk-nag findings of a function role, each for a reason that holds for it."""
    role = function.role
    managed = [
        (
            "service-role/AWSLambdaBasicExecutionRole",
            "The AWS-maintained minimum for writing the function's own log streams.",
        )
    ]
    if in_vpc:
        managed.append(
            (
                "service-role/AWSLambdaVPCAccessExecutionRole",
                (
                    "The AWS-maintained minimum for Lambda's VPC network interfaces "
                    "(EC2 ENI actions take no resource scope)."
                ),
            )
        )
    for policy, why in managed:
        Validations.of(role).acknowledge(
            Acknowledgment(id=f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{policy}]", reason=why)
        )
    unscoped = (["X-Ray's PutTraceSegments and PutTelemetryRecords (active tracing)"] if traced else []) + (
        ["Lambda's GetAccountSettings (the account's concurrency, read by Validate and tune)"]
        if reads_account_settings
        else []
    )
    findings = [
        ("Action::s3:GetObject*", "CDK's bucket read grant: GetObject and its version and attribute variants."),
        ("Action::s3:GetBucket*", "CDK's bucket read grant: the bucket's location and metadata."),
        ("Action::s3:List*", "CDK's bucket read grant: listing the bucket (datasets, checkpoints)."),
        (
            "Action::s3:DeleteObject*",
            (
                "CDK's delete grant, only where a function replaces what it wrote: old "
                "checkpoints, signal payloads, a dataset's stale parts (ebb.ports.deployment)."
            ),
        ),
        ("Action::s3:Abort*", "CDK's put grant: aborting its own multipart uploads (large checkpoints, datasets)."),
        (
            "Action::kms:GenerateDataKey*",
            (
                "CDK's publish grant on an encrypted topic: data keys from the topics' "
                "own KMS key, which encrypts nothing else."
            ),
        ),
    ]
    if unscoped:
        findings.append(("Resource::*", f"{' and '.join(unscoped)} take no resource scope."))
    for finding, why in findings:
        Validations.of(role).acknowledge(Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=why))
