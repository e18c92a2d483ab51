"""The CDK app synthesises offline, passes cdk-nag, and encrypts and locks its storage."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    from app import build_app

    out = tmp_path_factory.mktemp("cdk.out")
    # cdk-nag runs as a validation plugin: any unacknowledged finding makes synth raise.
    assembly = build_app(str(out)).synth()
    return assembly.get_stack_by_name("Ebb").template


def test_cdk_nag_rejects_a_noncompliant_bucket(tmp_path):
    from aws_cdk import App, Stack, Validations
    from aws_cdk import aws_s3 as s3
    from cdk_nag import AwsSolutionsChecks

    app = App(outdir=str(tmp_path))
    s3.Bucket(Stack(app, "Bad"), "Open")
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    with pytest.raises(Exception, match="AwsSolutions-S1|Validation failed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    assert "AwsSolutions-S1" in json.dumps(report)


def test_buckets_are_encrypted_private_and_ssl_only(template):
    buckets = {k: v for k, v in template["Resources"].items() if v["Type"] == "AWS::S3::Bucket"}
    assert len(buckets) == 2
    for bucket in buckets.values():
        props = bucket["Properties"]
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    policies = [v for v in template["Resources"].values() if v["Type"] == "AWS::S3::BucketPolicy"]
    denies = [s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]
              if s["Effect"] == "Deny" and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"]
    assert len(denies) == 2


def test_no_wildcard_iam_actions_are_allowed(template):
    for res in template["Resources"].values():
        doc = res.get("Properties", {}).get("PolicyDocument", {})
        for stmt in doc.get("Statement", []):
            if stmt["Effect"] != "Allow":
                continue  # a Deny on s3:* (the SSL-only rule) is the point
            actions = stmt.get("Action", [])
            actions = [actions] if isinstance(actions, str) else actions
            assert "*" not in actions and not any(a.endswith(":*") for a in actions), stmt
