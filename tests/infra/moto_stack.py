"""The synthesised stack, stood up in moto, its state machine run by moto's Step Functions
executor with the real Lambda handlers.

- :class:`MotoStack` reads the template and creates what a job touches — IAM roles, buckets,
  topics, queues and their subscriptions (filter policies included), the cache's AUTH secret,
  the six functions with their environment, and the state machine — each from its
  template properties, the intrinsics resolved (``infra_helpers.resolve_intrinsics``) into
  the moto resources created. The ElastiCache replication group is a TLS redis-server on
  loopback (``tests/tls_redis.py``) whose password is the secret's value.
- :class:`LambdaRuntime` stands in for the Lambda service behind moto's ``Invoke``: each
  invocation runs the function's handler (its image command or zip handler) in a process
  of its own (``tests/lambda_invoke.py``), with the function's environment, and answers as
  Lambda does: the result, or the error payload with ``X-Amz-Function-Error: Unhandled``.
- :func:`stack_in_moto` puts them together on a moto server in this process, with the
  Step Functions executor on.

What is not reproduced: VPC, KMS, log groups, layers, policies, alarms and the dashboard
(nothing a job's run depends on), and a zip function's code (the worktree's ``ebb`` runs).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import secrets
import string
import threading
import time
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aws_helpers import REGION, aws_env, server_client
from infra_helpers import resolve_intrinsics
from lambda_helpers import HANDLERS, Invocation, LambdaError
from tls_redis import TlsRedisServers

ACCOUNT = "123456789012"  # moto's default account
PSEUDO_PARAMETERS = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT,
                     "AWS::URLSuffix": "amazonaws.com", "AWS::NoValue": None}


def _empty_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("README", "the handlers run from the worktree (tests/infra/moto_stack.py)")
    return buffer.getvalue()


@dataclass
class Call:
    """One invocation: which function, its event, when it ran, and how it ended."""

    function: str
    handler: str
    event: dict
    started: float
    ended: float | None = None
    result: dict | None = None
    error: dict | None = None
    invocation: Invocation | None = field(default=None, repr=False)

    @property
    def output(self) -> str:
        """What the handler printed (its log lines), once it has ended."""
        return self.invocation.output


class LambdaRuntime:
    """The Lambda service behind moto's Invoke: `invoke` replaces ``LambdaSimpleBackend.invoke``."""

    def __init__(self, base_env: dict[str, str]):
        self.base_env = base_env  # the process environment under every function's own variables
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def invoke(self, backend, function_name: str, qualifier: str | None, body, headers: dict,
               response_headers: dict) -> bytes:
        function = backend.get_function(function_name, qualifier)
        entry = function.image_config.cmd[0] if function.package_type == "Image" else function.handler
        module = entry.rsplit(".", 1)[0]
        if not module.startswith(HANDLERS):
            raise ValueError(f"{function.function_name}: handler {entry} is not one of {HANDLERS}*")
        event = json.loads(body or "{}")
        env = {**self.base_env, **function.environment_vars}
        with self._lock:
            call = Call(function.function_name, module, event, time.monotonic(),
                        invocation=Invocation(module.removeprefix(HANDLERS), event, env, timeout_s=function.timeout))
            self.calls.append(call)
        # Lambda stops an invocation at the function's timeout.
        timer = threading.Timer(function.timeout, call.invocation.proc.kill)
        timer.daemon = True
        timer.start()
        try:
            call.result = call.invocation.result()
            return json.dumps(call.result).encode()
        except LambdaError as exc:
            call.error = exc.payload
        except RuntimeError as exc:  # the process ended without an answer
            call.error = ({"errorType": "Sandbox.Timedout",
                           "errorMessage": f"Task timed out after {function.timeout:.2f} seconds"}
                          if not timer.is_alive() else
                          {"errorType": "Runtime.ExitError", "errorMessage": str(exc).splitlines()[0]})
        finally:
            timer.cancel()
            call.ended = time.monotonic()
        response_headers["x-amz-function-error"] = "Unhandled"
        return json.dumps(call.error).encode()

    def backend_method(self):
        """The function to set as ``LambdaSimpleBackend.invoke``."""

        def invoke(backend, function_name, qualifier, body, headers, response_headers):
            return self.invoke(backend, function_name, qualifier, body, headers, response_headers)

        return invoke

    def of(self, handler: str) -> list[Call]:
        """The calls of one handler module (``worker``, ``ebb.aws.handlers.worker``), in start order."""
        module = handler if handler.startswith(HANDLERS) else HANDLERS + handler
        return [c for c in self.calls if c.handler == module]

    def stop_all(self) -> None:
        """Kill every handler process still running (a branch Step Functions abandoned)."""
        with self._lock:
            calls = list(self.calls)
        for call in calls:
            proc = call.invocation.proc
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class MotoStack:
    """The template's resources in moto at `endpoint`; `output(key)` resolves a stack output.

    `cache_token` is the AUTH token the cache's generated secret will hold (made as the
    template's generator would): start the cache with it, then `deploy((host, port))`.
    """

    def __init__(self, template: dict, endpoint: str, *, stack_name: str = "Ebb"):
        self.template, self.endpoint, self.stack_name = template, endpoint, stack_name
        (secret,) = self.resources("AWS::SecretsManager::Secret").values()
        generator = secret.get("GenerateSecretString")
        if generator is None or not generator.get("ExcludePunctuation"):
            raise ValueError("the cache's AUTH secret should be generated, without punctuation")
        self.cache_token = generated_token(generator.get("PasswordLength", 32))
        self.cache_endpoint: tuple[str, int] | None = None
        self.refs: dict[str, object] = {**PSEUDO_PARAMETERS, "AWS::StackName": stack_name}
        self.attributes: dict[tuple[str, str], object] = {}
        self.function_env: dict[str, dict[str, str]] = {}  # handler module -> resolved environment
        self._suffix = uuid.uuid4().hex[:6]
        self._clients: dict[str, object] = {}

    def client(self, service: str):
        if service not in self._clients:
            self._clients[service] = server_client(self.endpoint, service)
        return self._clients[service]

    def resources(self, type_: str) -> dict[str, dict]:
        return {k: r.get("Properties", {}) for k, r in self.template["Resources"].items() if r["Type"] == type_}

    def resolve(self, value):
        return resolve_intrinsics(value, self.refs, self.attributes)

    def _name(self, logical_id: str, limit: int = 64) -> str:
        return f"{self.stack_name}-{logical_id}-{self._suffix}"[:limit]

    def deploy(self, cache_endpoint: tuple[str, int]) -> MotoStack:
        """Create every supported resource, in dependency order; the replication group's
        endpoint is `cache_endpoint` (host, port)."""
        self.cache_endpoint = cache_endpoint
        for type_, create in (
            ("AWS::IAM::Role", self._role),
            ("AWS::S3::Bucket", self._bucket),
            ("AWS::SNS::Topic", self._topic),
            ("AWS::SQS::Queue", self._queue),
            ("AWS::SecretsManager::Secret", self._secret),
            ("AWS::ElastiCache::ReplicationGroup", self._cache),
            ("AWS::SNS::Subscription", self._subscription),
            ("AWS::Lambda::Function", self._function),
            ("AWS::StepFunctions::StateMachine", self._state_machine),
        ):
            for logical_id, props in self.resources(type_).items():
                create(logical_id, props)
        return self

    def output(self, key: str):
        return self.resolve(self.template["Outputs"][key]["Value"])

    # ------------------------------------------------------------------ resources
    def _role(self, logical_id: str, props: dict) -> None:
        role = self.client("iam").create_role(
            RoleName=self._name(logical_id),
            AssumeRolePolicyDocument=json.dumps(self.resolve(props["AssumeRolePolicyDocument"])))["Role"]
        self.refs[logical_id] = role["RoleName"]
        self.attributes[(logical_id, "Arn")] = role["Arn"]

    def _bucket(self, logical_id: str, props: dict) -> None:
        name = self._name(logical_id, 63).lower()  # bucket names are lower case
        self.client("s3").create_bucket(Bucket=name)
        self.refs[logical_id] = name
        self.attributes[(logical_id, "Arn")] = f"arn:aws:s3:::{name}"

    def _topic(self, logical_id: str, props: dict) -> None:
        arn = self.client("sns").create_topic(Name=props.get("TopicName") or self._name(logical_id, 256))["TopicArn"]
        self.refs[logical_id] = arn
        self.attributes[(logical_id, "TopicArn")] = arn

    def _queue(self, logical_id: str, props: dict) -> None:
        sqs = self.client("sqs")
        url = sqs.create_queue(QueueName=props.get("QueueName") or self._name(logical_id, 80))["QueueUrl"]
        self.refs[logical_id] = url
        self.attributes[(logical_id, "QueueUrl")] = url
        self.attributes[(logical_id, "Arn")] = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]

    def _secret(self, logical_id: str, props: dict) -> None:
        generate = props.get("GenerateSecretString")
        if generate is None:
            raise ValueError(f"{logical_id}: only generated secrets are supported (the cache's AUTH token)")
        # What the generator would give: the token alone, or JSON with it under GenerateStringKey.
        value = self.cache_token
        if "GenerateStringKey" in generate:
            value = json.dumps({**json.loads(generate.get("SecretStringTemplate", "{}")),
                                generate["GenerateStringKey"]: self.cache_token})
        arn = self.client("secretsmanager").create_secret(Name=self._name(logical_id, 512),
                                                          SecretString=value)["ARN"]
        self.refs[logical_id] = arn

    def _cache(self, logical_id: str, props: dict) -> None:
        if props.get("NumNodeGroups", 1) > 1:
            raise ValueError(f"{logical_id}: a cluster-mode cache is not stood up here")
        host, port = self.cache_endpoint
        self.refs[logical_id] = self._name(logical_id, 40)
        self.attributes[(logical_id, "PrimaryEndPoint.Address")] = host
        self.attributes[(logical_id, "PrimaryEndPoint.Port")] = str(port)

    def _subscription(self, logical_id: str, props: dict) -> None:
        attributes = {}
        if props.get("RawMessageDelivery"):
            attributes["RawMessageDelivery"] = "true"
        if "FilterPolicy" in props:
            attributes["FilterPolicy"] = json.dumps(self.resolve(props["FilterPolicy"]))
        if "FilterPolicyScope" in props:
            attributes["FilterPolicyScope"] = props["FilterPolicyScope"]
        arn = self.client("sns").subscribe(
            TopicArn=self.resolve(props["TopicArn"]), Protocol=props["Protocol"],
            Endpoint=self.resolve(props["Endpoint"]), Attributes=attributes)["SubscriptionArn"]
        self.refs[logical_id] = arn

    def _function(self, logical_id: str, props: dict) -> None:
        env = {k: str(v) for k, v in self.resolve(props.get("Environment", {}).get("Variables", {})).items()}
        options = {
            "FunctionName": props.get("FunctionName") or self._name(logical_id),
            "Role": self.resolve(props["Role"]),
            "Timeout": props.get("Timeout", 3),
            "MemorySize": props.get("MemorySize", 128),
            "Environment": {"Variables": env},
            "Architectures": props.get("Architectures", ["x86_64"]),
        }
        if props.get("PackageType") == "Image":
            options.update(PackageType="Image", Code={"ImageUri": self.resolve(props["Code"]["ImageUri"])},
                           ImageConfig=props["ImageConfig"])
            entry = props["ImageConfig"]["Command"][0]
        else:
            options.update(Runtime=props["Runtime"], Handler=props["Handler"], Code={"ZipFile": _empty_zip()})
            entry = props["Handler"]
        function = self.client("lambda").create_function(**options)
        self.refs[logical_id] = function["FunctionName"]
        self.attributes[(logical_id, "Arn")] = function["FunctionArn"]
        self.function_env[entry.rsplit(".", 1)[0]] = env

    def _state_machine(self, logical_id: str, props: dict) -> None:
        definition = self.resolve(props["DefinitionString"])
        json.loads(definition)  # resolved to plain JSON, every ARN filled in
        machine = self.client("stepfunctions").create_state_machine(
            name=self._name(logical_id, 80), definition=definition, roleArn=self.resolve(props["RoleArn"]),
            type=props.get("StateMachineType", "STANDARD"))
        self.refs[logical_id] = machine["stateMachineArn"]
        self.attributes[(logical_id, "Arn")] = machine["stateMachineArn"]


