"""The user's side of a deployed stack: submit a job, watch it, fetch its report.

Everything is found from the stack's name (its CloudFormation outputs, docs/AWS.md):
the user never types an ARN or a bucket. Works against whatever endpoint boto3 is
configured for (``AWS_ENDPOINT_URL``), so it is tested against a moto_server.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ebb.ports import deployment as names
from ebb.ports.keys import MANIFEST_KEY, PROGRESS_KEY, REPORT_KEY
from ebb.ports.objects import is_s3
from ebb.spec import JobSpec
from ebb.stores import open_object_store

OUTPUTS = (names.STATE_MACHINE_OUTPUT, names.BUCKET_OUTPUT)
DONE = {"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"}
# Errors of the caller's credentials, whatever the call.
_CREDENTIAL_CODES = {
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "RequestExpired",
}


class DeploymentError(RuntimeError):
    """The stack, an execution or a job's files cannot be found or used (one line)."""


def _session():
    import boto3

    return boto3.session.Session()


def configuration_problem(exc: BaseException) -> str | None:
    """One line saying what to set, when `exc` comes from the caller's AWS configuration (no
    region, no or stale credentials, an endpoint out of reach); else None."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        TokenRetrievalError,
    )

    if isinstance(exc, NoRegionError):
        return (
            "no AWS region: set AWS_DEFAULT_REGION (or AWS_PROFILE with a region, or region in ~/.aws/config) "
            "to the region the stack is deployed in"
        )
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | TokenRetrievalError):
        return (
            f"no usable AWS credentials ({exc}): set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (`aws configure`, or `aws sso login` for a profile)"
        )
    if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in _CREDENTIAL_CODES:
        code = exc.response["Error"]["Code"]
        return f"AWS refused the credentials ({code}): refresh them (`aws sso login`, or new keys) or set AWS_PROFILE"
    if isinstance(exc, EndpointConnectionError):
        return f"cannot reach AWS ({exc}): check the network, the region, or AWS_ENDPOINT_URL"
    return None


@dataclass
class Deployment:
    stack: str
    state_machine_arn: str
    bucket: str
    outputs: dict[str, str]

    @classmethod
    def from_stack(cls, stack: str, session=None) -> Deployment:
        """Read the stack's outputs (StateMachineArn, DataBucketName, ...)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            cfn = (session or _session()).client("cloudformation")
            found = cfn.describe_stacks(StackName=stack)["Stacks"]
        except (ClientError, BotoCoreError) as exc:
            if (problem := configuration_problem(exc)) is not None:
                raise DeploymentError(problem) from None
            if isinstance(exc, ClientError) and "does not exist" in exc.response["Error"].get("Message", ""):
                raise DeploymentError(
                    f"stack {stack} does not exist in {cfn.meta.region_name}: deploy it (`npx cdk deploy`), pass "
                    "--stack NAME (or set EBB_STACK), or set AWS_DEFAULT_REGION to the stack's region"
                ) from None
            raise DeploymentError(f"stack {stack}: {exc}") from None
        outputs = {o["OutputKey"]: o["OutputValue"] for o in found[0].get("Outputs", [])}
        missing = [k for k in OUTPUTS if k not in outputs]
        if missing:
            raise DeploymentError(f"stack {stack} has no output {missing[0]}: is it an Ebb stack?")
        return cls(stack, outputs[names.STATE_MACHINE_OUTPUT], outputs[names.BUCKET_OUTPUT], outputs)

    # -- submit ------------------------------------------------------------------------
    def upload_dataset(self, folder: str, progress: Callable[[str], None] = print) -> str:
        """Upload a local prepared dataset to ``datasets/<name>-<manifest hash>/`` (skipped when
        that copy exists already); returns its s3:// location."""
        import hashlib

        local = open_object_store(folder)
        try:
            manifest = local.get(MANIFEST_KEY)
        except KeyError:
            raise DeploymentError(
                f"data: {folder} has no {MANIFEST_KEY}; prepare it first with `ebb prepare`"
            ) from None
        digest = hashlib.sha256(manifest).hexdigest()[:12]
        location = f"s3://{self.bucket}/{names.DATASETS}{Path(folder).resolve().name}-{digest}"
        remote = open_object_store(location)
        if remote.exists(MANIFEST_KEY):
            progress(f"dataset already uploaded: {location}")
            return location
        keys = [k for k in local.list() if k != MANIFEST_KEY]
        for i, key in enumerate(keys, 1):
            remote.put(key, local.get(key))
            if i % 50 == 0 or i == len(keys):
                progress(f"uploading {folder}: {i}/{len(keys)} parts")
        remote.put(MANIFEST_KEY, manifest)  # last: a dataset with a manifest is complete
        return location

    def submit(self, spec: JobSpec, progress: Callable[[str], None] = print, session=None) -> dict:
        """Start ``spec`` as an execution (a unique name); returns its ARN, name and console link."""
        return self.start(self.state_machine_arn, spec.name[:50], self.job_input(spec, progress), session)

    def start(self, machine_arn: str, name: str, doc: dict, session=None) -> dict:
        """Start an execution of ``machine_arn`` named ``name``, a time stamp and a random suffix
        (20 characters more), with input ``doc``; returns its ARN, name and console link."""
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        name = f"{name}-{stamp}-{secrets.token_hex(2)}"
        sfn = (session or _session()).client("stepfunctions")
        started = sfn.start_execution(stateMachineArn=machine_arn, name=name, input=json.dumps(doc))
        return {"executionArn": started["executionArn"], "name": name, "console": console_link(started["executionArn"])}

    def job_input(self, spec: JobSpec, progress: Callable[[str], None] = print) -> dict:
        """``spec`` as an execution's input: a local dataset (or raw file to prepare) uploaded
        to the bucket first, and named by its s3:// location."""
        doc = spec.model_dump(mode="json", exclude_none=True)
        if not is_s3(spec.data):
            if not Path(spec.data).exists() and spec.prepare is None:
                raise DeploymentError(f"data: {spec.data} is neither a local prepared dataset nor s3://…")
            if Path(spec.data).exists():
                doc["data"] = self.upload_dataset(spec.data, progress)
        if spec.prepare is not None and not is_s3(spec.prepare.input):
            if Path(spec.prepare.input).is_file():
                key = f"{names.RAW}{spec.name}/{Path(spec.prepare.input).name}"
                open_object_store(f"s3://{self.bucket}").put_file(key, spec.prepare.input)
                doc["prepare"]["input"] = f"s3://{self.bucket}/{key}"
        return doc


