"""ebb tune for real on a tiny ratings set: trials as jobs (worker processes over one shared
redis-server), the planted best promoted, a promoted trial bit-identical to one run
straight through, the $ budget, and kill -9 then --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from ebb.local.runner import run_local
from ebb.spec import JobSpec
from tests.helpers.data import planted_ratings


@pytest.fixture(scope="module")
def tiny_ratings(tmp_path_factory):
    """Planted ratings with a validation split: 10 train parts, so an epoch is 10 steps."""
    root = tmp_path_factory.mktemp("tune-ratings")
    return planted_ratings(root, users=300, items=200, ratings=12_500, rank=5, noise=0.3, seed=7, batch_size=1000)[0]


def _ebb(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ebb.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def _job(data: str, out: Path, *extra: str) -> list[str]:
    # lr spans slow (1e-4) to good (0.05): after 1 to 4 epochs the high end is clearly best.
    return [
        "tune", "--model", "pmf", "--data", data, "--out", str(out), "--workers", "2", "--sync", "bsp",
        "--rank", "5", "--set", "scaling.policy=none",
        "--param", "hyper.lr=log_uniform:0.0001,0.05", "--sampler", "qmc",
        "--trials", "4", "--eta", "2", "--min-epochs", "1", "--max-epochs", "4", "--parallel", "4", *extra,
    ]  # fmt: skip


def test_tune_promotes_the_best_and_a_promoted_trial_matches_one_run_straight_through(tiny_ratings, tmp_path):
    out = tmp_path / "search"
    proc = _ebb(*_job(tiny_ratings, out))
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    result = json.loads((out / "tune.json").read_text())
    rows = {r["trial"]: r for r in result["trials"]}
    assert len(rows) == 4 and "best: trial" in stdout and "val rmse" in stdout
    best = result["best"]
    # The planted best (the highest learning rates) wins, and was promoted to the last rung.
    assert best["params"]["hyper.lr"] == max(r["params"]["hyper.lr"] for r in rows.values())
    assert rows[best["trial"]]["rung"] == 2 and rows[best["trial"]]["status"] == "max_epochs"
    rung0 = {t: r["scores"]["0"] for t, r in rows.items()}
    assert all(len(r["curve"]) == r["epochs"] for r in rows.values())  # a scoring an epoch
    assert min(rung0, key=rung0.get) == best["trial"]
    # Trials are ordinary jobs; the ones stopped between rungs have reports too (alone: a
    # pack writes no model or plot a pruned trial does not need; its checkpoints hold it).
    for r in rows.values():
        report = json.loads((Path(r["folder"]) / "report.json").read_text())
        assert report["status"] in ("max_epochs", "pruned", "early_stopped")
        assert report["test_metrics"]["rmse"] > 0
        pruned = report["status"] == "pruned"
        assert (Path(r["folder"]) / "model.npz").exists() != pruned and (report["model"] is None) == pruned
    assert {r["status"] for r in rows.values()} >= {"pruned", "max_epochs"}
    assert (
        (out / "best" / "report.json").exists()
        and (out / "best" / "model.npz").exists()
        and (out / "tune.png").exists()
    )
    assert result["total_usd"] > 0 and result["wall_seconds"] > 0
    launches = [x for x in result["launches"] if x["trial"] == best["trial"]]
    assert [(x["from_epochs"], x["to_epochs"]) for x in launches] == [(0.0, 1), (1, 2), (2, 4)]

    # The promoted trial paused twice and resumed in fresh processes: the same model, bit for
    # bit, as its job run straight through to the same epochs.
    spec = JobSpec.model_validate_json((Path(best["folder"]) / "trial.json").read_text())
    straight = spec.model_copy(update={"out": str(tmp_path / "straight"), "round_steps": None})
    report, model = run_local(straight)
    promoted = np.load(Path(best["folder"]) / "model.npz")
    assert report["status"] == "max_epochs" and report["steps"] == 40
    assert set(promoted.files) == set(model) and all(np.array_equal(promoted[k], model[k]) for k in model)
    trial_report = json.loads((Path(best["folder"]) / "report.json").read_text())
    assert [h["loss"] for h in trial_report["history"]] == [h["loss"] for h in report["history"]]
    assert trial_report["test_metrics"] == report["test_metrics"]


@pytest.mark.parametrize("workers", [2])  # worker processes forked from the pack: the harder case (1 is in-process)
def test_a_trial_pack_trains_each_trial_bit_identically_to_it_alone_for_less(tiny_ratings, tmp_path, workers):
    """Three trials trained back to back by one warm fleet (one pack; its workers threads
    beside the supervisor at P = 1, processes forked from the warm one at P = 2) give the
    same models as each trial on a fleet of its own (--no-packs), and cost less: one cold
    start, one load of the data, one execution."""
    got = {}
    for arm, extra in (("pack", ()), ("alone", ("--no-packs",))):
        out = tmp_path / arm
        args = [
            *_job(tiny_ratings, out, "--trials", "3", "--scheduler", "none", "--workers", str(workers)),
            *extra,
        ]
        proc = _ebb(*args)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        got[arm] = (out, json.loads((out / "tune.json").read_text()))
    (pack_out, pack), (alone_out, alone) = got["pack"], got["alone"]
    assert len(pack["packs"]) == 1 and "packs" not in alone
    assert sorted(j["trial"] for j in pack["packs"][0]["jobs"]) == [0, 1, 2]
    for trial in range(3):
        packed = np.load(pack_out / "trials" / f"t{trial:03d}" / "model.npz")
        single = np.load(alone_out / "trials" / f"t{trial:03d}" / "model.npz")
        assert set(packed.files) == set(single.files)
        assert all(np.array_equal(packed[k], single[k]) for k in single.files)
        reports = [
            json.loads((o / "trials" / f"t{trial:03d}" / "report.json").read_text()) for o in (pack_out, alone_out)
        ]
        assert [h["loss"] for h in reports[0]["history"]] == [h["loss"] for h in reports[1]["history"]]
        # Priced as what it added to the pack, plus its share of what the pack paid once.
        cost = reports[0]["cost"]
        assert cost["total_usd"] == pytest.approx(cost["job_usd"] + cost["pack_usd"]) and cost["pack_usd"] > 0
        assert cost["by_component"]["step_functions"] == 0 and reports[1]["cost"]["by_component"]["step_functions"] > 0
    # tune.json's total is the trials' sum, and that is what the pack cost.
    rows = sum(r["cost_usd"] for r in pack["trials"])
    assert pack["total_usd"] == pytest.approx(rows, abs=1e-6)
    jobs = sum(
        json.loads((pack_out / "trials" / f"t{t:03d}" / "report.json").read_text())["cost"]["job_usd"] for t in range(3)
    )
    assert pack["total_usd"] == pytest.approx(jobs + pack["packs_usd"], abs=1e-6)
    first = pack["packs"][0]
    assert first["by_component"]["step_functions"] > 0 and first["loads"] == workers * 10  # each worker loads the split
    assert first["decisions"] == 3 and first["decide_seconds"] > 0  # two next jobs, then "no more"
    assert pack["total_usd"] < 0.8 * alone["total_usd"]


def test_tune_killed_outright_resumes_without_retraining_finished_rungs_within_its_budget(tiny_ratings, tmp_path):
    out = tmp_path / "search"
    budget = 0.0018  # two thirds of what the search costs unbounded
    proc = _ebb(*_job(tiny_ratings, out, "--budget-usd", str(budget), "--parallel", "2"), start_new_session=True)
    state_path = out / "tune_state.json"
    deadline = time.monotonic() + 120
    before = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if state_path.exists():
            state = json.loads(state_path.read_text())
            trials = state["search"]["trials"]
            if any(t["rung"] >= 0 for t in trials) and any(t["running"] for t in trials):
                before = state
                break
        time.sleep(0.05)
    assert before is not None, "the search finished a rung and went on"
    children = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)  # only the search: its trials and redis-server must follow
    proc.wait()
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]

    resumed = _ebb("tune", "--resume", str(out))
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    result = json.loads((out / "tune.json").read_text())
    assert result["total_usd"] <= budget
    assert result["packs"] and {p["pack"] for p in before["packs"]} < {p["pack"] for p in result["packs"]}
    rungs = result["rungs"]
    done_before = {t["id"]: t["rung"] for t in before["search"]["trials"] if t["rung"] >= 0}
    after = result["launches"][len(before["search"]["launches"]) :]
    for launch in after:  # only unfinished rungs were trained after the kill
        if launch["trial"] in done_before:
            assert launch["from_epochs"] >= rungs[done_before[launch["trial"]]]
    for trial in {x["trial"] for x in result["launches"]}:
        spans = [(x["from_epochs"], x["to_epochs"]) for x in result["launches"] if x["trial"] == trial]
        # each rung's job started once, except the one the kill interrupted, started again
        assert all(b[0] in (a[0], a[1]) for a, b in zip(spans, spans[1:]))
        report = json.loads((out / "trials" / f"t{trial:03d}" / "report.json").read_text())
        steps = [h["step"] for h in report["history"]]
        assert steps == list(range(len(steps)))  # no step trained twice in the trial's history


def test_a_scoring_at_a_rounds_last_step_reaches_the_supervisor_as_without_the_cut(tiny_ratings, tmp_path):
    """Rounds ending exactly where validation is scored (what a rung does): the scoring
    travels in the worker's checkpoint, so early stopping sees every one of them."""
    from ebb.spec import load_spec

    def spec(out, **more):
        fields = {"model": "pmf", "data": tiny_ratings, "out": str(out), "seed": 2, "hyper.rank": 5}
        return load_spec(overrides={**fields, "stop.max_epochs": 4, **more})

    whole, _ = run_local(spec(tmp_path / "whole"))
    cut, _ = run_local(spec(tmp_path / "cut", round_steps=10))  # 10 parts: a round an epoch
    assert cut["rounds"] == 4 and whole["rounds"] == 1
    vals = [(h["step"], h.get("val")) for h in whole["history"] if h.get("val") is not None]
    assert len(vals) >= 3 and vals == [(h["step"], h.get("val")) for h in cut["history"] if h.get("val") is not None]
    assert cut["best_val"] == whole["best_val"] and cut["best_step"] == whole["best_step"]
