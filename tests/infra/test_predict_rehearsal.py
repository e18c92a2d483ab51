"""The Predict state machine in the rehearsal (tests/helpers/moto_stack.py): the stack created in
moto with IAM enforced, the real predict handler under its own role, 4 shards; the joined
output is byte for byte the local run's, and so are the metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ebb.cli import main
from ebb.ports import deployment as names
from ebb.predict.run import predict_file, recommend_users
from tests.infra.test_rehearsal import _entered, _wait, rehearsal_template, stood_up

SHARDS = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small PMF run, and a test file of rows it can score (one of a user it never saw)."""
    tmp = tmp_path_factory.mktemp("predict")
    rng = np.random.default_rng(5)
    U, V = rng.normal(0, 1, (80, 2)), rng.normal(0, 1, (60, 2))
    rows = [(u + 1, i + 1, round(3 + U[u] @ V[i] + rng.normal(0, 0.3), 3), 0)
            for u in range(80) for i in rng.choice(60, 25, replace=False)]  # fmt: skip
    (tmp / "train.tsv").write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))
    test = [f"{u}\t{i}\t{r}\t0\n" for u, i, r, _ in rows[::7]] + ["999\t3\t4.0\t0\n"]
    (tmp / "test.tsv").write_text("".join(test))
    assert main(["prepare", "--format", "movielens", "--input", str(tmp / "train.tsv"), "--out", str(tmp / "d")]) == 0
    assert main(["train", "--model", "pmf", "--data", str(tmp / "d"), "--out", str(tmp / "run"), "--workers", "1",
                 "--set", "hyper.rank=2", "--set", "stop.max_epochs=5"]) == 0  # fmt: skip
    return tmp


@pytest.fixture(scope="module")
def aws(default, tmp_path_factory):
    with stood_up(rehearsal_template(default), tmp_path_factory.mktemp("cache"), None) as aws:
        yield aws


def _request(aws, run: str, **fields) -> dict:
    base = {"run": run, "model": f"s3://{aws.bucket}/models/pmf", "input": None, "shards": SHARDS,
            "with_labels": False, "skip_bad_rows": False, "recommend": None, "users": "all",
            "exclude_seen": True}  # fmt: skip
    return {**base, **fields}


def _joined(aws, manifest: dict) -> bytes:
    return b"".join(aws.s3.get_object(Bucket=aws.bucket, Key=s["key"])["Body"].read() for s in manifest["shards"])


def test_predict_runs_in_four_shards_and_writes_what_a_local_run_writes(aws, trained):
    for key in ("model.json", "model.npz", "id_map.npz", "seen.npz"):
        aws.s3.put_object(Bucket=aws.bucket, Key=f"models/pmf/{key}", Body=(trained / "run" / key).read_bytes())
    aws.s3.put_object(Bucket=aws.bucket, Key="raw/test.tsv", Body=(trained / "test.tsv").read_bytes())
    machine = aws.stack.output(names.PREDICT_STATE_MACHINE_OUTPUT)
    runs = {
        "score": _request(aws, "p-score", input=f"s3://{aws.bucket}/raw/test.tsv"),
        "recommend": _request(aws, "p-rec", recommend=5),
    }
    arns = {k: aws.sfn.start_execution(stateMachineArn=machine, name=r["run"], input=json.dumps(r))["executionArn"]
            for k, r in runs.items()}  # fmt: skip
    done = {k: _wait(aws, arn) for k, arn in arns.items()}
    manifests = {}
    for k, run in done.items():
        assert run["status"] == "SUCCEEDED", (k, run.get("cause"))
        assert _entered(run["history"])[:2] == [names.PLAN_STATE, names.SHARDS_STATE]
        key = json.loads(run["output"])["manifest"]["manifest_key"]
        assert key == f"predictions/{runs[k]['run']}/manifest.json"
        manifests[k] = json.loads(aws.s3.get_object(Bucket=aws.bucket, Key=key)["Body"].read())
        assert len(manifests[k]["shards"]) == SHARDS
        shards = [c for c in aws.runtime.of("predict") if c.event.get("run") == runs[k]["run"]]
        assert sorted(c.event["index"] for c in shards if c.event["action"] == "shard") == list(range(SHARDS))

    local = predict_file(str(trained / "run"), trained / "test.tsv", trained / "local.csv")
    assert _joined(aws, manifests["score"]) == (trained / "local.csv").read_bytes()
    assert manifests["score"]["metrics"] == local["metrics"] and manifests["score"]["rows"] == local["rows"]
    assert manifests["score"]["unknown"]["users"] == 1
    cost = manifests["score"]["cost"]
    assert cost["total_usd"] > 0 and cost["usd_per_million_rows"] == pytest.approx(
        cost["total_usd"] / local["rows"] * 1e6
    )

    recommend_users(str(trained / "run"), None, 5, trained / "local-top.csv")
    assert _joined(aws, manifests["recommend"]) == (trained / "local-top.csv").read_bytes()
    # Every call was one its role allows: the predict function's and the Predict machine's.
    assert aws.stack.denied == []


def test_ebb_predict_stack_uploads_a_local_model_and_input_and_joins_the_shards(aws, trained, monkeypatch, capsys):
    for key, value in aws.stack.user_env({}).items():
        monkeypatch.setenv(key, value)
    out = trained / "via-stack.csv"
    argv = ["predict", "--stack", "Ebb", "--model", str(trained / "run"), "--input", str(trained / "test.tsv"),
            "--out", str(out), "--shards", "3"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    local = predict_file(str(trained / "run"), trained / "test.tsv", trained / "local2.csv")
    assert out.read_bytes() == (trained / "local2.csv").read_bytes()
    assert "in 3 shards" in printed and "per million rows" in printed and json.dumps(local["metrics"]) in printed
    assert aws.stack.denied == []
