"""Dashboard, alarms and the stack outputs of docs/AWS.md."""

from __future__ import annotations

import json

from ebb.ports.deployment import JOB_METRICS
from tests.helpers.infra import resolve


def metrics_of(body: dict) -> list[list]:
    return [m for w in body["widgets"] for m in w.get("properties", {}).get("metrics", [])]


def names(metrics: list[list], namespace: str) -> set[str]:
    return {m[1] for m in metrics if m and m[0] == namespace}


def test_job_widgets_follow_the_job_variable(default):
    body = default.dashboard
    (variable,) = body["variables"]
    assert variable["type"] == "property" and variable["property"] == "JobId" and variable["inputType"] == "select"
    assert variable["search"].startswith("{Ebb,JobId}") and variable["populateFrom"] == "JobId"
    metrics = metrics_of(body)
    assert names(metrics, "Ebb") == set(JOB_METRICS)
    for metric in (m for m in metrics if m[0] == "Ebb"):
        assert metric[2] == "JobId"  # the dimension the variable replaces


def test_deployment_widgets_cover_functions_cache_queues_and_executions(default, serverless):
    metrics = metrics_of(default.dashboard)
    lambda_metrics = [m for m in metrics if m[0] == "AWS/Lambda"]
    for metric in ("Errors", "Throttles", "Duration"):
        graphed = {m[3] for m in lambda_metrics if m[1] == metric}
        assert graphed == {f"<Ref:{default.function_id(n)}>" for n in default.functions}, metric
    assert names(metrics, "AWS/ElastiCache") == {
        "EngineCPUUtilization",
        "DatabaseMemoryUsagePercentage",
        "NetworkBytesIn",
        "NetworkBytesOut",
    }
    group_id, _ = default.one("AWS::ElastiCache::ReplicationGroup")
    assert {m[3] for m in metrics if m[0] == "AWS/ElastiCache"} == {f"<Ref:{group_id}>-001"}
    assert names(metrics, "AWS/SQS") == {"ApproximateAgeOfOldestMessage", "ApproximateNumberOfMessagesVisible"}
    oldest_worker = [w for w in default.dashboard["widgets"] if "SQS age" in w.get("properties", {}).get("title", "")]
    assert "MAX([w0, w1," in json.dumps(oldest_worker)  # the 24 worker queues, as one line
    assert names(metrics, "AWS/States") == {
        "ExecutionsStarted",
        "ExecutionsSucceeded",
        "ExecutionsFailed",
        "ExecutionsTimedOut",
        "ExecutionsAborted",
    }
    serverless_metrics = metrics_of(serverless.dashboard)
    assert names(serverless_metrics, "AWS/ElastiCache") == {
        "ElastiCacheProcessingUnits",
        "BytesUsedForCache",
        "NetworkBytesIn",
        "NetworkBytesOut",
    }
    assert {m[3] for m in serverless_metrics if m[0] == "AWS/ElastiCache"} == {"ebb-cache"}


def test_alarms_on_failed_executions_and_dead_letters_reach_the_events_topic(default):
    alarms = {v["MetricName"]: v for v in default.of_type("AWS::CloudWatch::Alarm").values()}
    assert set(alarms) == {"ExecutionsFailed", "ApproximateNumberOfMessagesVisible"}
    events = next(k for k, v in default.of_type("AWS::SNS::Topic").items() if v.get("DisplayName") == "Ebb job events")
    for alarm in alarms.values():
        assert alarm["AlarmActions"] == [{"Ref": events}]
        assert alarm["Threshold"] == 1 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["TreatMissingData"] == "notBreaching"
    dlq = alarms["ApproximateNumberOfMessagesVisible"]["Dimensions"][0]["Value"]
    dead_letters = {
        v["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
        for v in default.of_type("AWS::SQS::Queue").values()
        if "RedrivePolicy" in v
    }
    assert dlq == {"Fn::GetAtt": [*dead_letters, "QueueName"]}


def test_outputs_are_the_documented_ones(default):
    outputs = default.template["Outputs"]
    assert set(outputs) == {
        "StateMachineArn",
        "DataBucketName",
        "EventsTopicArn",
        "DashboardName",
        "DashboardUrl",
        "PredictStateMachineArn",
        "TuneStateMachineArn",
    }
    assert outputs["PredictStateMachineArn"]["Value"] == {"Ref": default.machine("Predict")[0]}
    sm_id, _ = default.machine()
    dashboard_id, _ = default.one("AWS::CloudWatch::Dashboard")
    assert outputs["StateMachineArn"]["Value"] == {"Ref": sm_id}
    assert outputs["DashboardName"]["Value"] == {"Ref": dashboard_id}
    assert resolve(outputs["DashboardUrl"]["Value"]) == (
        "https://<Ref:AWS::Region>.console.aws.amazon.com/cloudwatch/home?region=<Ref:AWS::Region>"
        f"#dashboards:name=<Ref:{dashboard_id}>"
    )
    data = next(k for k, v in default.of_type("AWS::S3::Bucket").items() if "LoggingConfiguration" in v)
    assert outputs["DataBucketName"]["Value"] == {"Ref": data}
    events = next(k for k, v in default.of_type("AWS::SNS::Topic").items() if v.get("DisplayName") == "Ebb job events")
    assert outputs["EventsTopicArn"]["Value"] == {"Ref": events}
