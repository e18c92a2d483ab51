"""Messaging: worker w's queue hears the control topic's directives for w and for all, raw;
queues and topics are encrypted and SSL-only; undeliverable signals land in a dead-letter queue."""

from __future__ import annotations

import json

from tests.helpers.infra import resolve


def queues_by_name(synth) -> dict[str, str]:
    return {v["QueueName"]: k for k, v in synth.of_type("AWS::SQS::Queue").items() if "QueueName" in v}


def topic_ids(synth) -> dict[str, str]:
    topics = synth.of_type("AWS::SNS::Topic")
    events = next(k for k, v in topics.items() if v.get("DisplayName") == "Ebb job events")
    return {"events": events, "control": next(k for k in topics if k != events)}


def test_each_worker_queue_subscribes_raw_with_its_filter(default, scaled):
    for synth, count in ((default, 24), (scaled, 64)):
        workers = queues_by_name(synth)
        assert sorted(workers) == [f"Ebb-worker-{w:03d}" for w in range(count)]
        control = topic_ids(synth)["control"]
        subscriptions = synth.of_type("AWS::SNS::Subscription").values()
        by_queue = {s["Endpoint"]["Fn::GetAtt"][0]: s for s in subscriptions}
        assert len(by_queue) == count
        for w in range(count):
            sub = by_queue[workers[f"Ebb-worker-{w:03d}"]]
            assert sub["TopicArn"] == {"Ref": control} and sub["Protocol"] == "sqs"
            assert sub["RawMessageDelivery"] is True
            assert sub["FilterPolicy"] == {"worker": [str(w), "all"]}
            assert sub.get("FilterPolicyScope", "MessageAttributes") == "MessageAttributes"
            assert "deadLetterTargetArn" in sub["RedrivePolicy"]


def test_worker_queue_url_prefix_is_queue_000_without_its_number(default):
    prefix = default.functions["worker"]["Environment"]["Variables"]["EBB_WORKER_QUEUE_URL_PREFIX"]
    first = queues_by_name(default)["Ebb-worker-000"]
    split = {"Fn::Split": ["Ebb-worker-000", {"Ref": first}]}
    assert resolve(prefix) == f"<Select:0:{json.dumps(split, sort_keys=True)}>Ebb-worker-"


def test_queues_are_encrypted_ssl_only_and_redrive_to_the_dead_letter_queue(default):
    queues = default.of_type("AWS::SQS::Queue")
    assert len(queues) == 24 + 2  # workers, supervisor, dead letters
    dead_letters = {
        v["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0] for v in queues.values() if "RedrivePolicy" in v
    }
    assert len(dead_letters) == 1
    (dlq,) = dead_letters
    for queue_id, props in queues.items():
        assert props["SqsManagedSseEnabled"] is True, queue_id
        if queue_id != dlq:
            assert props["RedrivePolicy"]["maxReceiveCount"] == 5
            assert props["MessageRetentionPeriod"] == 4 * 3600
    assert queues[dlq]["MessageRetentionPeriod"] == 14 * 86400
    ssl_only = set()
    for policy in default.of_type("AWS::SQS::QueuePolicy").values():
        for statement in policy["PolicyDocument"]["Statement"]:
            if statement["Effect"] == "Deny" and statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}:
                ssl_only.update(q["Ref"] for q in policy["Queues"])
    assert ssl_only == set(queues)


def test_topics_use_a_rotating_customer_key_and_refuse_plain_http(default):
    ids = topic_ids(default)
    topics = default.of_type("AWS::SNS::Topic")
    key_id, key = default.one("AWS::KMS::Key")
    assert key["EnableKeyRotation"] is True
    for topic in ids.values():
        assert topics[topic]["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    policies = default.of_type("AWS::SNS::TopicPolicy").values()
    for topic in ids.values():
        statements = [s for p in policies if {"Ref": topic} in p["Topics"] for s in p["PolicyDocument"]["Statement"]]
        assert any(
            s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in statements
        )
    # CloudWatch alarms publish to the events topic (from this account) and may use the key.
    events_policy = next(p for p in policies if {"Ref": ids["events"]} in p["Topics"])
    alarms = next(s for s in events_policy["PolicyDocument"]["Statement"] if s.get("Sid") == "CloudWatchAlarmsPublish")
    assert alarms["Principal"] == {"Service": "cloudwatch.amazonaws.com"} and alarms["Action"] == "sns:Publish"
    assert "aws:SourceAccount" in alarms["Condition"]["StringEquals"]
    key_statements = key["KeyPolicy"]["Statement"]
    assert any(
        s["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
        and sorted(s["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey"]
        for s in key_statements
    )


def test_who_may_send_and_receive(default):
    """Workers receive only from worker queues and send only to the supervisor queue; the
    supervisor receives its queue and publishes directives; only finalize and on_failure publish events."""
    queues = default.of_type("AWS::SQS::Queue")
    workers = set(queues_by_name(default).values())
    supervisor_queue = next(k for k, v in queues.items() if "QueueName" not in v and "RedrivePolicy" in v)
    ids = topic_ids(default)

    def statements(name):
        role = default.functions[name]["Role"]["Fn::GetAtt"][0]
        return [
            s
            for p in default.of_type("AWS::IAM::Policy").values()
            if {"Ref": role} in p["Roles"]
            for s in p["PolicyDocument"]["Statement"]
        ]

    def targets(name, action):
        out = set()
        for s in statements(name):
            actions = [s["Action"]] if isinstance(s["Action"], str) else s["Action"]
            if action in actions:
                resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
                out.update(r.get("Ref") or r["Fn::GetAtt"][0] for r in resources if isinstance(r, dict))
        return out

    assert targets("worker", "sqs:ReceiveMessage") == workers
    assert targets("worker", "sqs:SendMessage") == {supervisor_queue}
    assert targets("supervisor", "sqs:ReceiveMessage") == {supervisor_queue}
    assert targets("supervisor", "sns:Publish") == {ids["control"]}
    for name in default.functions:
        expected = (
            {ids["events"]}
            if name in ("finalize", "on_failure")
            else ({ids["control"]} if name == "supervisor" else set())
        )
        assert targets(name, "sns:Publish") == expected, name
        if name not in ("worker", "supervisor"):
            assert not targets(name, "sqs:ReceiveMessage") and not targets(name, "sqs:SendMessage"), name