def generated_token(length: int = 64) -> str:
    """A token like the one Secrets Manager generates for the cache (letters and digits)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


@dataclass
class RunningStack:
    stack: MotoStack
    runtime: LambdaRuntime
    cache: TlsRedisServers
    endpoint: str


@contextlib.contextmanager
def stack_in_moto(template: dict, folder: Path) -> Iterator[RunningStack]:
    """`template` stood up on a moto server in this process whose Step Functions executor
    runs state machines, each Lambda invocation a handler process (:class:`LambdaRuntime`).

    The executor calls Lambda at localhost:$MOTO_PORT, so MOTO_PORT is set while this runs;
    moto's configuration, MOTO_PORT and ``LambdaSimpleBackend.invoke`` are restored after,
    the moto state reset, and every handler process still running killed."""
    from moto.awslambda_simple.models import LambdaSimpleBackend
    from moto.core.config import default_user_config
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    endpoint = f"http://127.0.0.1:{port}"
    saved_config = {key: copy.deepcopy(default_user_config[key]) for key in ("lambda", "stepfunctions")}
    try:
        with pytest.MonkeyPatch.context() as patch, contextlib.ExitStack() as cleanup:
            patch.setenv("MOTO_PORT", str(port))
            patch.setattr(logging.getLogger("werkzeug"), "level", logging.WARNING)  # a line a request
            _post(f"{endpoint}/moto-api/config", {"stepfunctions": {"execute_state_machine": True},
                                                  "lambda": {"use_docker": False}})
            stack = MotoStack(template, endpoint)
            cache = TlsRedisServers(folder, password=stack.cache_token)
            cleanup.callback(cache.stop)
            # A function's process: the stack's variables (per function), AWS at the moto
            # server, and a trust store that holds the cache's CA (ElastiCache's certificates
            # chain to the system's).
            runtime = LambdaRuntime({**aws_env(endpoint), "SSL_CERT_FILE": cache.cert})
            cleanup.callback(runtime.stop_all)
            patch.setattr(LambdaSimpleBackend, "invoke", runtime.backend_method())
            stack.deploy(("127.0.0.1", cache.start()))
            yield RunningStack(stack, runtime, cache, endpoint)
    finally:
        _post(f"{endpoint}/moto-api/config", saved_config)
        _post(f"{endpoint}/moto-api/reset", None)
        server.stop()


def _post(url: str, body: dict | None) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else b"",
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
