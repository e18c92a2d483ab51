"""The synthesised stack, created by moto's CloudFormation with IAM enforced; its state machine
run by moto's Step Functions executor, each Lambda invocation the real handler in a process of
its own under its function's role.

- :func:`stack_in_moto` starts a moto server in this process (tests/moto_additions.py added),
  creates the template as a stack through CloudFormation, with a stand-in for each resource
  type moto's CloudFormation cannot create (``STAND_INS``), and turns IAM enforcement on: from
  then on every request must be signed by a known principal and be allowed by its policies.
  The test (or a user's CLI) acts as an administrator; each function runs with credentials
  from ``sts:AssumeRole`` on its own role, whose policies are the template's, their
  intrinsics resolved by CloudFormation; the state machine's calls to Lambda are signed
  with the state machine's role. Every request IAM refused is recorded (``denied``), so a
  refusal a handler might swallow still shows.
- :class:`LambdaRuntime` stands in for the Lambda service behind moto's ``Invoke``: each
  invocation runs the function's handler (its image command or zip handler) in a process
  of its own (``tests/lambda_invoke.py``) with the function's environment and its role's
  credentials, stops it at the function's timeout, and answers as Lambda does: the
  result, or the error payload with ``X-Amz-Function-Error: Unhandled``.
- ``python tests/infra/moto_stack.py serve TEMPLATE STATE_FILE`` (scripts/rehearse.sh) does
  the same and serves until stopped, for the ``ebb`` commands to use as a deployed stack.

- moto's Step Functions emits no EventBridge events: ``RunningStack.execution_status_changed``
  delivers an execution's status change to the template's rules' targets, as EventBridge would.

What is not reproduced: networks (VPC, subnets, security groups, endpoints), KMS, resource
policies (a function's permission for EventBridge included), log delivery, alarms; and a
function's code (the worktree's ``ebb`` runs).
docs/AWS.md, "What the rehearsal proves", says what only a real account shows.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import os
import secrets
import signal
import string
import sys
import threading
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script (scripts/rehearse.sh): tests.helpers from the repository
    sys.path.insert(0, str(ROOT))

from tests.helpers.aws import REGION, aws_env  # noqa: E402
from tests.helpers.lambdas import HANDLERS, TUNE_HANDLER, Invocation, LambdaError, handler_module  # noqa: E402
from tests.helpers.tls_redis import TlsRedisServers  # noqa: E402

ACCOUNT = "123456789012"  # moto's default account
CDK_QUALIFIER = "hnb659fds"  # the default bootstrap's: its asset bucket and version parameter
ADMIN = "rehearsal-admin"
# Resource types moto's CloudFormation cannot create, and what stands in for each.
STAND_INS = {
    "AWS::ElastiCache::ReplicationGroup": "a TLS redis-server on loopback whose password is the AUTH secret's "
    "value (tests/tls_redis.py); its endpoint replaces the group's",
    "AWS::ElastiCache::SubnetGroup": "nothing: no network is emulated",
    "AWS::SecretsManager::Secret": "the same secret created through the Secrets Manager API, with a token made as "
    "its generator would make it; its ARN replaces its Ref",
    "AWS::SNS::Subscription": "the same subscriptions made through the SNS API once the stack exists (raw delivery "
    "and filter policies as the template says)",
    "Custom::S3AutoDeleteObjects": "nothing: the emulator's buckets go with it",
    "AWS::S3::BucketPolicy": "nothing: moto evaluates no resource policy (they refuse plain HTTP and let the "
    "control topic and the alarms in)",
    "AWS::SNS::TopicPolicy": "nothing (see AWS::S3::BucketPolicy)",
    "AWS::SQS::QueuePolicy": "nothing (see AWS::S3::BucketPolicy)",
    "AWS::CloudWatch::Alarm": "nothing: no job depends on an alarm",
    "AWS::EC2::SecurityGroupEgress": "nothing: no network is emulated; the functions reach the cache on loopback",
}
_SERVERLESS_CACHE = ("AWS::ElastiCache::ServerlessCache", "AWS::ElastiCache::User", "AWS::ElastiCache::UserGroup")
_ADMIN_POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


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

    @property
    def running(self) -> bool:
        return self.invocation.proc.poll() is None


@dataclass(frozen=True)
class Function:
    """A function as the stack made it: its handler module, environment, role and timeout."""

    name: str
    handler: str
    env: dict[str, str]
    role_arn: str
    timeout: int


class LambdaRuntime:
    """The Lambda service behind moto's Invoke: `invoke` replaces ``LambdaSimpleBackend.invoke``."""

    def __init__(self, base_env: dict[str, str]):
        self.base_env = base_env  # the process environment under every function's own variables
        self.functions: dict[str, Function] = {}  # by function name
        self.credentials: dict[str, dict[str, str]] = {}  # by role ARN: what sts:AssumeRole gave
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def invoke(
        self, backend, function_name: str, qualifier: str | None, body, headers: dict, response_headers: dict
    ) -> bytes:
        name = backend.get_function(function_name, qualifier).function_name
        function = self.functions.get(name)
        if function is None or not function.handler.startswith((HANDLERS, TUNE_HANDLER)):
            raise ValueError(f"{name}: not one of the stack's handlers ({HANDLERS}*, {TUNE_HANDLER})")
        event = json.loads(body or "{}")
        env = {
            **self.base_env,
            **function.env,
            **self.credentials[function.role_arn],
            "AWS_LAMBDA_FUNCTION_NAME": name,
            "AWS_LAMBDA_FUNCTION_TIMEOUT": str(function.timeout),
        }
        with self._lock:
            call = Call(
                name,
                function.handler,
                event,
                time.monotonic(),
                invocation=Invocation(function.handler, event, env, timeout_s=function.timeout),
            )
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
            call.error = (
                {
                    "errorType": "Sandbox.Timedout",
                    "errorMessage": f"Task timed out after {function.timeout:.2f} seconds",
                }
                if not timer.is_alive()
                else {"errorType": "Runtime.ExitError", "errorMessage": str(exc).splitlines()[0]}
            )
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
        """The calls of one handler module (``worker``, ``ebb.aws.handlers.worker``, ``ebb.tune.handler``),
        in start order."""
        module = handler_module(handler)
        return [c for c in self.calls if c.handler == module]

    def running(self) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.running]

    def stop_all(self) -> None:
        """Kill every handler process still running."""
        for call in self.running():
            call.invocation.proc.kill()
            call.invocation.proc.wait()


