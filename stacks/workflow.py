"""Workflow: the one Standard state machine that runs a job (docs/AWS.md "A job, end to end").

    Validate -> Prepare? -> Round = Parallel(Supervisor | Map over $.workers: Worker)
                              ^                               |
                              +--- status == "unfinished" ----+--> Finalize -> Succeed
                                   (steps >= pause_after_steps > 0: Paused, no Finalize)
    Paused or Finalize -> InPack? -- a trial pack's job --> NextJob (the tune function: the
        search's next job for this pack) -> Job? -- one --> NextInput -> Validate (the next job)
                                                -- none --> PackDone
                                                -- not yet --> WaitForJob -> NextJob
    any Catch -> <State>Failed (records failed_state) -> OnFailure -> Fail (OnFailure's own Catch: Fail)
    execution stopped or timed out -> (EventBridge rule) -> OnFailure

The Round reduces the Parallel's [supervisor branch, workers] output to the supervisor's
result plus job_id and spec_key: the supervisor branch ends in a Pass that builds that
flat state and the Parallel's OutputPath `$[0]` keeps it, with Validate's
`pause_after_steps` carried along. An unfinished round whose steps reach a non-zero
`pause_after_steps` ends the execution in Paused: its checkpoints stay, and an execution
with `resume: true` and the same `job_id` carries on from them (`ebb tune --stack`
promotes a trial so). So the Choice reads `$.status`
(never an array index: moto's Choice cannot) and `round` and `workers` feed the next
round. (A ResultSelector such as `$[0].job_id` would do the same on AWS, but moto wraps
any value read directly under an array index in a list.) The Map runs every worker of
the round at once (MaxConcurrency 0: they meet at a barrier); past INLINE_MAP_LIMIT
workers it runs in Distributed mode, each worker a child Standard execution (Express
children stop at 5 minutes, a round runs up to 15).

Supervisor and Worker have no Catch of their own (a Catch inside a branch cannot leave
it): their failure fails the Round, whose Catch records `failed_state: "Round"`; the
error's Cause names the function's error.

Execution logging: level ALL with execution data, to a log group under
`/aws/vendedlogs/states/` (logs delivered for a service need that prefix, or the
resource policy that lets them in grows with every log group). ALL, not ERROR, because a failed job
is debugged from the whole sequence of states (which round, which worker, what each
returned), and that costs little: a round is a few hundred events of a few hundred bytes,
cents per thousand rounds at $0.50/GB ingested. Execution data is safe to log because the
state holds only the job spec (it has no secret fields; the Redis token is read from
Secrets Manager inside the functions and never enters an event or a result), S3 keys,
counters and error messages.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Stack, Token, Validations
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from ebb.ports import deployment as names
from ebb.ports.deployment import INLINE_MAP_LIMIT, PACK_POLL_S

# Retried with backoff: Lambda's own failures and throttles, never a handler's error.
LAMBDA_SERVICE_ERRORS = [
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.TooManyRequestsException",
]
_JOB = {"job_id.$": "$.job_id", "spec_key.$": "$.spec_key", "packed.$": "$.packed"}
_SUPERVISOR_RESULT = ("status", "round", "workers", "steps", "stop_reason")
_PAUSE = {f"{names.PAUSE_FIELD}.$": f"$.{names.PAUSE_FIELD}", f"{names.PACK_FIELD}.$": f"$.{names.PACK_FIELD}"}


class Workflow(Construct):
    """The state machine; `state_machine` and `map_state` after construction."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: dict[str, lambda_.IFunction],
        max_workers: int,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        fail = sfn.Fail(self, "JobFailed", error_path="$.error.Error", cause_path="$.error.Cause")
        on_failure = self._invoke(
            names.ON_FAILURE, functions["onFailure"], sfn.TaskInput.from_json_path_at("$"), result_path="$.report"
        )
        # If OnFailure itself fails, the execution still fails with the original error (its own
        # error goes to $.on_failure_error, beside it in the history).
        on_failure.add_catch(fail, errors=["States.ALL"], result_path="$.on_failure_error")
        on_failure.next(fail)

        def failed(state_name: str, *, before_validate: bool = False) -> sfn.Pass:
            """What OnFailure gets when `state_name` fails; before Validate there is no job_id yet."""
            fields = {} if before_validate else dict(_JOB)
            return sfn.Pass(
                self, f"{state_name}Failed", parameters={**fields, "failed_state": state_name, "error.$": "$.error"}
            ).next(on_failure)

        validate = self._invoke(
            names.VALIDATE,
            functions["validate"],
            sfn.TaskInput.from_object({"spec.$": "$", "execution.$": "$$.Execution.Name"}),
            output_path="$.Payload",
        )
        validate.add_catch(failed(names.VALIDATE, before_validate=True), errors=["States.ALL"], result_path="$.error")

        prepare = self._invoke(
            names.PREPARE, functions["prepare"], sfn.TaskInput.from_object(dict(_JOB)), result_path=sfn.JsonPath.DISCARD
        )
        prepare.add_catch(failed(names.PREPARE), errors=["States.ALL"], result_path="$.error")

        supervisor = self._invoke(
            names.SUPERVISOR_STATE,
            functions["supervisor"],
            sfn.TaskInput.from_object({**_JOB, "round.$": "$.round"}),
            result_selector={key + ".$": f"$.Payload.{key}" for key in _SUPERVISOR_RESULT},
            result_path="$.supervisor",
        )
        worker = self._invoke(names.WORKER_STATE, functions["worker"], sfn.TaskInput.from_json_path_at("$"))
        worker_input = {**_JOB, "round.$": "$.round", "worker.$": "$$.Map.Item.Value"}
        if max_workers > INLINE_MAP_LIMIT:
            self.map_state = sfn.DistributedMap(
                self,
                names.WORKERS_STATE,
                items_path="$.workers",
                item_selector=worker_input,
                map_execution_type=sfn.StateMachineType.STANDARD,
                result_path=sfn.JsonPath.DISCARD,
            )
        else:
            self.map_state = _UnlimitedMap(
                self,
                names.WORKERS_STATE,
                items_path="$.workers",
                item_selector=worker_input,
                result_path=sfn.JsonPath.DISCARD,
            )
        self.map_state.item_processor(worker)

        # Branch 0 ends with the next state, flat: job_id, spec_key and the supervisor's result.
        next_state = sfn.Pass(
            self,
            "NextRound",
            parameters={**_JOB, **_PAUSE, **{key + ".$": f"$.supervisor.{key}" for key in _SUPERVISOR_RESULT}},
        )
        round_state = sfn.Parallel(self, names.ROUND, output_path="$[0]")
        round_state.branch(supervisor.next(next_state))
        round_state.branch(self.map_state)
        round_state.add_catch(failed(names.ROUND), errors=["States.ALL"], result_path="$.error")

        finalize = self._invoke(
            names.FINALIZE,
            functions["finalize"],
            sfn.TaskInput.from_object(dict(_JOB)),
            result_selector={
                "status.$": "$.Payload.status",
                "report_key.$": "$.Payload.report_key",
                "model_key.$": "$.Payload.model_key",
            },
            result_path="$.report",
        )
        finalize.add_catch(failed(names.FINALIZE), errors=["States.ALL"], result_path="$.error")
        in_pack = self._pack_loop(functions["tune"], validate, fail)
        finalize.next(in_pack)

        unfinished = sfn.Condition.string_equals("$.status", "unfinished")
        pause = f"$.{names.PAUSE_FIELD}"
        paused = sfn.Pass(
            self,
            names.PAUSED,
            parameters={
                **_JOB,
                **_PAUSE,
                "status": "paused",
                **{f"{k}.$": f"$.{k}" for k in ("round", "workers", "steps")},
            },
        ).next(in_pack)
        next_round = (
            sfn.Choice(self, "Unfinished?")
            .when(
                sfn.Condition.and_(
                    unfinished,
                    sfn.Condition.number_greater_than(pause, 0),
                    sfn.Condition.number_greater_than_equals_json_path("$.steps", pause),
                ),
                paused,
            )
            .when(unfinished, round_state)
            .otherwise(finalize)
        )
        round_state.next(next_round)
        needs_prepare = (
            sfn.Choice(self, "Prepare?")
            .when(sfn.Condition.boolean_equals("$.prepare", True), prepare.next(round_state))
            .otherwise(round_state)
        )

        stack = Stack.of(self)
        log_group = logs.LogGroup(
            self,
            "ExecutionLogs",
            log_group_name=execution_log_group_name(stack.stack_name),
            retention=log_retention,
            removal_policy=removal_policy,
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            definition_body=sfn.DefinitionBody.from_chainable(validate.next(needs_prepare)),
            state_machine_type=sfn.StateMachineType.STANDARD,
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
            comment="Ebb: train one job (docs/AWS.md)",
        )
        self.stopped_rule = self._on_stopped(functions["onFailure"])

        for function in functions.values():
            Validations.of(self.state_machine).acknowledge(
                Acknowledgment(
                    id=f"AwsSolutions-IAM5[Resource::<{stack.get_logical_id(function.node.default_child)}.Arn>:*]",
                    reason="CDK's invoke grant covers the function's versions and aliases (ARN:qualifier); "
                    "the functions are this stack's own.",
                )
            )
        distributed_policy = self.state_machine.node.try_find_child("DistributedMapPolicy")
        if distributed_policy is not None:
            # cdk-nag spells the execution ARNs out with this machine's logical id, and with the
            # partition, region and account as literals where the stack's environment names them.
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
        Validations.of(self.state_machine).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason="X-Ray's PutTraceSegments/PutTelemetryRecords and CloudWatch Logs' vended log delivery actions "
                "(CreateLogDelivery, PutResourcePolicy, ...) accept no resource scope.",
            )
        )

    def _pack_loop(self, tune: lambda_.IFunction, validate: sfn.IChainable, fail: sfn.Fail) -> sfn.Choice:
        """After a job's Paused or Finalize: a trial pack's job (``packed``) asks the search for
        the pack's next job (the tune function's ``next``: the ended job told, the next asked
        for this pack) and starts it at Validate, in this execution; no job (or not a pack's):
        the execution ends. A failed NextJob fails the execution (the Tune machine records
        the pack failed) without OnFailure: the job before it ended well."""
        next_job = self._invoke(
            names.NEXT_JOB_STATE,
            tune,
            sfn.TaskInput.from_object(
                {"action": "next", "tune_id.$": "$.pack.tune_id", "pack.$": "$.pack.pack", "job_id.$": "$.job_id"}
            ),
            result_selector={"done.$": "$.Payload.done", "wait.$": "$.Payload.wait", "input.$": "$.Payload.input"},
            result_path="$.next",
        )
        next_job.add_catch(fail, errors=["States.ALL"], result_path="$.error")
        start_next = sfn.Pass(self, "NextInput", output_path="$.next.input")
        # No job now, but another pack's may end in a promotion: wait (no function runs) and ask again.
        wait = sfn.Wait(self, names.PACK_WAIT_STATE, time=sfn.WaitTime.duration(Duration.seconds(PACK_POLL_S)))
        wait.next(next_job)
        next_job.next(
            sfn.Choice(self, "Job?")
            .when(sfn.Condition.boolean_equals("$.next.done", True), sfn.Succeed(self, names.PACK_DONE_STATE))
            .when(sfn.Condition.boolean_equals("$.next.wait", True), wait)
            .otherwise(start_next)
        )
        start_next.next(validate)
        return (
            sfn.Choice(self, names.IN_PACK_STATE)
            .when(sfn.Condition.boolean_equals("$.packed", True), next_job)
            .otherwise(sfn.Succeed(self, "Done"))
        )

    def _on_stopped(self, on_failure: lambda_.IFunction) -> events.Rule:
        """An execution stopped by hand (ABORTED) or past its timeout (TIMED_OUT) runs no Catch:
        this rule hands it to OnFailure, whose abort marker stops the invocations still running
        and whose report and event say so (docs/AWS.md, "Abort")."""
        rule = events.Rule(
            self,
            "ExecutionStopped",
            description="An Ebb execution that was stopped or timed out: OnFailure stops its job",
            event_pattern=events.EventPattern(
                source=["aws.states"],
                detail_type=["Step Functions Execution Status Change"],
                detail={"stateMachineArn": [self.state_machine.state_machine_arn], "status": ["ABORTED", "TIMED_OUT"]},
            ),
        )
        rule.add_target(
            targets.LambdaFunction(
                on_failure,
                retry_attempts=4,
                event=events.RuleTargetInput.from_object(
                    {
                        "job_id": events.EventField.from_path("$.detail.name"),
                        # A trial's execution names its job in its input (job_id): OnFailure reads it there.
                        "execution_input": events.EventField.from_path("$.detail.input"),
                        "failed_state": names.EXECUTION,
                        "error": {
                            "Error": events.EventField.from_path("$.detail.status"),
                            "Cause": "the execution ended before its job did (stopped by hand, or past its timeout)",
                        },
                    }
                ),
            )
        )
        return rule

    def _invoke(self, name: str, function: lambda_.IFunction, payload: sfn.TaskInput, **kwargs) -> tasks.LambdaInvoke:
        return lambda_task(self, name, function, payload, **kwargs)


