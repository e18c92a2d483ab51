"""Messaging: the SNS/SQS signal channel and the events topic users subscribe to.

- Control topic: the supervisor's directives. Worker w's queue subscribes with raw
  delivery and the filter policy `ebb.ports.deployment.worker_filter_policy(w)`,
  {"worker": ["<w>", "all"]} (docs/AWS.md).
- Supervisor queue: the workers' reports.
- Events topic: "job finished" / "job failed" from the handlers, and the alarms.
- One dead-letter queue takes both what a queue could not get consumed and what SNS could
  not deliver to a queue; an alarm watches it.

Encryption: the queues use SQS-managed keys (SSE-SQS): free, no KMS request on the
per-step hot path, and SNS can deliver into them without a key policy. The topics use one
customer-managed KMS key with rotation, because SNS offers no service-managed encryption
except the AWS-managed key, whose policy cannot admit CloudWatch alarms to publish.
Every queue and topic refuses requests that are not over TLS.
"""

from __future__ import annotations

from aws_cdk import Aws, Duration, Fn, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from ebb.ports import deployment as names

# A directive or report matters for one round (< 15 minutes); older ones are noise.
SIGNAL_RETENTION = Duration.hours(4)
# Received this often without being deleted: the consumer is failing on it.
MAX_RECEIVES = 5


class Messaging(Construct):
    """Topics and queues; `worker_queue_url_prefix` + f"{w:03d}" is worker w's queue URL."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        max_workers: int,
        queue_name_prefix: str,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        self.topic_key = kms.Key(
            self,
            "TopicKey",
            enable_key_rotation=True,
            removal_policy=removal_policy,
            description="Encrypts the Ebb control and events topics",
        )
        # CloudWatch alarms publish to the events topic: they must be able to use its key.
        self.topic_key.grant(iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey")

        self.events_topic = sns.Topic(
            self, "Events", display_name="Ebb job events", master_key=self.topic_key, enforce_ssl=True
        )
        self.events_topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.events_topic.topic_arn],
                conditions={
                    "ArnLike": {
                        "aws:SourceArn": f"arn:{Aws.PARTITION}:cloudwatch:{Aws.REGION}:{Aws.ACCOUNT_ID}:alarm:*"
                    },
                    "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                },
            )
        )
        self.control_topic = sns.Topic(self, "Control", master_key=self.topic_key, enforce_ssl=True)

        queue_defaults = {
            "encryption": sqs.QueueEncryption.SQS_MANAGED,
            "enforce_ssl": True,
            "removal_policy": removal_policy,
        }
        self.dead_letters = sqs.Queue(self, "DeadLetters", retention_period=Duration.days(14), **queue_defaults)
        redrive = sqs.DeadLetterQueue(queue=self.dead_letters, max_receive_count=MAX_RECEIVES)
        self.supervisor_queue = sqs.Queue(
            self, "SupervisorQueue", retention_period=SIGNAL_RETENTION, dead_letter_queue=redrive, **queue_defaults
        )

        self.worker_queues: list[sqs.Queue] = []
        for worker in range(max_workers):
            queue = sqs.Queue(
                self,
                f"Worker{worker:03d}",
                queue_name=names.worker_queue_name(queue_name_prefix, worker),
                retention_period=SIGNAL_RETENTION,
                dead_letter_queue=redrive,
                **queue_defaults,
            )
            self.control_topic.add_subscription(
                subscriptions.SqsSubscription(
                    queue,
                    raw_message_delivery=True,
                    dead_letter_queue=self.dead_letters,
                    filter_policy={
                        attribute: sns.SubscriptionFilter.string_filter(allowlist=values)
                        for attribute, values in names.worker_filter_policy(worker).items()
                    },
                )
            )
            self.worker_queues.append(queue)
        # The URL of queue 000 with its name cut off: the same host form CloudFormation returns.
        first = self.worker_queues[0]
        self.worker_queue_url_prefix = Fn.join(
            "",
            [Fn.select(0, Fn.split(names.worker_queue_name(queue_name_prefix, 0), first.queue_url)), queue_name_prefix],
        )
