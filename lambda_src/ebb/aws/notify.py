"""Job events for people and other systems: "job finished" and "job failed" on the
deployment's events topic (docs/AWS.md)."""

from __future__ import annotations

import json

from ebb.aws.config import AwsConfig
from ebb.ports import deployment as names
from ebb.stores import aws_clients


def publish_job_event(config: AwsConfig, kind: str, job_id: str, detail: dict, client=None) -> None:
    """Publish ``{"event": kind, "job_id", ...detail}``; ``kind`` is ``names.JOB_FINISHED`` or ``JOB_FAILED``."""
    if not config.events_topic_arn:
        return
    body = {"event": kind, "job_id": job_id, **detail}
    (client or aws_clients.client("sns")).publish(
        TopicArn=config.events_topic_arn,
        Subject=f"Ebb {kind}: {job_id}"[:100],
        Message=json.dumps(body, default=str),
        MessageAttributes={names.EVENT_ATTRIBUTE: {"DataType": "String", "StringValue": kind}},
    )
