"""Predict: the state machine `ebb predict --stack` runs (docs/AWS.md "Predicting").

    Plan -> Shards = Map over $.shards: ScoreShard -> WriteManifest -> Succeed
    any Catch -> PredictFailed (Fail, the error's cause)

Every step is the predict function (`ebb.aws.handlers.predict`, an `action` each). Plan cuts
the input (an S3 object's byte ranges, or the users to recommend for) into shard
descriptors; the Map scores them at once (MaxConcurrency 0), each writing its shard under
`predictions/<run>/`; WriteManifest writes the shards' manifest with the metrics and the
cost. Past INLINE_MAP_LIMIT shards (ebb:maxWorkers, which bounds both) the Map runs in
Distributed mode, each shard a child Standard execution; moto runs the inline Map (the
rehearsal's stacks stay below the limit).

The machine has a role of its own, which may invoke the predict function and nothing else.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, RemovalPolicy, Stack, Validations
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from ebb.ports import deployment as names
from ebb.ports.deployment import INLINE_MAP_LIMIT
from stacks.workflow import _nag, _UnlimitedMap, lambda_task, task_state_machine

_RUN_FIELDS = ("run", "model", "input", "with_labels", "skip_bad_rows", "recommend", "users", "exclude_seen")


class PredictWorkflow(Construct):
    """`state_machine` after construction."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        function: lambda_.IFunction,
        max_shards: int,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        fail = sfn.Fail(self, "PredictFailed", error_path="$.error.Error", cause_path="$.error.Cause")

        def invoke(name: str, payload: sfn.TaskInput, **kwargs) -> tasks.LambdaInvoke:
            return lambda_task(self, name, function, payload, **kwargs)

        plan = invoke(
            names.PLAN_STATE,
            sfn.TaskInput.from_object({"action": "plan", "shards.$": "$.shards", **_fields("$")}),
            result_selector={"shards.$": "$.Payload.shards"},
            result_path="$.plan",
        )
        shard = invoke(names.SHARD_STATE, sfn.TaskInput.from_json_path_at("$"), output_path="$.Payload")
        item = {"action": "shard", **{f"{k}.$": f"$$.Map.Item.Value.{k}" for k in ("index", "start", "stop")},
                **_fields("$")}  # fmt: skip
        item.update({"size.$": "$$.Map.Item.Value.size", "header.$": "$$.Map.Item.Value.header"})
        if max_shards > INLINE_MAP_LIMIT:
            self.map_state: sfn.Map | sfn.DistributedMap = sfn.DistributedMap(
                self,
                names.SHARDS_STATE,
                items_path="$.plan.shards",
                item_selector=item,
                map_execution_type=sfn.StateMachineType.STANDARD,
                result_path="$.results",
            )
        else:
            self.map_state = _UnlimitedMap(
                self, names.SHARDS_STATE, items_path="$.plan.shards", item_selector=item, result_path="$.results"
            )
        self.map_state.item_processor(shard)
        manifest = invoke(
            names.MANIFEST_STATE,
            sfn.TaskInput.from_object({"action": "manifest", "results.$": "$.results", **_fields("$")}),
            result_selector={
                "manifest_key.$": "$.Payload.manifest_key",
                "rows.$": "$.Payload.rows",
                "metrics.$": "$.Payload.metrics",
            },
            result_path="$.manifest",
        )
        for state in (plan, self.map_state, manifest):
            state.add_catch(fail, errors=["States.ALL"], result_path="$.error")
        manifest.next(sfn.Succeed(self, "Predicted"))

        stack = Stack.of(self)
        self.state_machine = task_state_machine(
            self,
            plan.next(self.map_state).next(manifest),
            function=function,
            log_suffix="predict",
            log_retention=log_retention,
            removal_policy=removal_policy,
            comment="Ebb: score a file or recommend items with a trained model, in shards (docs/AWS.md)",
        )
        distributed_policy = self.state_machine.node.try_find_child("DistributedMapPolicy")
        if distributed_policy is not None:  # as the training workflow's (stacks/workflow.py)
            machine = stack.get_logical_id(self.state_machine.node.default_child)
            name = '{"Fn::Select":[6,{"Fn::Split":[":",{"Ref":"' + machine + '"}]}]}'
            executions = (
                f"arn:{_nag(stack.partition, 'AWS::Partition')}:states:{_nag(stack.region, 'AWS::Region')}:"
                f"{_nag(stack.account, 'AWS::AccountId')}:execution:{name}"
            )
            for suffix in (":*", "/*:*"):
                Validations.of(distributed_policy).acknowledge(
                    Acknowledgment(
                        id=f"AwsSolutions-IAM5[Resource::{executions}{suffix}]",
                        reason="Distributed Map: the state machine describes and stops its own child executions, "
                        "whose ARNs exist only at run time.",
                    )
                )


def _fields(path: str) -> dict[str, str]:
    """The run's settings, passed on from the execution's input at ``path``."""
    return {f"{k}.$": f"{path}.{k}" for k in _RUN_FIELDS}
