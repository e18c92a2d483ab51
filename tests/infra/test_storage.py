"""Storage: encrypted, private, SSL-only buckets; checkpoints and scratch expire; only the
data may outlive the stack; a kept bucket can be imported by the next deployment."""

from __future__ import annotations

import json

from tests.helpers.infra import KEPT_BUCKET


def test_buckets_are_encrypted_private_and_ssl_only(default):
    buckets = default.of_type("AWS::S3::Bucket")
    assert len(buckets) == 2
    for props in buckets.values():
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True,
            "BlockPublicPolicy": True,
            "IgnorePublicAcls": True,
            "RestrictPublicBuckets": True,
        }
    denies = [
        s
        for p in default.of_type("AWS::S3::BucketPolicy").values()
        for s in p["PolicyDocument"]["Statement"]
        if s["Effect"] == "Deny" and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
    ]
    assert len(denies) == 2


def test_checkpoints_and_scratch_expire_as_configured(default, scaled):
    for synth in (default, scaled):
        data = next(p for p in synth.of_type("AWS::S3::Bucket").values() if "LoggingConfiguration" in p)
        assert data["VersioningConfiguration"] == {"Status": "Enabled"}
        rules = {r["Id"]: r for r in data["LifecycleConfiguration"]["Rules"]}
        assert rules["Checkpoints"]["Prefix"] == "checkpoints/" and rules["Checkpoints"]["ExpirationInDays"] == 14
        assert rules["Scratch"]["Prefix"] == "scratch/" and rules["Scratch"]["ExpirationInDays"] == 1
        for rule in (rules["Checkpoints"], rules["Scratch"]):
            assert rule["Status"] == "Enabled"
            # Versioning keeps an overwritten checkpoint as a noncurrent version: those go after a day.
            assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}
            assert rule["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
        # Nothing else in the bucket expires (datasets, jobs' outputs), old versions aside.
        assert {r.get("Prefix") for r in rules.values() if "ExpirationInDays" in r} == {"checkpoints/", "scratch/"}


def test_only_the_buckets_outlive_the_stack_and_only_when_asked(default, scaled):
    for synth, bucket_policy in ((default, "Delete"), (scaled, "Retain")):
        for logical_id, resource in synth.resources.items():
            expected = bucket_policy if resource["Type"] == "AWS::S3::Bucket" else "Delete"
            # Queues have fixed names: a kept one would make the next deploy fail.
            assert resource.get("DeletionPolicy", "Delete") == expected, (logical_id, resource["Type"])


def test_a_kept_bucket_is_imported_and_granted_not_created(serverless):
    assert not serverless.of_type("AWS::S3::Bucket") and not serverless.of_type("AWS::S3::BucketPolicy")
    for props in serverless.functions.values():
        assert props["Environment"]["Variables"]["EBB_BUCKET"] == KEPT_BUCKET
    policies = json.dumps(serverless.of_type("AWS::IAM::Policy"))
    for prefix in ("checkpoints/*", "scratch/*", "datasets/*", "jobs/*"):
        assert f":s3:::{KEPT_BUCKET}/{prefix}" in policies, prefix
    assert serverless.template["Outputs"]["DataBucketName"]["Value"] == KEPT_BUCKET
