"""The Ebb stack: composes the constructs; sizes and counts come from CDK context."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from stacks.storage import Storage


class EbbStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        retain = bool(self.node.try_get_context("ebb:retainData") or False)
        self.storage = Storage(self, "Storage", retain=retain)
        CfnOutput(self, "DataBucket", value=self.storage.data.bucket_name,
                  description="datasets, checkpoints, models and reports")