def console_link(execution_arn: str) -> str:
    region = execution_arn.split(":")[3]
    return f"https://{region}.console.aws.amazon.com/states/home?region={region}#/v2/executions/details/{execution_arn}"


@dataclass
class Execution:
    """A running or finished job of a deployment, found from its execution ARN or name."""

    arn: str
    deployment: Deployment

    @property
    def job_id(self) -> str:
        return self.arn.rsplit(":", 1)[-1]

    @classmethod
    def find(cls, ref: str, stack: str, session=None) -> Execution:
        dep = Deployment.from_stack(stack, session)
        if ref.startswith("arn:"):
            if ":execution:" not in ref:
                raise DeploymentError(f"{ref} is not an execution ARN")
            return cls(ref, dep)
        return cls(dep.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{ref}", dep)

    def describe(self, session=None) -> dict:
        from botocore.exceptions import ClientError

        sfn = (session or _session()).client("stepfunctions")
        try:
            return sfn.describe_execution(executionArn=self.arn)
        except ClientError as exc:
            problem = configuration_problem(exc)
            raise DeploymentError(
                problem or f"execution {self.arn}: {exc.response['Error'].get('Message', exc)}"
            ) from None

    def out_location(self) -> str:
        """Where the job writes its outputs: the ``out`` of its normalised spec (Validate wrote
        it), else the default ``jobs/<id>`` in the bucket."""
        bucket = open_object_store(f"s3://{self.deployment.bucket}")
        try:
            return json.loads(bucket.get(names.spec_key(self.job_id)))["out"].rstrip("/")
        except KeyError:
            return f"s3://{self.deployment.bucket}/{names.job_prefix(self.job_id)}"

    def progress(self, out: str) -> dict | None:
        try:
            return json.loads(open_object_store(out).get(PROGRESS_KEY))
        except KeyError:
            return None


def watch(
    execution: Execution, emit: Callable[[str], None] = print, every_s: float = 5.0, timeout_s: float | None = None
) -> str:
    """Print the job's state, round, step, loss, workers and $ until it ends; returns its status."""
    started = time.monotonic()
    last_line = None
    while True:
        desc = execution.describe()
        status = desc["status"]
        p = execution.progress(execution.out_location()) or {}
        line = f"{status.lower():9s}"
        if p:
            parts = [
                f"round {p['round']}" if "round" in p else None,
                f"step {p['step']}" if "step" in p else None,
                f"loss {p['loss']:.4f}" if "loss" in p else None,
                f"{p['workers']} workers" if "workers" in p else None,
                f"${p['cost_usd']:.4f}" if "cost_usd" in p else None,
            ]
            line += "  " + "  ".join(x for x in parts if x)
        if line != last_line:
            emit(f"[{time.strftime('%H:%M:%S')}] {line}")
            last_line = line
        if status in DONE:
            if status != "SUCCEEDED" and desc.get("error"):
                emit(f"{desc.get('error')}: {desc.get('cause', '')}".strip())
            return status
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            return status
        time.sleep(every_s)


def fetch_report(execution: Execution, into: str) -> dict:
    """Download report.json, model.npz and loss.png of a job into the folder ``into``."""
    desc = execution.describe()
    out = open_object_store(execution.out_location())
    try:
        report = json.loads(out.get(REPORT_KEY))
    except KeyError:
        raise DeploymentError(f"{execution.job_id} has no report yet (execution {desc['status'].lower()})") from None
    Path(into).mkdir(parents=True, exist_ok=True)
    Path(into, REPORT_KEY).write_text(json.dumps(report, indent=2))
    for key in (report.get("files") or {}).values():
        if key != REPORT_KEY:
            out.get_file(key, Path(into, key))
    return report
