"""What AWS does and moto 5.2 does not, added to moto for the tests and scripts/rehearse.sh.

- **Lambda GetAccountSettings** (moto has no route for it): the account's concurrency as
  AWS reckons it, the quota (``MOTO_LAMBDA_CONCURRENCY_QUOTA``, moto's own knob; AWS's
  default 1,000) less every function's reserved concurrency.
- **IAM on resources**: with IAM enforced, moto authorises SNS, Secrets Manager, Lambda and
  Step Functions requests against the resource ``*``, so a grant scoped to a topic, a
  secret, a function or a state machine (every grant CDK writes) is denied. Here each
  request names its resource (the topic, the secret's ARN, the function's ARN, the state
  machine's or the execution's ARN), as AWS evaluates it.
- **IAM action names**: moto names the action after the API call (``lambda:Invoke``,
  ``sns:PublishBatch``, ``s3:HeadBucket``); AWS authorises some calls by another action
  (``lambda:InvokeFunction``; a batch by the single call's; HeadBucket by ``s3:ListBucket``),
  and the grants name those.
- **Signatures of requests without a body** (Lambda's GETs): moto signs its copy with the
  request's parsed parameters as the payload, botocore signed an empty one; here an empty one.
- **A nested execution's request and answer** (``states:startExecution.sync:2``): moto hands
  the state's parameters (``Input``, ``Name``, ``StateMachineArn``) to boto as written and
  reads boto's answer as if Step Functions-cased; Step Functions maps both between its
  casing and the API's members (``input``, ``executionArn``, ...), as here, so the Tune
  state machine's trials start and are watched to their end.
- **A state machine made by CloudFormation runs**: moto's CloudFormation creates it in the
  backend that does not execute, even when ``execute_state_machine`` is on; here it goes
  to the backend the Step Functions API answers from.

``install()`` patches moto in this process (the in-process server of tests/infra/moto_stack.py);
``python tests/moto_additions.py [moto_server flags]`` runs a moto_server with them.
"""

from __future__ import annotations

import json
import os
import re
import sys

DEFAULT_CONCURRENCY_QUOTA = 1000  # AWS's default "Concurrent executions" quota per account and region
_FUNCTION_IN_PATH = re.compile(r"/functions/([^/]+)")
# The IAM action AWS authorises an API call by, where it is not the call's own name.
IAM_ACTIONS = {
    "lambda:Invoke": "lambda:InvokeFunction",
    "sns:PublishBatch": "sns:Publish",
    "sqs:SendMessageBatch": "sqs:SendMessage",
    "sqs:DeleteMessageBatch": "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibilityBatch": "sqs:ChangeMessageVisibility",
    "s3:HeadBucket": "s3:ListBucket",
}
_installed = False


def install() -> None:
    """Patch moto (idempotent)."""
    global _installed
    if _installed:
        return
    from moto.awslambda import urls as lambda_urls
    from moto.awslambda.responses import LambdaResponse
    from moto.iam.access_control import IAMRequestBase
    from moto.secretsmanager.responses import SecretsManagerResponse
    from moto.sns.responses import SNSResponse
    from moto.stepfunctions.models import StateMachine
    from moto.stepfunctions.responses import StepFunctionResponse

    lambda_urls.url_paths[r"{0}/(?P<api_version>[^/]+)/account-settings/?$"] = LambdaResponse.dispatch
    LambdaResponse.get_account_settings = _get_account_settings
    LambdaResponse._determine_resource = _lambda_resource
    SNSResponse._determine_resource = _sns_resource
    SecretsManagerResponse._determine_resource = _secret_resource
    StepFunctionResponse._determine_resource = _states_resource
    original_init = IAMRequestBase.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._action = IAM_ACTIONS.get(self._action, self._action)

    IAMRequestBase.__init__ = init
    original_request = IAMRequestBase._create_aws_request

    def aws_request(self):
        request = original_request(self)
        if not self._body and self._method in ("GET", "HEAD", "DELETE"):
            request.data = b""
        return request

    IAMRequestBase._create_aws_request = aws_request
    _normalise_sfn_requests()
    StateMachine.create_from_cloudformation_json = classmethod(_create_state_machine)
    StateMachine.delete_from_cloudformation_json = classmethod(_delete_state_machine)
    _installed = True


