"""What AWS does and moto 5.2 does not, added to moto for the tests and scripts/rehearse.sh.

- **Lambda GetAccountSettings** (moto has no route for it): the account's concurrency as
  AWS reckons it, the quota (``MOTO_LAMBDA_CONCURRENCY_QUOTA``, moto's own knob; AWS's
  default 1,000) less every function's reserved concurrency.
- **IAM on resources**: with IAM enforced, moto authorises SNS, Secrets Manager and Lambda
  requests against the resource ``*``, so a grant scoped to a topic, a secret or a
  function (every grant CDK writes) is denied. Here each request names its resource
  (the topic, the secret's ARN, the function's ARN), as AWS evaluates it.

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
_installed = False


def install() -> None:
    """Patch moto (idempotent)."""
    global _installed
    if _installed:
        return
    from moto.awslambda import urls as lambda_urls
    from moto.awslambda.responses import LambdaResponse
    from moto.secretsmanager.responses import SecretsManagerResponse
    from moto.sns.responses import SNSResponse

    lambda_urls.url_paths[r"{0}/(?P<api_version>[^/]+)/account-settings/?$"] = LambdaResponse.dispatch
    LambdaResponse.get_account_settings = _get_account_settings
    LambdaResponse._determine_resource = _lambda_resource
    SNSResponse._determine_resource = _sns_resource
    SecretsManagerResponse._determine_resource = _secret_resource
    _installed = True


def _get_account_settings(self):
    quota = int(os.environ.get("MOTO_LAMBDA_CONCURRENCY_QUOTA", DEFAULT_CONCURRENCY_QUOTA))
    functions = list(self.backend.list_functions())
    reserved = sum(int(f.reserved_concurrency or 0) for f in functions)
    body = {"AccountLimit": {"TotalCodeSize": 80_530_636_800, "CodeSizeUnzipped": 262_144_000,
                             "CodeSizeZipped": 52_428_800, "ConcurrentExecutions": quota,
                             "UnreservedConcurrentExecutions": quota - reserved},
            "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": len(functions)}}
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


def _secret_resource(self) -> str:
    from moto.secretsmanager.models import secretsmanager_backends

    secret_id = self._get_param("SecretId")
    if not secret_id:
        return "*"
    secrets = secretsmanager_backends[self.current_account][self.region].secrets
    return secrets[secret_id].arn if secret_id in secrets else "*"


if __name__ == "__main__":
    install()
    from moto.server import main

    main(sys.argv[1:])
