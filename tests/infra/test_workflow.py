"""Workflow: the state machine of docs/AWS.md, read from the synthesised template."""

from __future__ import annotations

import json

from ebb.ports import deployment as names

LAMBDA_ERRORS = [
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.TooManyRequestsException",
]


def all_states(definition: dict) -> dict[str, dict]:
    """Every state, nested branches and item processors included."""
    out = {}
    for name, state in definition["States"].items():
        out[name] = state
        for branch in state.get("Branches", []):
            out.update(all_states(branch))
        if "ItemProcessor" in state:
            out.update(all_states(state["ItemProcessor"]))
    return out


def invoked_function(state: dict) -> str:
    return state["Parameters"]["FunctionName"]


def test_the_job_flows_validate_prepare_rounds_finalize(default):
    d = default.definition
    states = d["States"]
    assert d["StartAt"] == "Validate"
    assert states["Validate"]["Next"] == "Prepare?" and states["Validate"]["OutputPath"] == "$.Payload"
    assert states["Validate"]["Parameters"]["Payload"] == {"spec.$": "$", "execution.$": "$$.Execution.Name"}
    prepare_choice = states["Prepare?"]
    assert prepare_choice["Choices"] == [{"Variable": "$.prepare", "BooleanEquals": True, "Next": "Prepare"}]
    assert prepare_choice["Default"] == "Round" and states["Prepare"]["Next"] == "Round"
    assert states["Prepare"]["ResultPath"] is None  # the state stays as Validate left it

    round_state = states["Round"]
    assert round_state["Type"] == "Parallel" and round_state["OutputPath"] == "$[0]"
    supervisor_branch, workers_branch = round_state["Branches"]
    supervisor = supervisor_branch["States"]["Supervisor"]
    assert supervisor["Parameters"]["Payload"] == {
        "job_id.$": "$.job_id",
        "spec_key.$": "$.spec_key",
        "packed.$": "$.packed",  # a trial pack's job: metered as the pack's
        "round.$": "$.round",
    }
    assert supervisor["Next"] == "NextRound"
    assert supervisor_branch["States"]["NextRound"]["Parameters"] == {
        "job_id.$": "$.job_id",
        "spec_key.$": "$.spec_key",
        "packed.$": "$.packed",
        "pack.$": "$.pack",  # Validate's, carried to the pack's NextJob
        "status.$": "$.supervisor.status",
        "round.$": "$.supervisor.round",
        "workers.$": "$.supervisor.workers",
        "steps.$": "$.supervisor.steps",
        "stop_reason.$": "$.supervisor.stop_reason",
        "pause_after_steps.$": "$.pause_after_steps",  # Validate's, carried to the Choice
    }
    workers = workers_branch["States"]["Workers"]
    assert workers["Type"] == "Map" and workers["ItemsPath"] == "$.workers"
    assert workers["MaxConcurrency"] == 0 and workers["ItemProcessor"]["ProcessorConfig"] == {"Mode": "INLINE"}
    assert workers["ItemSelector"] == {
        "job_id.$": "$.job_id",
        "spec_key.$": "$.spec_key",
        "packed.$": "$.packed",
        "round.$": "$.round",
        "worker.$": "$$.Map.Item.Value",
    }
    assert workers["ResultPath"] is None

    loop = states[round_state["Next"]]
    assert loop["Type"] == "Choice" and loop["Default"] == "Finalize"
    unfinished = {"Variable": "$.status", "StringEquals": "unfinished"}
    assert loop["Choices"] == [
        {  # paused: an unfinished round that reached a non-zero pause_after_steps ends the execution
            "And": [
                unfinished,
                {"Variable": "$.pause_after_steps", "NumericGreaterThan": 0},
                {"Variable": "$.steps", "NumericGreaterThanEqualsPath": "$.pause_after_steps"},
            ],
            "Next": "Paused",
        },
        {**unfinished, "Next": "Round"},
    ]
    assert states["Paused"]["Type"] == "Pass" and states["Paused"]["Next"] == "InPack?"
    assert states["Paused"]["Parameters"]["status"] == "paused"
    assert states["Finalize"]["Next"] == "InPack?"
    # A job of a trial pack asks the search for the pack's next job and starts it at Validate;
    # any other job (or a pack with none next) ends the execution.
    in_pack = states["InPack?"]
    assert in_pack["Choices"] == [{"Variable": "$.packed", "BooleanEquals": True, "Next": "NextJob"}]
    assert in_pack["Default"] == "Done" and states["Done"]["Type"] == "Succeed"
    next_job = states["NextJob"]
    assert next_job["Parameters"]["Payload"] == {
        "action": "next", "tune_id.$": "$.pack.tune_id", "pack.$": "$.pack.pack", "job_id.$": "$.job_id"
    }  # fmt: skip
    assert invoked_function(next_job) == f"<{default.function_id('tune')}.Arn>" and next_job["ResultPath"] == "$.next"
    assert next_job["Catch"][0]["Next"] == "JobFailed"  # no OnFailure: the job before it ended well
    job = states[next_job["Next"]]
    assert job["Choices"] == [
        {"Variable": "$.next.done", "BooleanEquals": True, "Next": "PackDone"},
        {"Variable": "$.next.wait", "BooleanEquals": True, "Next": "WaitForJob"},  # another pack's may promote
    ]
    assert states["PackDone"]["Type"] == "Succeed"
    assert states["WaitForJob"] == {"Type": "Wait", "Seconds": names.PACK_POLL_S, "Next": "NextJob"}
    assert states[job["Default"]] == {"Type": "Pass", "OutputPath": "$.next.input", "Next": "Validate"}


