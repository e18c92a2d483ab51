"""The S3 object store against a moto_server, as boto3's own configuration finds it."""

from __future__ import annotations

from ebb.stores import open_object_store
from tests.helpers.aws import aws_env, server_client, unique_bucket


def test_default_client_follows_aws_endpoint_url(moto_server, monkeypatch):
    """No client given: boto3's own configuration decides where S3 is (here moto_server)."""
    for name, value in aws_env(moto_server, base={}).items():
        monkeypatch.setenv(name, value)
    bucket = unique_bucket()
    server_client(moto_server).create_bucket(Bucket=bucket)
    store = open_object_store(f"s3://{bucket}/runs/1")
    store.put("report.json", b"{}")
    assert server_client(moto_server).get_object(Bucket=bucket, Key="runs/1/report.json")["Body"].read() == b"{}"
