"""The Ebb stack: composes the constructs and declares the outputs of docs/AWS.md; no logic of its own."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from constructs import Construct

from ebb.ports import deployment as names
from stacks.cache import Cache
from stacks.compute import Compute
from stacks.dashboard import Dashboard
from stacks.messaging import Messaging
from stacks.network import Network
from stacks.predict import PredictWorkflow
from stacks.settings import Settings
from stacks.storage import Storage
from stacks.tune import TuneWorkflow
from stacks.workflow import Workflow


class EbbStack(Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, settings: Settings, lambda_src: Path, layer_dir: Path, **kwargs
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        s = settings
        # Only the data may outlive the stack (ebb:retainData): the rest is rebuilt by the next
        # deploy, and a kept queue (fixed names) would even block it.
        removal = RemovalPolicy.DESTROY
        retention = s.log_retention

        self.network = Network(
            self,
            "Network",
            max_azs=s.max_azs,
            egress=s.egress,
            interface_endpoints=s.interface_endpoints,
            endpoint_azs=s.endpoint_azs,
            log_retention=retention,
            removal_policy=removal,
        )
        self.storage = Storage(
            self,
            "Storage",
            retain=s.retain_data,
            existing_bucket_name=s.data_bucket_name,
            checkpoint_expiry_days=s.checkpoint_expiry_days,
            scratch_expiry_days=s.scratch_expiry_days,
        )
        self.cache = Cache(
            self,
            "Cache",
            vpc=self.network.vpc,
            subnet_ids=self.network.private_subnet_ids,
            clients=self.network.functions_security_group,
            mode=s.cache_mode,
            engine=s.cache_engine,
            node_type=s.cache_node_type,
            shards=s.cache_shards,
            replicas=s.cache_replicas,
            serverless_max_gb=s.cache_serverless_max_gb,
            removal_policy=removal,
        )
        self.messaging = Messaging(
            self,
            "Messaging",
            max_workers=s.max_workers,
            queue_name_prefix=names.worker_queue_prefix(s.stack_name),
            removal_policy=removal,
        )
        self.compute = Compute(
            self,
            "Compute",
            lambda_src=lambda_src,
            layer_dir=layer_dir,
            architecture=s.architecture,
            sizes=s.functions,
            log_retention=retention,
            removal_policy=removal,
            vpc=self.network.vpc,
            vpc_subnets=self.network.private_subnets,
            security_group=self.network.functions_security_group,
            bucket=self.storage.data,
            cache=self.cache,
            messaging=self.messaging,
            max_workers=s.max_workers,
            trace_in_vpc=s.egress == "nat" or "xray" in s.interface_endpoints,
            deployment=s.deployment(),
        )
        self.workflow = Workflow(
            self,
            "Workflow",
            functions=self.compute.functions,
            max_workers=s.max_workers,
            log_retention=retention,
            removal_policy=removal,
        )
        self.predict = PredictWorkflow(
            self,
            "Predict",
            function=self.compute.functions["predict"],
            max_shards=s.max_workers,
            log_retention=retention,
            removal_policy=removal,
        )
        self.tune = TuneWorkflow(
            self,
            "Tune",
            function=self.compute.functions["tune"],
            training=self.workflow.state_machine,
            log_retention=retention,
            removal_policy=removal,
        )
        self.dashboard = Dashboard(
            self,
            "Dashboard",
            functions=self.compute.functions,
            cache=self.cache,
            supervisor_queue=self.messaging.supervisor_queue,
            worker_queues=self.messaging.worker_queues,
            dead_letters=self.messaging.dead_letters,
            state_machine=self.workflow.state_machine,
            alarm_topic=self.messaging.events_topic,
            predict_machine=self.predict.state_machine,
            tune_machine=self.tune.state_machine,
        )

        # docs/AWS.md "Stack outputs": read by `ebb submit`, `ebb watch` and `ebb report`.
        CfnOutput(
            self,
            names.STATE_MACHINE_OUTPUT,
            value=self.workflow.state_machine.state_machine_arn,
            description="the training state machine: one execution per job",
        )
        CfnOutput(
            self,
            names.BUCKET_OUTPUT,
            value=self.storage.data.bucket_name,
            description="datasets, checkpoints, models and reports",
        )
        CfnOutput(
            self,
            names.EVENTS_TOPIC_OUTPUT,
            value=self.messaging.events_topic.topic_arn,
            description="subscribe to hear of finished and failed jobs and of alarms",
        )
        CfnOutput(
            self,
            names.DASHBOARD_NAME_OUTPUT,
            value=self.dashboard.dashboard_name,
            description="the CloudWatch dashboard",
        )
        CfnOutput(self, names.DASHBOARD_URL_OUTPUT, value=self.dashboard.url, description="the CloudWatch dashboard")
        CfnOutput(
            self,
            names.PREDICT_STATE_MACHINE_OUTPUT,
            value=self.predict.state_machine.state_machine_arn,
            description="the Predict state machine: one execution per `ebb predict --stack`",
        )
        CfnOutput(
            self,
            names.TUNE_STATE_MACHINE_OUTPUT,
            value=self.tune.state_machine.state_machine_arn,
            description="the Tune state machine: one execution per `ebb tune --stack`",
        )
