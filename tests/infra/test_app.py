"""The CDK app: synthesises offline (in-process and through the pinned CLI), checks its context,
refuses to run without its layer, and passes cdk-nag with a reason for every exception."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from stacks.compute import LAYER_STAMP, LayerMissingError
from stacks.settings import FUNCTION_NAMES, Settings, SettingsError
from tests.helpers.infra import ROOT, synthesise


def cdk_json_context() -> dict:
    return json.loads((ROOT / "cdk.json").read_text())["context"]


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


def test_nag_passes_and_every_acknowledgement_gives_a_specific_reason(default, scaled, serverless):
    for variant in (default, scaled, serverless):
        report = json.loads((variant.outdir / "validation-report.json").read_text())
        assert all(not r["violations"] for r in report["pluginReports"]), report  # no plugin reported a violation
        acknowledged = {
            rule: reason
            for entries in variant.metadata.values()
            for entry in entries
            if entry["type"] == "aws:cdk:acknowledged-rules"
            for rule, reason in entry["data"].items()
            if "AwsSolutions" in rule
        }
        assert acknowledged, "nag findings are acknowledged where they arise"
        for rule, reason in acknowledged.items():
            assert len(reason) >= 40 and reason.rstrip().endswith((".", ")")), (rule, reason)
    # The reasons explain a choice; the same sentence should not cover unrelated rules.
    reasons = [
        r
        for e in default.metadata.values()
        for x in e
        if x["type"] == "aws:cdk:acknowledged-rules"
        for k, r in x["data"].items()
        if "AwsSolutions" in k
    ]
    assert len(set(reasons)) >= 10


def test_npx_cdk_synth_works_offline(cli_synth):
    """The pinned CLI (package.json) runs app.py and writes the template: no network, no Docker."""
    process, outdir = cli_synth
    if process is None:
        pytest.skip("node_modules is not installed (run scripts/setup.sh)")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]
    template = json.loads((outdir / "Ebb.template.json").read_text())
    assert set(template["Outputs"]) == {
        "StateMachineArn",
        "DataBucketName",
        "EventsTopicArn",
        "DashboardName",
        "DashboardUrl",
        "PredictStateMachineArn",
        "TuneStateMachineArn",
    }


def test_cdk_json_documents_every_key_settings_reads():
    read = set()

    def record(key):
        read.add(key)
        return cdk_json_context().get(key)

    Settings.from_context(record)
    documented = {k for k in cdk_json_context() if k.startswith("ebb:")}
    assert read == documented
    aws_md = (ROOT / "docs" / "AWS.md").read_text()
    per_function = re.compile(r"ebb:(" + "|".join(FUNCTION_NAMES) + r")(\w+)")
    for key in documented:
        generic = per_function.sub(lambda m: f"ebb:<fn>{m.group(2)}", key)
        assert f"`{key}`" in aws_md or f"`{generic}`" in aws_md, f"{key} is not in docs/AWS.md"


def test_settings_parse_cli_strings_and_name_the_key_of_a_bad_value():
    context = cdk_json_context()
    cli = {
        **context,
        "ebb:maxWorkers": "8",
        "ebb:retainData": "true",
        "ebb:workerReservedConcurrency": "null",
        "ebb:interfaceEndpoints": "secretsmanager, sqs",
        "ebb:supervisorMemoryMb": "2048",
    }
    settings = Settings.from_context(cli.get)
    assert (settings.max_workers, settings.retain_data, settings.interface_endpoints) == (
        8,
        True,
        ("secretsmanager", "sqs"),
    )
    assert settings.functions["worker"].reserved_concurrency is None
    assert settings.functions["supervisor"].memory_mb == 2048

    for key, value, message in (
        ("ebb:maxWorkers", "lots", r"ebb:maxWorkers must be an integer in \[1, 100\], got 'lots'"),
        ("ebb:maxWorkers", 101, r"ebb:maxWorkers must be an integer in \[1, 100\], got 101"),
        ("ebb:egress", "vpn", r"ebb:egress must be one of endpoints, nat, got 'vpn'"),
        ("ebb:cacheNodeType", "t4g.medium", r"ebb:cacheNodeType must be an ElastiCache node type"),
        ("ebb:interfaceEndpoints", ["s3"], r"ebb:interfaceEndpoints must be a list drawn from secretsmanager"),
        ("ebb:stackName", "my_stack", r"ebb:stackName must be 1-32 letters, digits and single hyphens"),
        ("ebb:logRetentionDays", 10, r"ebb:logRetentionDays must be one of the retention periods"),
        ("ebb:workerReservedConcurrency", 10, r"ebb:workerReservedConcurrency \(10\) is below ebb:maxWorkers \(24\)"),
        ("ebb:dataBucketName", "My_Bucket", r"ebb:dataBucketName must be an S3 bucket name"),
        ("ebb:endpointAzs", 3, r"ebb:endpointAzs \(3\) cannot exceed ebb:maxAzs \(2\)"),
        ("ebb:workerMemoryMb", None, r"context key ebb:workerMemoryMb is missing: set it in cdk.json"),
        (
            "ebb:workerTimeoutSeconds",
            600,
            r"ebb:supervisorTimeoutSeconds \(900\) exceeds ebb:workerTimeoutSeconds \(600\): a round lasts",
        ),
    ):
        with pytest.raises(SettingsError, match=message):
            Settings.from_context({**context, key: value}.get)


def test_synthesis_stops_with_a_clear_message_without_the_layer(tmp_path):
    with pytest.raises(
        LayerMissingError, match=r"layer folder .*python is missing or empty: run `bash scripts/build_layer.sh`"
    ):
        synthesise(tmp_path / "out", layer_dir=tmp_path / "no-layer")
    # A layer staged for the other architecture would fail at import on Lambda: refuse it too.
    layer = tmp_path / "layer"
    shutil.copytree(ROOT / "layers" / "common", layer)
    with pytest.raises(
        LayerMissingError,
        match=r"staged for x86_64, but ebb:architecture is arm64: "
        r"run `bash scripts/build_layer.sh --arch arm64`",
    ):
        synthesise(tmp_path / "out2", {"ebb:architecture": "arm64"}, layer_dir=layer)
    # ... and one staged for another Python than the functions' (the image's FROM).
    stamp = json.loads((layer / LAYER_STAMP).read_text())
    (layer / LAYER_STAMP).write_text(json.dumps({**stamp, "python": "3.11"}))
    with pytest.raises(
        LayerMissingError,
        match=r"staged for Python 3\.11, but the functions run 3\.12 "
        r"\(lambda_src/Dockerfile\): run `bash scripts/build_layer.sh`",
    ):
        synthesise(tmp_path / "out4", layer_dir=layer)
    (layer / LAYER_STAMP).unlink()
    with pytest.raises(LayerMissingError, match="staged for an unknown platform"):
        synthesise(tmp_path / "out3", layer_dir=layer)
