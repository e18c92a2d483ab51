"""The Predict state machine and its function as synthesised: the states, the Map's mode, the
grants (the machine invokes the predict function only; the function writes predictions/ only),
the dashboard's row and the stack output (docs/AWS.md, "Predicting")."""

from __future__ import annotations

from ebb.ports import deployment as names


def _statements(synth, role: str) -> list[dict]:
    return [
        s
        for p in synth.of_type("AWS::IAM::Policy").values()
        if {"Ref": role} in p["Roles"]
        for s in p["PolicyDocument"]["Statement"]
    ]


def _actions(statement: dict) -> list[str]:
    return [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]


def test_plan_then_a_map_of_shards_then_the_manifest(default):
    d = default.predict_definition
    assert d["StartAt"] == names.PLAN_STATE
    assert d["States"][names.PLAN_STATE]["Next"] == names.SHARDS_STATE
    shards = d["States"][names.SHARDS_STATE]
    assert shards["Type"] == "Map" and shards["ItemsPath"] == "$.plan.shards" and shards["MaxConcurrency"] == 0
    assert shards["ItemProcessor"]["ProcessorConfig"] == {"Mode": "INLINE"}
    assert shards["Next"] == names.MANIFEST_STATE and shards["ItemSelector"]["action"] == "shard"
    assert d["States"][names.MANIFEST_STATE]["Parameters"]["Payload"]["action"] == "manifest"
    for state in (names.PLAN_STATE, names.SHARDS_STATE, names.MANIFEST_STATE):
        assert d["States"][state]["Catch"][0]["Next"] == "PredictFailed"


def test_more_than_forty_shards_run_as_a_distributed_map(scaled):
    shards = scaled.predict_definition["States"][names.SHARDS_STATE]
    assert shards["ItemProcessor"]["ProcessorConfig"] == {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"}


def test_the_machine_invokes_the_predict_function_only_and_the_function_writes_predictions_only(default):
    machine, props = default.machine("Predict")
    role = props["RoleArn"]["Fn::GetAtt"][0]
    invoked = [s["Resource"] for s in _statements(default, role) if "lambda:InvokeFunction" in _actions(s)]
    predict = default.function_id("predict")
    assert invoked and all(predict in str(r) for r in invoked)
    assert default.machine()[1]["RoleArn"] != props["RoleArn"]  # a role of its own
    function_role = default.functions["predict"]["Role"]["Fn::GetAtt"][0]
    writes = [s for s in _statements(default, function_role) if any(a.startswith("s3:PutObject") for a in _actions(s))]
    assert writes and all(f"/{names.PREDICTIONS}*" in str(s["Resource"]) for s in writes)
    assert not [s for s in _statements(default, function_role) if "s3:DeleteObject*" in _actions(s)]
    assert default.template["Outputs"][names.PREDICT_STATE_MACHINE_OUTPUT]["Value"] == {"Ref": machine}


def test_the_dashboard_shows_rows_scored_and_errors(default):
    titles = [w["properties"].get("title") for w in default.dashboard["widgets"]]
    assert {"Rows scored (per minute)", "Predict errors", "Predict runs"} <= set(titles)
