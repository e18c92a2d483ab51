"""Security checks across the whole template: no wildcard IAM actions, no secret values,
cfn-lint clean."""

from __future__ import annotations

import json
import re

import yaml

from tests.helpers.infra import ROOT, resolve

CREDENTIAL_KEY = re.compile(r"password|passwords|authtoken|token|secretstring", re.IGNORECASE)


def policy_documents(synth):
    """(logical id, property, document) of every policy in the template: identity and resource policies."""
    for logical_id, resource in synth.resources.items():
        for prop, value in resource.get("Properties", {}).items():
            if prop in ("PolicyDocument", "AssumeRolePolicyDocument", "KeyPolicy"):
                yield logical_id, prop, value
            if prop == "Policies":  # inline policies of a role
                for policy in value:
                    yield logical_id, prop, policy["PolicyDocument"]


def actions_of(statement) -> list[str]:
    actions = statement.get("Action", [])
    return [actions] if isinstance(actions, str) else actions


def test_no_statement_allows_a_wildcard_action(default, scaled, serverless):
    for synth in (default, scaled, serverless):
        root_delegations = 0
        for logical_id, prop, document in policy_documents(synth):
            for statement in document["Statement"]:
                if statement["Effect"] != "Allow":
                    continue  # a Deny of s3:* / sqs:* / sns:* over plain HTTP is the point
                wildcards = [a for a in actions_of(statement) if a == "*" or a.endswith(":*")]
                if prop == "KeyPolicy" and wildcards == ["kms:*"]:
                    # KMS's default key policy: the account (root) keeps administering its key, and
                    # everyone else needs an IAM grant of their own. No other principal gets kms:*.
                    account = synth.account or "<Ref:AWS::AccountId>"
                    partition = "aws" if synth.region else "<Ref:AWS::Partition>"
                    assert resolve(statement["Principal"]["AWS"]) == f"arn:{partition}:iam::{account}:root", statement
                    root_delegations += 1
                    continue
                assert not wildcards, (logical_id, statement)
        assert root_delegations == 1


def test_no_secret_value_is_in_the_template(default, serverless):
    for synth in (default, serverless):
        references: list[list] = []

        def walk(node, path, references=references):
            if isinstance(node, dict):
                for key, value in node.items():
                    if CREDENTIAL_KEY.fullmatch(key) and not isinstance(value, bool):
                        for leaf in value if isinstance(value, list) else [value]:
                            text = resolve(leaf)
                            assert text.startswith("{{resolve:secretsmanager:"), (path + [key], leaf)
                            references.append(path + [key])
                    walk(value, path + [key], references)
            elif isinstance(node, list):
                for i, value in enumerate(node):
                    walk(value, path + [i], references)

        walk(synth.template, [])
        assert references, "the cache reads its token by dynamic reference"
        text = json.dumps(synth.template)
        # The token is resolved only into the cache resources; never into a function's environment,
        # the state machine or an output, where anyone who can read the configuration would see it.
        assert text.count("{{resolve:secretsmanager:") == len(references)
        for props in synth.functions.values():
            assert "resolve:secretsmanager" not in json.dumps(props["Environment"])
        (secret,) = synth.of_type("AWS::SecretsManager::Secret").values()
        assert "GenerateSecretString" in secret and "SecretString" not in secret


def test_cfn_lint_is_clean(default, scaled, serverless):
    """cfn-lint with .cfnlintrc.yaml (regions, the one ignored check and why), on every variant."""
    settings = yaml.safe_load((ROOT / ".cfnlintrc.yaml").read_text())
    assert settings["ignore_checks"] == ["W3005", "W3010"]
    for synth in (default, scaled, serverless):
        output, _ = synth.lint.communicate(timeout=300)
        assert synth.lint.returncode == 0, output