def test_each_task_invokes_its_function(default):
    states = all_states(default.definition)
    for state_name, function in (
        ("Validate", "validate"),
        ("Prepare", "prepare"),
        ("Supervisor", "supervisor"),
        ("Worker", "worker"),
        ("Finalize", "finalize"),
        ("OnFailure", "on_failure"),
        ("NextJob", "tune"),
    ):
        assert invoked_function(states[state_name]) == f"<{default.function_id(function)}.Arn>", state_name


def test_no_choice_reads_an_array_index(default, scaled):
    for synth in (default, scaled):
        for state in all_states(synth.definition).values():
            rules = list(state.get("Choices", []))
            while rules:
                rule = rules.pop()
                if "And" in rule or "Or" in rule:
                    rules += rule.get("And", []) + rule.get("Or", [])
                    continue
                assert "[" not in rule["Variable"], rule


def test_every_task_retries_lambda_service_errors_only(default):
    tasks = {n: s for n, s in all_states(default.definition).items() if s["Type"] == "Task"}
    assert set(tasks) == {"Validate", "Prepare", "Supervisor", "Worker", "Finalize", "OnFailure", "NextJob"}
    for name, task in tasks.items():
        assert task["Resource"].endswith(":states:::lambda:invoke"), name
        (retry,) = task["Retry"]
        assert retry["ErrorEquals"] == LAMBDA_ERRORS, name
        assert retry["BackoffRate"] == 2 and retry["IntervalSeconds"] == 2 and retry["MaxAttempts"] == 6
        assert retry["MaxDelaySeconds"] == 60 and retry["JitterStrategy"] == "FULL"


def test_every_failure_records_its_state_then_runs_on_failure_then_fails(default):
    states = default.definition["States"]
    for name in ("Validate", "Prepare", "Round", "Finalize"):
        (catch,) = states[name]["Catch"]
        assert catch["ErrorEquals"] == ["States.ALL"] and catch["ResultPath"] == "$.error"
        recorder = states[catch["Next"]]
        assert recorder["Type"] == "Pass" and recorder["Next"] == "OnFailure"
        expected = {"failed_state": name, "error.$": "$.error"}
        if name != "Validate":  # before Validate there is no job yet
            expected.update({"job_id.$": "$.job_id", "spec_key.$": "$.spec_key", "packed.$": "$.packed"})
        assert recorder["Parameters"] == expected
    on_failure = states["OnFailure"]
    assert on_failure["Parameters"]["Payload.$"] == "$" and on_failure["ResultPath"] == "$.report"
    fail = states[on_failure["Next"]]
    assert fail == {"Type": "Fail", "ErrorPath": "$.error.Error", "CausePath": "$.error.Cause"}
    # OnFailure failing does not hide the original error: its own goes beside it, then the same Fail.
    assert on_failure["Catch"] == [
        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.on_failure_error", "Next": on_failure["Next"]}
    ]
    # The tasks inside the round have no Catch of their own: the Round's catches them.
    branches = states["Round"]["Branches"]
    assert "Catch" not in branches[0]["States"]["Supervisor"]
    assert "Catch" not in branches[1]["States"]["Workers"]["ItemProcessor"]["States"]["Worker"]


def test_more_than_forty_workers_run_as_a_distributed_map(scaled):
    workers = scaled.definition["States"]["Round"]["Branches"][1]["States"]["Workers"]
    assert workers["ItemProcessor"]["ProcessorConfig"] == {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"}
    assert workers.get("MaxConcurrency", 0) == 0  # unset: Step Functions' full concurrency
    assert workers["ItemsPath"] == "$.workers"
    sm_id, _ = scaled.machine()
    role = scaled.resources[sm_id]["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    actions = {
        a
        for p in scaled.of_type("AWS::IAM::Policy").values()
        if {"Ref": role} in p["Roles"]
        for s in p["PolicyDocument"]["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert {"states:StartExecution", "states:DescribeExecution", "states:StopExecution"} <= actions


def test_executions_are_logged_and_traced(default):
    _, props = default.machine()
    assert props["StateMachineType"] == "STANDARD"
    assert props["TracingConfiguration"] == {"Enabled": True}
    logging = props["LoggingConfiguration"]
    assert logging["Level"] == "ALL" and logging["IncludeExecutionData"] is True
    group = logging["Destinations"][0]["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
    assert default.of_type("AWS::Logs::LogGroup")[group]["RetentionInDays"] == 30
    # Logs a service delivers go under /aws/vendedlogs/, or the delivery's resource policy grows per group.
    assert default.of_type("AWS::Logs::LogGroup")[group]["LogGroupName"] == "/aws/vendedlogs/states/Ebb-executions"


def test_an_execution_stopped_or_timed_out_goes_to_on_failure(default):
    (rule,) = default.of_type("AWS::Events::Rule").values()
    machine, _ = default.machine()
    assert rule["EventPattern"] == {
        "source": ["aws.states"],
        "detail-type": ["Step Functions Execution Status Change"],
        "detail": {"stateMachineArn": [{"Ref": machine}], "status": ["ABORTED", "TIMED_OUT"]},
    }
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [default.function_id("on_failure"), "Arn"]}
    payload = target["InputTransformer"]
    assert payload["InputPathsMap"] == {
        "detail-name": "$.detail.name",
        "detail-status": "$.detail.status",
        "detail-input": "$.detail.input",  # a trial's execution names its job there
    }
    template = payload["InputTemplate"]
    for field, value in (("name", "x"), ("status", "y"), ("input", '{"job_id": "j"}')):
        template = template.replace(f"<detail-{field}>", json.dumps(value))
    event = json.loads(template)
    assert event["failed_state"] == "Execution" and event["execution_input"] == '{"job_id": "j"}'
    (permission,) = default.of_type("AWS::Lambda::Permission").values()
    assert permission["Principal"] == "events.amazonaws.com" and permission["FunctionName"] == target["Arn"]
