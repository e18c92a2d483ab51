"""The job spec's errors name file, line and field; the CLI keeps its contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ebb.catalogue import CATALOGUE
from ebb.cli import main
from ebb.spec import SpecError, SyncSpec, field_default, load_spec


def _job(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_file_line_and_field(tmp_path):
    path = _job(tmp_path, "model: pmf\ndata: d\nstop:\n  max_epochs: 3\n  max_epoch: 4\n")
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value) == f"{path}:5: stop.max_epoch: unknown field"


def test_out_of_range_value_names_file_line_and_field(tmp_path):
    path = _job(tmp_path, "model: pmf\ndata: d\nworkers: 0\n")
    with pytest.raises(SpecError, match=rf"^{path}:3: workers: Input should be greater than or equal to 1$"):
        load_spec(path)


def test_bad_yaml_and_bad_override_are_one_line_errors(tmp_path):
    with pytest.raises(SpecError, match=r"job.yaml:2: not valid YAML"):
        load_spec(_job(tmp_path, "model: pmf\n  data: [\n"))
    with pytest.raises(SpecError, match=r"^command line: sync.significance: Input should be greater"):
        load_spec(overrides={"data": "d", "sync.significance": -1})
    with pytest.raises(SpecError, match=r"horizon_s .* must be ≤ interval_s"):
        load_spec(overrides={"data": "d", "scaling.horizon_s": 30})


def test_flags_override_the_file_and_defaults_follow_the_model(tmp_path):
    path = _job(tmp_path, "model: sparse_lr\ndata: d\nworkers: 2\nhyper:\n  lr: 0.5\n")
    spec = load_spec(path, {"workers": 6, "hyper.l2": None})
    assert spec.workers == 6 and spec.hyper.lr == 0.5 and spec.hyper.l2 == CATALOGUE["sparse_lr"].hyper["l2"]
    assert load_spec(overrides={"data": "d", "model": "pmf"}).hyper.rank == CATALOGUE["pmf"].hyper["rank"]


def test_ssp_with_a_scaling_policy_is_refused():
    with pytest.raises(SpecError, match="scaling.policy must be 'none' with sync.mode 'ssp'"):
        load_spec(overrides={"data": "d", "workers": 4, "sync.mode": "ssp", "scaling.policy": "autotune"})


def test_the_optimizer_follows_the_model_and_sgd_takes_its_own_lr():
    default = load_spec(overrides={"data": "d"}).hyper
    assert default.optimizer == "adam" and default.lr == CATALOGUE["pmf"].hyper["lr"]
    sgd = load_spec(overrides={"data": "d", "hyper.optimizer": "sgd_momentum"}).hyper
    assert sgd.optimizer == "sgd_momentum" and sgd.lr == CATALOGUE["pmf"].other_lr["sgd_momentum"] != default.lr
    assert load_spec(overrides={"data": "d", "hyper.optimizer": "sgd_momentum", "hyper.lr": 0.01}).hyper.lr == 0.01
    assert load_spec(overrides={"data": "d", "model": "lr"}).hyper.optimizer == "adam"
    with pytest.raises(SpecError, match="hyper.optimizer: model sparse_lr trains with adam only"):
        load_spec(overrides={"data": "d", "model": "sparse_lr", "hyper.optimizer": "sgd_momentum"})


def test_the_sum_cap_is_8_in_every_sync_mode_unless_set():
    for mode in ("bsp", "ssp", "isp"):
        spec = load_spec(overrides={"data": "d", "model": "sparse_lr", "sync.mode": mode, "scaling.policy": "none"})
        assert spec.sync.sum_cap == field_default(SyncSpec, "sum_cap") == 8
    assert load_spec(overrides={"data": "d", "sync.sum_cap": 4}).sync.sum_cap == 4
    with pytest.raises(SpecError, match="sum_cap"):
        load_spec(overrides={"data": "d", "sync.sum_cap": 0})


def test_cli_synth_prepare_train_end_to_end(tmp_path, capsys):
    ratings = tmp_path / "r.dat"
    assert (
        main(
            [
                "synth",
                "ratings",
                "--out",
                str(ratings),
                "--users",
                "200",
                "--items",
                "150",
                "--ratings",
                "15000",
                "--rank",
                "4",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    assert ratings.read_text().splitlines()[0].count("::") == 3
    assert (
        main(
            [
                "prepare",
                "--format",
                "movielens",
                "--input",
                str(ratings),
                "--out",
                str(tmp_path / "prep"),
                "--batch-size",
                "1000",
            ]
        )
        == 0
    )
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--model",
                "pmf",
                "--data",
                str(tmp_path / "prep"),
                "--max-epochs",
                "3",
                "--out",
                str(out),
                "--rank",
                "4",
                "--policy",
                "none",
            ]
        )
        == 0
    )
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "max_epochs" and report["epochs"] >= 3
    for key in ("wall_seconds", "steps", "final_loss", "history", "totals", "cost", "perf_per_dollar", "spec"):
        assert key in report
    assert set(report["test_metrics"]) == {"rmse"}
    assert (out / "loss.png").stat().st_size > 1000 and (out / "model.npz").exists()
    assert "test rmse" in capsys.readouterr().out


def test_cli_train_logistic_reports_classification_metrics(small_logistic, tmp_path):
    data_dir, _ = small_logistic
    out = tmp_path / "run"
    assert main(["train", "--model", "sparse_lr", "--data", data_dir, "--max-epochs", "2", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["test_metrics"]) == {"logloss", "accuracy", "auc"}


def test_cli_errors_exit_nonzero_with_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "ebb.cli", "train", "--model", "pmf", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"ebb train: data: {tmp_path} has no manifest.json; prepare it first with "
        "`ebb prepare` (or give the job a prepare section)"
    )
    r = subprocess.run([sys.executable, "-m", "ebb.cli", "train", "--model", "pmf"], capture_output=True, text=True)
    assert r.returncode == 2 and "data: Field required" in r.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("userId,movieId,rating,timestamp\n1,2,3.5,10\n1,x,4,11\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ebb.cli",
            "prepare",
            "--format",
            "movielens",
            "--input",
            str(bad),
            "--out",
            str(tmp_path / "p"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and f"{bad}:3:" in r.stderr


def test_a_failed_job_writes_a_failed_report_and_exits_1(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    out = tmp_path / "run"
    # A learning rate this large diverges (SGD's: Adam's steps are bounded by lr, so they
    # only wander): the job must fail loudly, not report nonsense.
    args = ["--optimizer", "sgd_momentum", "--lr", "90", "--max-epochs", "5", "--out", str(out)]
    code = main(["train", "--model", "pmf", "--data", data_dir, *args])
    report = json.loads((out / "report.json").read_text())
    assert code == 1 and report["status"] == "failed" and "diverged" in report["error"]


def test_no_quantize_flag_reaches_the_spec():
    from ebb.cli import build_parser
    from ebb.flags import JOB_FLAGS, given

    args = build_parser().parse_args(["train", "--data", "d", "--no-quantize"])
    assert load_spec(overrides=given(args, JOB_FLAGS)).sync.quantize is False
    args = build_parser().parse_args(["train", "--data", "d"])
    assert load_spec(overrides=given(args, JOB_FLAGS)).sync.quantize


def test_help_teaches():
    r = subprocess.run([sys.executable, "-m", "ebb.cli", "train", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for flag in (
        "--model",
        "--data",
        "--rank",
        "--lr",
        "--workers",
        "--target-loss",
        "--max-seconds",
        "--max-epochs",
        "--seed",
        "--out",
        "--sync",
        "--significance",
        "--slack",
        "--quantize",
        "--no-quantize",
        "--redis",
        "--policy",
        "--min-workers",
        "--l2",
        "--lr-decay",
        "--momentum",
        "--patience-evals",
        "--target-val",
        "--min-delta",
        "--set",
        "--budget-usd",
        "--memory-mb",
        "examples:",
    ):
        assert flag in r.stdout


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_every_worker_and_the_redis_server(small_ratings, tmp_path, how):
    import signal
    import time

    import psutil

    data_dir, _ = small_ratings
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ebb.cli",
            "train",
            "--model",
            "pmf",
            "--data",
            data_dir,
            "--workers",
            "3",
            "--max-epochs",
            "100000",
            "--policy",
            "none",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    children: list = []
    while time.monotonic() < deadline:
        children = parent.children(recursive=True)
        names = [c.name() for c in children if c.is_running()]
        if len(children) >= 4 and any("redis" in n for n in names):
            break
        time.sleep(0.1)
    assert len(children) >= 4, "three workers and a redis-server were started"
    time.sleep(1.0)  # let it train a little
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: the whole process group
    else:
        proc.terminate()  # as a job scheduler or `kill` does: the parent only
    _, stderr = proc.communicate(timeout=30)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], [p.name() for p in alive]
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 1 and report["status"] == "failed"
    assert ("interrupted" if how == "ctrl-c" else "SIGTERM") in report["error"]
    assert "Traceback" not in stderr


def test_a_job_with_a_prepare_section_prepares_its_data_first(tmp_path):
    from ebb.data.synth import synth_ratings

    synth_ratings(tmp_path / "raw.csv", users=100, items=80, ratings=4000, rank=3, noise=0.3, seed=1)
    job = tmp_path / "job.yaml"
    job.write_text(f"""model: pmf
data: {tmp_path / "prepared"}
out: {tmp_path / "run"}
prepare:
  format: movielens
  input: {tmp_path / "raw.csv"}
  batch_size: 500
stop:
  max_epochs: 2
""")
    r = subprocess.run([sys.executable, "-m", "ebb.cli", "train", str(job)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "prepared" / "manifest.json").read_text())
    assert manifest["source"]["input"] == str(tmp_path / "raw.csv") and manifest["batch_size"] == 500
    assert json.loads((tmp_path / "run" / "report.json").read_text())["status"] == "max_epochs"
    job.write_text(job.read_text().replace("raw.csv", "missing.csv").replace("prepared", "prepared2"))
    r = subprocess.run([sys.executable, "-m", "ebb.cli", "train", str(job)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("ebb train: prepare")
