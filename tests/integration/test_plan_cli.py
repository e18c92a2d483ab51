"""`ebb plan` end to end on a tiny dataset: profiles in worker processes over a private
redis-server on the fleet clock, the table or JSON, the plot; `ebb train --workers plan`
runs the recommendation (issue 27)."""

from __future__ import annotations

import json

import pytest

from ebb.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    raw, data = root / "r.csv", root / "ds"
    assert main(["synth", "ratings", "--out", str(raw), "--users", "300", "--items", "200", "--ratings", "16000"]) == 0
    assert (
        main(["prepare", "--format", "movielens", "--input", str(raw), "--out", str(data), "--batch-size", "800"]) == 0
    )
    return root, str(data)


def test_ebb_plan_prints_the_table_front_and_recommendation_and_json(tiny, capsys):
    root, data = tiny
    png = root / "plan.png"
    argv = ["plan", "--model", "pmf", "--data", data, "--epochs", "2", "--workers", "1,2,4,8"]
    argv += ["--profile-workers", "1,2", "--profile-steps", "8", "--plot", str(png), "--json"]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    rows = plan["rows"]
    assert [r["workers"] for r in rows] == [1, 2, 4, 8]
    parts = 16  # 12,800 training rows in minibatches of 800
    assert [r["steps"] for r in rows] == [2 * parts // p for p in (1, 2, 4, 8)]  # the engine's epoch rule
    for r in rows:
        assert r["seconds"] > 0 and r["usd"] == pytest.approx(sum(r["usd_by_component"].values()))
        assert r["usd_by_component"]["lambda_workers"] > 0
    # More workers for the same epochs: each pays its own billed time, so $ grows with P here.
    assert rows[-1]["usd"] > rows[0]["usd"]
    assert plan["pareto_front"] and plan["recommended"] in rows and plan["objective"] == "perf_per_dollar"
    assert [p["workers"] for p in plan["profiles"]] == [1, 2] and png.stat().st_size > 0
    # A time limit nothing meets: no recommendation, exit 1, the reason in one line.
    assert main([*argv[:-1], "--max-seconds", "0.001"]) == 1
    assert "no configuration fits 0.001 s" in capsys.readouterr().out


def test_ebb_train_runs_the_plans_fleet(tiny, capsys):
    root, data = tiny
    out = root / "run"
    argv = ["train", "--model", "pmf", "--data", data, "--workers", "plan", "--max-epochs", "2"]
    argv += ["--out", str(out), "--clock", "fleet", "--policy", "none"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    planned = int(err.split("plan: ")[1].split(" workers")[0])
    report = json.loads((out / "report.json").read_text())
    assert report["workers"]["initial"] == planned and report["status"] == "max_epochs"