def lambda_task(
    scope: Construct, name: str, function: lambda_.IFunction, payload: sfn.TaskInput, **kwargs
) -> tasks.LambdaInvoke:
    """A Lambda invocation state that retries Lambda's own service errors (throttling
    included) with jittered backoff, and nothing the function raises: the one retry policy
    of every state machine here."""
    task = tasks.LambdaInvoke(
        scope, name, lambda_function=function, payload=payload, retry_on_service_exceptions=False, **kwargs
    )
    task.add_retry(
        errors=LAMBDA_SERVICE_ERRORS,
        interval=Duration.seconds(2),
        max_attempts=6,
        backoff_rate=2,
        max_delay=Duration.seconds(60),
        jitter_strategy=sfn.JitterType.FULL,
    )
    return task


def task_state_machine(
    scope: Construct,
    definition: sfn.IChainable,
    *,
    function: lambda_.IFunction,
    log_suffix: str,
    log_retention: logs.RetentionDays,
    removal_policy: RemovalPolicy,
    comment: str,
) -> sfn.StateMachine:
    """A Standard state machine driving one Lambda ``function`` (Predict, Tune): traced, its
    executions logged to ``/aws/vendedlogs/states/<stack>-<log_suffix>``, and cdk-nag told
    why the role CDK writes for it has the two wildcard resources it must have."""
    stack = Stack.of(scope)
    log_group = logs.LogGroup(
        scope,
        "ExecutionLogs",
        log_group_name=f"/aws/vendedlogs/states/{stack.stack_name}-{log_suffix}",
        retention=log_retention,
        removal_policy=removal_policy,
    )
    machine = sfn.StateMachine(
        scope,
        "StateMachine",
        definition_body=sfn.DefinitionBody.from_chainable(definition),
        state_machine_type=sfn.StateMachineType.STANDARD,
        tracing_enabled=True,
        logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
        comment=comment,
    )
    Validations.of(machine).acknowledge(
        Acknowledgment(
            id=f"AwsSolutions-IAM5[Resource::<{stack.get_logical_id(function.node.default_child)}.Arn>:*]",
            reason=f"CDK's invoke grant covers the {log_suffix} function's versions and aliases (ARN:qualifier).",
        )
    )
    Validations.of(machine).acknowledge(
        Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason="X-Ray's PutTraceSegments/PutTelemetryRecords and CloudWatch Logs' vended log delivery actions "
            "accept no resource scope.",
        )
    )
    return machine


def execution_log_group_name(stack_name: str) -> str:
    """The state machine's execution log group (README "Logs")."""
    return f"/aws/vendedlogs/states/{stack_name}-executions"


def _nag(value: str, pseudo: str) -> str:
    """How cdk-nag prints a part of an ARN: the literal, or `<AWS::Region>` while it is a token."""
    return f"<{pseudo}>" if Token.is_unresolved(value) else value


class _UnlimitedMap(sfn.Map):
    """An inline Map that writes `"MaxConcurrency": 0` (no limit) out; CDK drops a zero."""

    def to_state_json(self, query_language: sfn.QueryLanguage | None = None) -> dict:
        return {**super().to_state_json(query_language), "MaxConcurrency": 0}
