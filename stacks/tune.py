"""Tune: the state machine `ebb tune --stack` runs (docs/AWS.md "Tuning on AWS").

    Ask -> Done? -- no --> Packs = Map over $.ask.packs: Pack (a nested execution of the
     ^                       training state machine, startExecution.sync:2) -> Tell -+
     +----------------------------------------------------------------------------------+
            -- yes --> Conclude -> Succeed
    Ask, Tell or Conclude fails -> TuneFailed; a pack's execution that fails is recorded
    (its Catch) and told to the search: its job is a failed trial.

Every step but the Map is the tune function (`ebb.tune.handler`, an `action` each). Ask
answers with a trial pack per fleet (at most `--fleets`, and what the account's unreserved
Lambda concurrency holds of fleets of P workers and a supervisor): each is one execution of
the training machine that starts with the job Ask gives it and then, in its NextJob state
(the tune function's `next`), tells the search each job's end and asks for the pack's next
job, until the search has none for it. Tell records the packs' ends; Conclude writes the
leaderboard and the best trial under tunes/<id>/, each trial's share of its packs added to
its report.

The machine has a role of its own: it may invoke the tune function, start executions of
the training state machine (and describe and stop them, and manage the EventBridge rule
Step Functions uses to hear a nested execution end: CDK's grant for `.sync`), nothing else.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, RemovalPolicy, Stack, Validations
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from ebb.ports import deployment as names
from stacks.workflow import _nag, lambda_task, task_state_machine

_TUNE_ID = {"tune_id.$": "$$.Execution.Name"}


class TuneWorkflow(Construct):
    """`state_machine` after construction."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        function: lambda_.IFunction,
        training: sfn.StateMachine,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        fail = sfn.Fail(self, "TuneFailed", error_path="$.error.Error", cause_path="$.error.Cause")

        def invoke(name: str, payload: dict, **kwargs) -> tasks.LambdaInvoke:
            task = lambda_task(self, name, function, sfn.TaskInput.from_object(payload), **kwargs)
            task.add_catch(fail, errors=["States.ALL"], result_path="$.error")
            return task

        ask = invoke(
            names.ASK_STATE,
            {"action": "ask", **_TUNE_ID, "search.$": "$.search"},
            result_selector={f"{k}.$": f"$.Payload.{k}" for k in ("done", "packs", "max_concurrency")},
            result_path="$.ask",
        )
        trial = tasks.StepFunctionsStartExecution(
            self,
            names.TRIAL_STATE,
            state_machine=training,
            integration_pattern=sfn.IntegrationPattern.RUN_JOB,
            input=sfn.TaskInput.from_json_path_at("$.input"),
            name=sfn.JsonPath.string_at("$.name"),
            result_path=sfn.JsonPath.DISCARD,
        )
        ended = {"pack.$": "$.pack"}
        trained = sfn.Pass(self, "PackEnded", parameters={**ended, "ok": True})
        # A pack whose execution failed is the search's to record (its job failed), not the tune's end.
        failed = sfn.Pass(self, "PackFailed", parameters={**ended, "ok": False, "error.$": "$.error"})
        trial.add_catch(failed, errors=["States.ALL"], result_path="$.error")
        trial.next(trained)
        self.map_state = sfn.Map(
            self,
            names.TRIALS_STATE,
            items_path="$.ask.packs",
            max_concurrency_path="$.ask.max_concurrency",
            result_path="$.results",
        )
        self.map_state.item_processor(trial)
        self.map_state.add_catch(fail, errors=["States.ALL"], result_path="$.error")
        tell = invoke(
            names.TELL_STATE,
            {"action": "tell", **_TUNE_ID, "results.$": "$.results"},
            result_path=sfn.JsonPath.DISCARD,
        )
        conclude = invoke(
            names.CONCLUDE_STATE,
            {"action": "conclude", **_TUNE_ID},
            result_selector={f"{k}.$": f"$.Payload.{k}" for k in ("tune_key", "best_trial", "best_val")},
            result_path="$.result",
        )
        conclude.next(sfn.Succeed(self, "Tuned"))
        done = (
            sfn.Choice(self, "Done?")
            .when(sfn.Condition.boolean_equals("$.ask.done", True), conclude)
            .otherwise(self.map_state)
        )
        self.map_state.next(tell)
        tell.next(ask)
        # The input is {"search": {...}}: the search and its base job as `ebb tune --stack` sent them.
        definition = ask.next(done)

        stack = Stack.of(self)
        self.state_machine = task_state_machine(
            self,
            definition,
            function=function,
            log_suffix="tune",
            log_retention=log_retention,
            removal_policy=removal_policy,
            comment="Ebb: search hyper-parameters in trial packs, each a nested execution of the training machine",
        )
        # CDK's grant for startExecution.sync: describe and stop the training machine's executions
        # (whose ARNs exist only at run time), spelt by cdk-nag with the machine's name.
        machine = stack.get_logical_id(training.node.default_child)
        name = '{"Fn::Select":[6,{"Fn::Split":[":",{"Ref":"' + machine + '"}]}]}'
        executions = (
            f"arn:{_nag(stack.partition, 'AWS::Partition')}:states:{_nag(stack.region, 'AWS::Region')}:"
            f"{_nag(stack.account, 'AWS::AccountId')}:execution:{name}*"
        )
        Validations.of(self.state_machine).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{executions}]",
                reason="startExecution.sync: the tune machine describes and stops the training machine's executions "
                "it started, whose ARNs exist only at run time.",
            )
        )
