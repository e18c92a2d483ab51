"""A grant removed from the template fails the rehearsal where AWS would fail the job: with
AccessDenied on the key the runtime writes, recorded against the role that lacks it. Run after
tests/infra/test_rehearsal.py (one moto in a process: its stack is gone by then)."""

from __future__ import annotations

import copy
import json

import pytest

from ebb.ports import deployment as names
from tests.infra.test_rehearsal import JOB, _all_return, _run, rehearsal_template, stood_up


def without_grant(template: dict, function: str, key_pattern: str) -> dict:
    """`template` with `function`'s PutObject grant on `key_pattern` (ebb.ports.deployment.PUT) removed."""
    template = copy.deepcopy(template)
    resources = template["Resources"]
    handler = f"ebb.aws.handlers.{function}.handler"
    (role,) = [
        props["Role"]["Fn::GetAtt"][0]
        for props in (r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::Function")
        if handler in (props.get("Handler"), props.get("ImageConfig", {}).get("Command", [None])[0])
    ]
    removed = 0
    for resource in resources.values():
        if resource["Type"] != "AWS::IAM::Policy" or {"Ref": role} not in resource["Properties"]["Roles"]:
            continue
        statements = resource["Properties"]["PolicyDocument"]["Statement"]
        for statement in list(statements):
            if "s3:PutObject" not in statement["Action"]:
                continue
            listed = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            kept = [
                r
                for r in listed
                if not (isinstance(r, dict) and "Fn::Join" in r and r["Fn::Join"][1][-1] == f"/{key_pattern}")
            ]
            removed += len(listed) - len(kept)
            if kept:
                statement["Resource"] = kept
            else:
                statements.remove(statement)
    assert removed == 1, f"{function} has no PutObject grant on {key_pattern}"
    return template


@pytest.mark.parametrize(
    ("function", "pattern", "spec", "denied_key"),
    [
        # The supervisor's progress for `ebb watch`: its first write fails the round.
        ("supervisor", f"{names.JOBS}*/{names.PROGRESS_KEY}", {"workers": 1}, "jobs/rehearse-grant-1/progress.json"),
        # Finalize's outputs, under a job's `out`: the first (the model artifact's id map) fails, and so the job.
        ("finalize", f"{names.JOBS}*", {"workers": 1, "out": "jobs/elsewhere/x"}, "jobs/elsewhere/x/id_map.npz"),
    ],
)
def test_removing_a_grant_the_runtime_needs_fails_the_rehearsal(
    default, small_ratings, tmp_path, monkeypatch, function, pattern, spec, denied_key
):
    path = tmp_path / "template.json"
    path.write_text(json.dumps(without_grant(rehearsal_template(default), function, pattern)))
    monkeypatch.setenv("EBB_REHEARSAL_TEMPLATE", str(path))  # as a user would rehearse their own template
    with stood_up(rehearsal_template(default), tmp_path, small_ratings[0]) as aws:
        job = "rehearse-grant-1"
        run = _run(
            aws,
            job,
            {
                **JOB,
                **spec,
                "data": "datasets/ml",
                "round_steps": None,
                "stop": {"max_epochs": 1},
                "faults": {"worker_timeout_s": 2},
            },
        )
        assert run["status"] == "FAILED", run
        assert "PutObject failed: access denied" in run["cause"], run["cause"]
        bucket_arn = f"arn:aws:s3:::{aws.bucket}"
        refused = [
            (action, resource)
            for principal, action, resource in aws.stack.denied
            if f"{function.capitalize()}ServiceRole" in principal
        ]
        assert ("s3:PutObject", f"{bucket_arn}/{denied_key}") in refused, aws.stack.denied
        _all_return(aws, job)