@dataclass
class MotoStack:
    """The template as a stack in moto: `output(key)`, administrator clients, and what IAM refused."""

    template: dict
    endpoint: str
    stack_name: str
    admin: dict[str, str]  # AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY of the administrator
    outputs: dict[str, str] = field(default_factory=dict)
    physical: dict[str, str] = field(default_factory=dict)  # logical id -> physical id
    cache_token: str = ""
    created: int = 0  # resources CloudFormation created (the rest of the template's are stood in for)
    denied: list[tuple[str, str, str]] = field(default_factory=list)  # (principal ARN, action, resource)
    _clients: dict[str, object] = field(default_factory=dict, repr=False)

    def client(self, service: str):
        """A client of the administrator (the test's set-up and checks, as a user's own)."""
        if service not in self._clients:
            import boto3

            self._clients[service] = boto3.session.Session().client(
                service,
                endpoint_url=self.endpoint,
                region_name=REGION,
                aws_access_key_id=self.admin["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=self.admin["AWS_SECRET_ACCESS_KEY"],
            )
        return self._clients[service]

    def output(self, key: str) -> str:
        return self.outputs[key]

    def user_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a user's command (`ebb submit`) against this stack: the administrator."""
        return {**aws_env(self.endpoint, base), **self.admin}

    def denials(self, principal: str = "") -> list[tuple[str, str, str]]:
        """What IAM refused, to principals whose ARN contains `principal`."""
        return [d for d in self.denied if principal in d[0]]


def emulator_template(template: dict, *, secret_arn: str, cache: tuple[str, int]) -> tuple[dict, dict[str, dict]]:
    """(the template moto's CloudFormation can create, the SNS subscriptions to make after it):
    every resource of a STAND_INS type removed, and each reference to one replaced by its
    stand-in (the secret's ARN, the cache's host and port)."""
    resources = template["Resources"]
    if any(r["Type"] in _SERVERLESS_CACHE for r in resources.values()):
        raise ValueError("a serverless cache is not stood up here: rehearse the default (ebb:cache nodes)")
    removed = {k for k, r in resources.items() if r["Type"] in STAND_INS}
    by_type = {r["Type"]: k for k, r in resources.items()}
    secret, group = by_type.get("AWS::SecretsManager::Secret"), by_type.get("AWS::ElastiCache::ReplicationGroup")
    if group and resources[group]["Properties"].get("NumNodeGroups", 1) > 1:
        raise ValueError("a cluster-mode cache is not stood up here: rehearse the default (ebb:cacheShards 1)")
    host, port = cache

    def stand_in(node: dict):
        if node.get("Ref") == secret:
            return secret_arn
        if node.get("Ref") == group:
            return "ebb-cache-stand-in"
        if "Fn::GetAtt" in node and node["Fn::GetAtt"][0] == group:
            return {"PrimaryEndPoint.Address": host, "PrimaryEndPoint.Port": str(port)}[node["Fn::GetAtt"][1]]
        target = node.get("Ref") or (node["Fn::GetAtt"][0] if "Fn::GetAtt" in node else None)
        if target in removed:
            raise ValueError(
                f"the template refers to {target} ({resources[target]['Type']}), which moto cannot "
                "create and nothing stands in for"
            )
        return None

    def walk(node):
        if isinstance(node, list):
            return [walk(x) for x in node]
        if isinstance(node, dict):
            replaced = stand_in(node)
            return replaced if replaced is not None else {k: walk(v) for k, v in node.items()}
        return node

    kept = {k: copy.deepcopy(r) for k, r in resources.items() if k not in removed}
    for resource in kept.values():
        depends = resource.get("DependsOn")
        if depends:
            listed = [depends] if isinstance(depends, str) else depends
            resource["DependsOn"] = [d for d in listed if d not in removed]
    subscriptions = {k: r["Properties"] for k, r in resources.items() if r["Type"] == "AWS::SNS::Subscription"}
    return walk({**template, "Resources": kept}), subscriptions


def generated_token(length: int = 64) -> str:
    """A token like the one Secrets Manager generates for the cache (letters and digits)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


def _empty_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("README", "the handlers run from the worktree (tests/infra/moto_stack.py)")
    return buffer.getvalue()


def deploy(template: dict, endpoint: str, cache: TlsRedisServers, *, stack_name: str = "Ebb") -> MotoStack:
    """Create `template` as a stack on the moto server at `endpoint` (IAM not yet enforced):
    the administrator, the stand-ins, the stack, the subscriptions."""
    import boto3

    session = boto3.session.Session()

    def bootstrap_client(service: str):  # before the administrator exists: moto checks nothing yet
        return session.client(
            service,
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )

    iam = bootstrap_client("iam")
    iam.create_user(UserName=ADMIN)
    iam.put_user_policy(UserName=ADMIN, PolicyName="everything", PolicyDocument=json.dumps(_ADMIN_POLICY))
    key = iam.create_access_key(UserName=ADMIN)["AccessKey"]
    stack = MotoStack(
        template,
        endpoint,
        stack_name,
        {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]},
    )

    # What `cdk bootstrap` leaves in an account: the version parameter and the asset bucket
    # (the functions' zip assets go there; the handlers run from the worktree).
    stack.client("ssm").put_parameter(Name=f"/cdk-bootstrap/{CDK_QUALIFIER}/version", Value="30", Type="String")
    assets = f"cdk-{CDK_QUALIFIER}-assets-{ACCOUNT}-{REGION}"
    s3 = stack.client("s3")
    s3.create_bucket(Bucket=assets)
    for resource in template["Resources"].values():
        code = resource.get("Properties", {}).get("Code") or resource.get("Properties", {}).get("Content") or {}
        if "S3Key" in code:
            s3.put_object(Bucket=assets, Key=code["S3Key"], Body=_empty_zip())

    ((secret_id, secret),) = (
        (k, r["Properties"]) for k, r in template["Resources"].items() if r["Type"] == "AWS::SecretsManager::Secret"
    )
    generator = secret.get("GenerateSecretString")
    if generator is None or not generator.get("ExcludePunctuation"):
        raise ValueError("the cache's AUTH secret should be generated, without punctuation")
    stack.cache_token = generated_token(generator.get("PasswordLength", 32))
    cache.password = stack.cache_token
    secret_arn = stack.client("secretsmanager").create_secret(
        Name=f"{stack_name}-{secret_id}", SecretString=stack.cache_token
    )["ARN"]

    body, subscriptions = emulator_template(template, secret_arn=secret_arn, cache=("127.0.0.1", cache.start()))
    cfn = stack.client("cloudformation")
    cfn.create_stack(StackName=stack_name, TemplateBody=json.dumps(body), Capabilities=["CAPABILITY_IAM"])
    stack.created = len(body["Resources"])
    described = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
    if described["StackStatus"] != "CREATE_COMPLETE":
        raise RuntimeError(f"stack {stack_name}: {described['StackStatus']} {described.get('StackStatusReason')}")
    stack.outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    stack.physical = {
        r["LogicalResourceId"]: r["PhysicalResourceId"]
        for r in cfn.describe_stack_resources(StackName=stack_name)["StackResources"]
        if r.get("PhysicalResourceId")
    }
    _subscribe(stack, subscriptions)
    return stack


def _subscribe(stack: MotoStack, subscriptions: dict[str, dict]) -> None:
    """The template's SNS subscriptions, made through the API with their references resolved."""

    def resolve(value) -> str:
        if isinstance(value, str):
            return value
        if "Ref" in value:
            return stack.physical[value["Ref"]]
        logical, attribute = value["Fn::GetAtt"]
        if attribute != "Arn":
            raise ValueError(f"subscription endpoint {logical}.{attribute} is not resolved here")
        url = stack.physical[logical]  # a queue's physical id is its URL
        return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{url.rsplit('/', 1)[-1]}"

    sns = stack.client("sns")
    for props in subscriptions.values():
        attributes = {}
        if props.get("RawMessageDelivery"):
            attributes["RawMessageDelivery"] = "true"
        if "FilterPolicy" in props:
            attributes["FilterPolicy"] = json.dumps(props["FilterPolicy"])
        if "FilterPolicyScope" in props:
            attributes["FilterPolicyScope"] = props["FilterPolicyScope"]
        sns.subscribe(
            TopicArn=resolve(props["TopicArn"]),
            Protocol=props["Protocol"],
            Endpoint=resolve(props["Endpoint"]),
            Attributes=attributes,
        )


def _functions(stack: MotoStack) -> dict[str, Function]:
    """Each of the stack's functions as moto holds it, with its handler from the template."""
    lam = stack.client("lambda")
    out = {}
    for logical, resource in stack.template["Resources"].items():
        if resource["Type"] != "AWS::Lambda::Function":
            continue
        props = resource["Properties"]
        handler = props.get("Handler") or props["ImageConfig"]["Command"][0]
        config = lam.get_function_configuration(FunctionName=stack.physical[logical])
        out[config["FunctionName"]] = Function(
            config["FunctionName"],
            handler.rsplit(".", 1)[0],
            config.get("Environment", {}).get("Variables", {}),
            config["Role"],
            config["Timeout"],
        )
    return out


def _assume_roles(stack: MotoStack, roles: set[str]) -> dict[str, dict[str, str]]:
    """What the Lambda service (and Step Functions) get for each role: sts:AssumeRole credentials.
    Asked before IAM is enforced: moto cannot evaluate a trust policy naming a service principal."""
    sts = stack.client("sts")
    out = {}
    for arn in sorted(roles):
        creds = sts.assume_role(RoleArn=arn, RoleSessionName=arn.rsplit("/", 1)[-1][:60])["Credentials"]
        out[arn] = {
            "AWS_ACCESS_KEY_ID": creds["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
            "AWS_SESSION_TOKEN": creds["SessionToken"],
        }
    return out


@contextlib.contextmanager
def _iam_enforced(stack: MotoStack) -> Iterator[None]:
    """Every request from here on is authenticated and authorised; each refusal is recorded."""
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.iam.access_control import IAMRequestBase

    original = IAMRequestBase.check_action_permitted

    def recorded(self, resource: str) -> None:
        try:
            original(self, resource)
        except Exception:
            stack.denied.append((self._access_key.arn, self._action, resource))
            raise

    saved = settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count
    IAMRequestBase.check_action_permitted = recorded
    settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count = 0, 0
    try:
        yield
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count = saved
        IAMRequestBase.check_action_permitted = original


def _executor_signs_with(patch, credentials: dict[str, dict[str, str]], port: int) -> None:
    """moto's Step Functions executor calls Lambda with fixed fake keys; it calls with the
    credentials of the role of the state machine whose execution makes the call here
    (``credentials``: state machine ARN -> its role's), so each machine's
    lambda:InvokeFunction grants are enforced too."""
    import threading

    import boto3
    from botocore.config import Config
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    current = threading.local()
    integration = lambda_eval_utils.execute_lambda_function_integration

    def execute(env, *args, **kwargs):
        machine = env.states.context_object.context_object_data["StateMachine"]["Id"]
        current.credentials = credentials[machine]
        return integration(env, *args, **kwargs)

    def boto_client_for(region: str, service: str, state_credentials=None):
        signer = current.credentials
        return boto3.session.Session().client(
            service,
            region_name=region,
            endpoint_url=f"http://localhost:{port}",
            aws_access_key_id=signer["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=signer["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=signer["AWS_SESSION_TOKEN"],
            config=Config(
                parameter_validation=False,
                retries={"max_attempts": 0, "total_max_attempts": 1},
                connect_timeout=1000,
                read_timeout=1000,
            ),
        )

    patch.setattr(lambda_eval_utils, "execute_lambda_function_integration", execute)
    patch.setattr(lambda_eval_utils, "boto_client_for", boto_client_for)

    # A nested execution (states:startExecution.sync:2): started and watched with the calling
    # machine's role too, so its states:* grants are enforced.
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service_sfn

    service = state_task_service_sfn.StateTaskServiceSfn

    def signed(method):
        def call(self, env, *args, **kwargs):
            current.credentials = credentials[env.states.context_object.context_object_data["StateMachine"]["Id"]]
            return method(self, env, *args, **kwargs)

        return call

    for name in ("_eval_service_task", "_build_sync_resolver", "_build_sync2_resolver"):
        patch.setattr(service, name, signed(getattr(service, name)))
    patch.setattr(state_task_service_sfn, "boto_client_for", boto_client_for)


@dataclass
class RunningStack:
    stack: MotoStack
    runtime: LambdaRuntime
    cache: TlsRedisServers
    endpoint: str

    def execution_status_changed(self, execution_arn: str, status: str) -> list[threading.Thread]:
        """Play EventBridge for the template's rules on Step Functions status changes (moto's
        executor emits no events): each target a rule matches is invoked with its input
        transformer's rendering of the event, on a thread of its own (EventBridge invokes
        asynchronously). Returns the threads."""
        machine = execution_arn.replace(":execution:", ":stateMachine:").rsplit(":", 1)[0]
        event = {
            "source": "aws.states",
            "detail-type": "Step Functions Execution Status Change",
            "detail": {
                "executionArn": execution_arn,
                "stateMachineArn": machine,
                "name": execution_arn.rsplit(":", 1)[-1],
                "status": status,
                "input": self.stack.client("stepfunctions").describe_execution(executionArn=execution_arn)["input"],
            },
        }
        threads = []
        for resource in self.stack.template["Resources"].values():
            if resource["Type"] != "AWS::Events::Rule":
                continue
            pattern = resource["Properties"]["EventPattern"]
            detail = pattern["detail"]
            if (
                event["source"] not in pattern["source"]
                or event["detail-type"] not in pattern["detail-type"]
                or status not in detail["status"]
                or {"Ref": next(k for k, v in self.stack.physical.items() if v == machine)}
                not in detail["stateMachineArn"]
            ):
                continue
            for target in resource["Properties"]["Targets"]:
                function = self.stack.physical[target["Arn"]["Fn::GetAtt"][0]]
                payload = _render(target["InputTransformer"], event)
                thread = threading.Thread(
                    target=self.stack.client("lambda").invoke,
                    daemon=True,
                    kwargs={"FunctionName": function, "Payload": json.dumps(payload).encode()},
                )
                thread.start()
                threads.append(thread)
        return threads


def _render(transformer: dict, event: dict) -> dict:
    """An EventBridge input transformer applied to `event` (paths of the form $.a.b)."""
    text = transformer["InputTemplate"]
    for key, path in transformer["InputPathsMap"].items():
        value = event
        for part in path.removeprefix("$.").split("."):
            value = value[part]
        text = text.replace(f'"<{key}>"', json.dumps(str(value))).replace(f"<{key}>", json.dumps(value))
    return json.loads(text)


@contextlib.contextmanager
def stack_in_moto(template: dict, folder: Path, *, stack_name: str = "Ebb") -> Iterator[RunningStack]:
    """`template` created as a stack on a moto server in this process, IAM enforced, whose Step
    Functions executor runs state machines, each Lambda invocation a handler process under its
    role (:class:`LambdaRuntime`).

    The executor calls Lambda at localhost:$MOTO_PORT, so MOTO_PORT is set while this runs;
    moto's configuration, MOTO_PORT, IAM enforcement and the patched methods are restored
    after, the moto state reset, and every handler process still running killed."""
    import pytest
    from moto.awslambda_simple.models import LambdaSimpleBackend
    from moto.core.config import default_user_config
    from moto.server import ThreadedMotoServer

    from tests.helpers.moto_additions import install

    install()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    endpoint = f"http://127.0.0.1:{port}"
    saved_config = {key: copy.deepcopy(default_user_config[key]) for key in ("lambda", "stepfunctions")}
    try:
        with pytest.MonkeyPatch.context() as patch, contextlib.ExitStack() as cleanup:
            patch.setenv("MOTO_PORT", str(port))
            patch.setattr(logging.getLogger("werkzeug"), "level", logging.WARNING)  # a line a request
            _post(
                f"{endpoint}/moto-api/config",
                {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}},
            )
            cache = TlsRedisServers(folder, password="")
            cleanup.callback(cache.stop)
            stack = deploy(template, endpoint, cache, stack_name=stack_name)
            # A function's process: AWS at the moto server, and a trust store that holds the
            # cache's CA (ElastiCache's certificates chain to the system's).
            runtime = LambdaRuntime({**aws_env(endpoint), "SSL_CERT_FILE": cache.cert})
            cleanup.callback(runtime.stop_all)
            runtime.functions = _functions(stack)
            iam = stack.client("iam")
            machine_roles = {  # each state machine's ARN (its Ref) -> its role's ARN
                stack.physical[k]: iam.get_role(RoleName=stack.physical[r["Properties"]["RoleArn"]["Fn::GetAtt"][0]])[
                    "Role"
                ]["Arn"]
                for k, r in template["Resources"].items()
                if r["Type"] == "AWS::StepFunctions::StateMachine"
            }
            runtime.credentials = _assume_roles(
                stack, {f.role_arn for f in runtime.functions.values()} | set(machine_roles.values())
            )
            _executor_signs_with(
                patch, {machine: runtime.credentials[role] for machine, role in machine_roles.items()}, port
            )
            patch.setattr(LambdaSimpleBackend, "invoke", runtime.backend_method())
            cleanup.enter_context(_iam_enforced(stack))
            yield RunningStack(stack, runtime, cache, endpoint)
    finally:
        _post(f"{endpoint}/moto-api/config", saved_config)
        _post(f"{endpoint}/moto-api/reset", None)
        server.stop()


def _post(url: str, body: dict | None) -> None:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else b"",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def serve(template_path: str, state_file: str) -> int:
    """Stand the template up and serve it until SIGTERM or SIGINT (scripts/rehearse.sh): writes
    `state_file` (endpoint, region, stack name, the administrator's keys) once it is ready."""
    import tempfile

    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    template = json.loads(Path(template_path).read_text())
    with (
        tempfile.TemporaryDirectory(prefix="ebb-rehearsal-") as folder,
        stack_in_moto(template, Path(folder)) as running,
    ):
        stack = running.stack
        status = stack.client("cloudformation").describe_stacks(StackName=stack.stack_name)["Stacks"][0]
        removed = [r["Type"] for r in template["Resources"].values() if r["Type"] in STAND_INS]
        print(
            f"stack {stack.stack_name}: {status['StackStatus']} in moto's CloudFormation at {running.endpoint}: "
            f"{stack.created} resources created, {len(removed)} stood in for; IAM enforced",
            flush=True,
        )
        for type_ in sorted(set(removed)):
            print(f"  {type_}: moto cannot create it; in its place: {STAND_INS[type_]}", flush=True)
        Path(state_file).write_text(
            json.dumps({"endpoint": running.endpoint, "region": REGION, "stack": stack.stack_name, **stack.admin})
        )
        stopped.wait()
        calls = running.runtime.calls
        failed = [c for c in calls if c.error]
        print(
            f"emulator: {len(calls)} invocations ({len(failed)} failed), {len(stack.denied)} requests refused by IAM",
            flush=True,
        )
        for principal, action, resource in stack.denied:
            print(f"  refused: {principal} {action} {resource}", flush=True)
        for call in failed:
            print(
                f"  failed: {call.function} {call.error.get('errorType')}: {call.error.get('errorMessage')}", flush=True
            )
    return 1 if stack.denied else 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "serve":
        print("usage: python tests/infra/moto_stack.py serve TEMPLATE STATE_FILE", file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    sys.exit(serve(sys.argv[2], sys.argv[3]))
