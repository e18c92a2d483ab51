"""The Tune state machine and its function as synthesised: Ask -> Map of nested training
executions (a trial pack each) -> Tell, looping, then Conclude; the grants (the machine starts
the training machine and invokes the tune function, nothing else; the function writes tunes/
and trials' reports only; the training machine may invoke it for NextJob), the dashboard's
Tuning row and the stack output (docs/AWS.md, "Tuning on AWS")."""

from __future__ import annotations

from ebb.ports import deployment as names
from tests.infra.test_predict_stack import _actions, _statements


def test_ask_then_a_map_of_nested_training_executions_then_tell_looping_until_conclude(default):
    d = default.tune_definition
    states = d["States"]
    assert d["StartAt"] == names.ASK_STATE and states[names.ASK_STATE]["Next"] == "Done?"
    done = states["Done?"]
    assert done["Choices"] == [{"Variable": "$.ask.done", "BooleanEquals": True, "Next": names.CONCLUDE_STATE}]
    assert done["Default"] == names.TRIALS_STATE
    trials = states[names.TRIALS_STATE]
    assert trials["Type"] == "Map" and trials["ItemsPath"] == "$.ask.packs"
    assert trials["MaxConcurrencyPath"] == "$.ask.max_concurrency"  # what the account's concurrency allows
    assert trials["Next"] == names.TELL_STATE and states[names.TELL_STATE]["Next"] == names.ASK_STATE
    trial = trials["ItemProcessor"]["States"][names.TRIAL_STATE]
    assert trial["Resource"].endswith(":states:::states:startExecution.sync:2")
    training, _ = default.machine()
    assert trial["Parameters"] == {
        "StateMachineArn": f"<Ref:{training}>",
        "Input.$": "$.input",
        "Name.$": "$.name",
    }
    # A failed pack is the search's to record: its Catch ends the iteration, not the tune.
    assert trial["Catch"][0]["Next"] == "PackFailed"
    assert trials["ItemProcessor"]["States"]["PackFailed"]["Parameters"] == {
        "pack.$": "$.pack", "ok": False, "error.$": "$.error"
    }  # fmt: skip
    for state in (names.ASK_STATE, names.TELL_STATE, names.CONCLUDE_STATE, names.TRIALS_STATE):
        assert states[state]["Catch"][0]["Next"] == "TuneFailed"
    for state, action in ((names.ASK_STATE, "ask"), (names.TELL_STATE, "tell"), (names.CONCLUDE_STATE, "conclude")):
        assert states[state]["Parameters"]["Payload"]["action"] == action
        assert states[state]["Parameters"]["Payload"]["tune_id.$"] == "$$.Execution.Name"
    assert states[names.CONCLUDE_STATE]["Next"] == "Tuned"


def test_the_machine_starts_the_training_machine_and_invokes_the_tune_function_only(default):
    machine, props = default.machine("Tune")
    role = props["RoleArn"]["Fn::GetAtt"][0]
    statements = _statements(default, role)
    training, _ = default.machine()
    tune = default.function_id("tune")
    by_action = {a: s["Resource"] for s in statements for a in _actions(s)}
    assert not [a for a in by_action if a == "*" or a.endswith(":*")]
    assert by_action["states:StartExecution"] == {"Ref": training}
    for action in ("states:DescribeExecution", "states:StopExecution"):
        assert f'"Ref": "{training}"' in str(by_action[action]).replace("'", '"')
    assert "StepFunctionsGetEventsForStepFunctionsExecutionRule" in str(by_action["events:PutRule"])
    assert all(tune in str(r) for r in by_action["lambda:InvokeFunction"])
    assert not [a for a in by_action if a.startswith(("s3:", "sqs:", "sns:"))]  # no data: the function's
    assert props["RoleArn"] not in (default.machine()[1]["RoleArn"], default.machine("Predict")[1]["RoleArn"])

    function_role = default.functions["tune"]["Role"]["Fn::GetAtt"][0]
    function_statements = _statements(default, function_role)
    writes = [s for s in function_statements if any(a.startswith("s3:PutObject") for a in _actions(s))]
    resources = str([s["Resource"] for s in writes])
    assert writes and f"/{names.TUNES}*" in resources and f"/{names.JOBS}*/report.json" in resources
    assert not [s for s in function_statements if "s3:DeleteObject*" in _actions(s)]
    assert not [a for s in function_statements for a in _actions(s) if a == "*" or a.endswith(":*")]
    # The training machine invokes the tune function for a pack's NextJob: no other grant comes with it.
    _, training_props = default.machine()
    training_statements = _statements(default, training_props["RoleArn"]["Fn::GetAtt"][0])
    on_tune = [s for s in training_statements if tune in str(s["Resource"])]
    assert on_tune and {a for s in on_tune for a in _actions(s)} == {"lambda:InvokeFunction"}
    assert default.template["Outputs"][names.TUNE_STATE_MACHINE_OUTPUT]["Value"] == {"Ref": machine}
    assert default.functions["tune"]["ImageConfig"]["Command"] == ["ebb.tune.handler.handler"]


def test_the_dashboard_has_a_tuning_row(default):
    widgets = [w["properties"] for w in default.dashboard["widgets"]]
    assert {"Trials", "Best validation (per search)", "Tune runs"} <= {w.get("title") for w in widgets}
    body = str(widgets)
    for metric in names.TUNE_METRICS:
        assert metric in body
    assert names.TUNE_DIMENSION in body