def _normalise_sfn_requests() -> None:
    """Step Functions' own integration (startExecution): the parameters as the API's members."""
    import botocore.session
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_sfn import (
        StateTaskServiceSfn,
    )

    original = StateTaskServiceSfn._normalise_parameters
    model = botocore.session.get_session().get_service_model("stepfunctions")

    def operation(self, service_action_name):
        return model.operation_model(self._to_sfn_cased(self._get_boto_service_action(service_action_name)))

    def normalise(self, parameters, boto_service_name=None, service_action_name=None):
        original(self, parameters, boto_service_name, service_action_name)
        self._to_boto_request(parameters, operation(self, service_action_name).input_shape)

    def normalise_response(self, response, boto_service_name=None, service_action_name=None):
        self._from_boto_response(response, operation(self, service_action_name).output_shape)

    StateTaskServiceSfn._normalise_parameters = normalise
    StateTaskServiceSfn._normalise_response = normalise_response


def _get_account_settings(self):
    quota = int(os.environ.get("MOTO_LAMBDA_CONCURRENCY_QUOTA", DEFAULT_CONCURRENCY_QUOTA))
    functions = list(self.backend.list_functions())
    reserved = sum(int(f.reserved_concurrency or 0) for f in functions)
    body = {
        "AccountLimit": {
            "TotalCodeSize": 80_530_636_800,
            "CodeSizeUnzipped": 262_144_000,
            "CodeSizeZipped": 52_428_800,
            "ConcurrentExecutions": quota,
            "UnreservedConcurrentExecutions": quota - reserved,
        },
        "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": len(functions)},
    }
    return 200, {"Content-Type": "application/json"}, json.dumps(body)


def _lambda_resource(self) -> str:
    """The function a request names (Invoke, GetFunction, ...); ``*`` for account-wide calls."""
    found = _FUNCTION_IN_PATH.search(self.path)
    if not found:
        return "*"
    name = found.group(1).replace("%3A", ":")
    if name.startswith("arn:"):
        return name
    return f"arn:aws:lambda:{self.region}:{self.current_account}:function:{name}"


def _sns_resource(self) -> str:
    return self._get_param("TopicArn") or self._get_param("TargetArn") or "*"


def _states_resource(self) -> str:
    """The execution a request names (Describe, Stop, GetExecutionHistory), else the state machine (Start...)."""
    return self._get_param("executionArn") or self._get_param("stateMachineArn") or "*"


def _secret_resource(self) -> str:
    from moto.secretsmanager.models import secretsmanager_backends

    secret_id = self._get_param("SecretId")
    if not secret_id:
        return "*"
    secrets = secretsmanager_backends[self.current_account][self.region].secrets
    return secrets[secret_id].arn if secret_id in secrets else "*"


def _create_state_machine(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
    from moto.stepfunctions.models import cfn_to_api_tags
    from moto.stepfunctions.responses import get_backend

    properties = cloudformation_json["Properties"]
    return get_backend(account_id, region_name).create_state_machine(
        properties.get("StateMachineName", resource_name),
        properties.get("DefinitionString", ""),
        properties.get("RoleArn", ""),
        tags=cfn_to_api_tags(properties.get("Tags", [])),
    )


def _delete_state_machine(cls, resource_name, cloudformation_json, account_id, region_name):
    from moto.stepfunctions.responses import get_backend

    get_backend(account_id, region_name).delete_state_machine(resource_name)


if __name__ == "__main__":
    install()
    from moto.server import main

    main(sys.argv[1:])
