"""Faults injected into real runs (the local runner, real worker processes, a real
redis-server): a killed or stalled worker, a killed `ebb train`, a redis-server that dies;
32 workers at once; and every bad input of the reliability issue answered in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from ebb.local.runner import JobFailed, run_local
from ebb.spec import SpecError, load_spec
from ebb.stores.local import FolderObjectStore
from tests.helpers.data import planted_ratings


def _spec(data_dir, out, **fields):
    base = {
        "model": "pmf",
        "data": data_dir,
        "out": str(out),
        "scaling.policy": "none",
        "seed": 3,
        "hyper.rank": 5,
        "stop.max_epochs": 40,
        "workers": 4,
        "sync.mode": "isp",
    }
    base.update(fields)
    return load_spec(overrides=base)


def _workers_of(job: str) -> dict[int, psutil.Process]:
    """This job's worker processes, found by their titles (`ebb worker <id> <job>`)."""
    out = {}
    for p in psutil.process_iter(["cmdline"]):
        words = " ".join(p.info["cmdline"] or []).split()
        if words[:2] == ["ebb", "worker"] and words[-1:] == [job]:
            out[int(words[2])] = p
    return out


class Injector:
    """A metrics sink that, when the job closes step ``at_step``, does something to its workers.

    It runs in the supervisor's thread, so the job cannot finish before the fault is in: a
    fast machine once finished a whole test job inside a fixed 0.6 s wait."""

    def __init__(self, job: str, action, at_step: int = 3):
        self.job, self.action, self.at_step = job, action, at_step
        self.error: Exception | None = None
        self.acted = False

    def step(self, record: dict) -> None:
        if self.acted or record["step"] < self.at_step:
            return
        self.acted = True
        try:
            workers = _workers_of(self.job)
            assert len(workers) == 4, f"workers found: {sorted(workers)}"
            self.action(workers)
        except Exception as exc:  # surfaced by the test
            self.error = exc

    def close(self, report: dict) -> None:
        pass

    def check(self) -> None:
        assert self.acted and self.error is None, self.error or f"step {self.at_step} never came"


def test_a_worker_killed_mid_job_is_evicted_and_the_job_finishes_as_well(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    clean, _ = run_local(_spec(data_dir, tmp_path / "clean"))
    spec = _spec(data_dir, tmp_path / "faulty", name="kill-a-worker")
    injector = Injector(spec.name, lambda workers: workers[2].send_signal(signal.SIGKILL))
    report, _ = run_local(spec, injector)
    injector.check()
    lost = [e for e in report["scale_events"] if e["action"] == "lost"]
    assert [(e["worker"], e["reason"]) for e in lost] == [(2, "was killed by signal 9 (SIGKILL)")]
    assert report["status"] == "max_epochs" and report["workers"] == {"initial": 4, "final": 3}
    # three workers take more steps for the same epochs, so "as well" is "no more than 2% worse"
    assert report["test_metrics"]["rmse"] <= 1.02 * clean["test_metrics"]["rmse"]


def test_a_stalled_worker_is_evicted_and_no_healthy_worker_crashes(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    spec = _spec(data_dir, tmp_path, name="stall-evict", **{"faults.worker_timeout_s": 3, "stop.max_epochs": 20})
    stopped = []

    def stall(workers):
        workers[1].send_signal(signal.SIGSTOP)  # it will not get a SIGCONT: the job gives up on it
        stopped.append(workers[1])

    injector = Injector(spec.name, stall)
    report, _ = run_local(spec, injector)
    injector.check()
    (lost,) = [e for e in report["scale_events"] if e["action"] == "lost"]
    assert lost["worker"] == 1 and lost["reason"].startswith("went silent (no heartbeat for ")
    assert report["status"] == "max_epochs" and report["workers"]["final"] == 3
    assert not stopped[0].is_running() or stopped[0].status() == psutil.STATUS_ZOMBIE  # killed, not left stopped


def test_a_worker_stalled_longer_than_a_socket_timeout_is_waited_for(small_ratings, tmp_path):
    """redis-py's 5 s socket timeout used to cut the healthy workers' barrier wait short."""
    data_dir, _ = small_ratings
    spec = _spec(data_dir, tmp_path, name="stall-wait", **{"faults.worker_timeout_s": 60, "stop.max_epochs": 6})

    resumes = []

    def stall(workers):
        workers[3].send_signal(signal.SIGSTOP)
        resumes.append(threading.Timer(8, workers[3].send_signal, (signal.SIGCONT,)))
        resumes[0].start()

    injector = Injector(spec.name, stall, at_step=1)
    started = time.monotonic()
    report, _ = run_local(spec, injector)
    injector.check()
    resumes[0].join()
    assert time.monotonic() - started > 8
    assert report["status"] == "max_epochs" and report["workers"]["final"] == 4 and report["scale_events"] == []


def test_killing_ebb_train_leaves_nothing_running_and_resume_finishes(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    (tmp_path / "tmp").mkdir()  # the job's own temporary folder, to see that it leaves nothing there
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
            "--policy",
            "none",
            "--max-epochs",
            "30",
            "--round-steps",
            "8",
            "--name",
            "kill-train",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
    )
    latest = out / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 120
    while not (latest.exists() and len(_workers_of("kill-train")) == 3):  # a round done, the next one running
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert any(c.name() == "redis-server" for c in children)
    proc.kill()  # only `ebb train` itself: its workers and redis-server must follow on their own
    proc.wait()
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    assert _workers_of("kill-train") == {}
    assert list((tmp_path / "tmp").iterdir()) == []
    resumed = subprocess.run(
        [sys.executable, "-m", "ebb.cli", "train", "--resume", str(out)], capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "report.json").read_text())["status"] == "max_epochs"


def test_a_redis_server_that_dies_mid_job_is_replaced_and_the_round_run_again(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    # 8 epochs: 48 steps in 8 rounds, each with its worker processes; the server dies in round 1 or 2.
    short = {"stop.max_epochs": 8}
    clean, clean_model = run_local(_spec(data_dir, tmp_path / "clean", round_steps=6, **short))
    spec = _spec(data_dir, tmp_path / "faulty", name="redis-dies", round_steps=6, **short)
    latest = tmp_path / "faulty" / "checkpoints" / "latest.json"
    others = {p.pid for p in psutil.Process().children() if p.name() == "redis-server"}  # e.g. the session's

    def kill_redis():
        deadline = time.monotonic() + 60
        while not (latest.exists() and json.loads(latest.read_text())["round"] >= 1):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (server,) = [p for p in psutil.Process().children() if p.name() == "redis-server" and p.pid not in others]
        server.kill()

    killer = threading.Thread(target=kill_redis, daemon=True)
    killer.start()
    report, model = run_local(spec)
    killer.join()
    (fault,) = report["faults"]
    assert fault["reason"].startswith("the update store was lost") and "a new one runs on" in fault["recovery"]
    # The lost attempt ran and was paid for: its time is in the job's (issue 24).
    assert fault["attempt_seconds"] > 0 and fault["workers"] == 4
    assert report["wall_seconds"] > fault["attempt_seconds"]
    # The round ran again from its checkpoints: the job ends where an undisturbed one does.
    assert report["status"] == "max_epochs" and report["steps"] == clean["steps"]
    assert all(np.array_equal(model[k], clean_model[k]) for k in model)
    assert [p for p in psutil.Process().children() if p.name() == "redis-server" and p.pid not in others] == []


def test_a_redis_server_that_is_killed_or_stopped_no_longer_answers():
    """What the runner asks before replacing its own server: a SIGKILLed one may not be
    reaped yet, and a stopped one still has a pid; neither answers."""
    from ebb.local.redis_server import RedisServer

    with RedisServer() as server:
        assert server.answers()
        server.proc.send_signal(signal.SIGSTOP)
        try:
            assert not server.answers(timeout=0.3)
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert server.answers()
        server.proc.kill()
        assert not server.answers(timeout=0.3)


def test_an_external_redis_that_does_not_come_back_fails_the_job_in_one_line(small_ratings, tmp_path, monkeypatch):
    import ebb.local.runner as runner
    from ebb.local.redis_server import RedisServer

    monkeypatch.setattr(runner, "STORE_RECONNECT_S", 1.0)
    data_dir, _ = small_ratings
    server = RedisServer().start()
    spec = _spec(data_dir, tmp_path, name="redis-gone", redis_urls=[server.url], round_steps=6)
    latest = tmp_path / "checkpoints" / "latest.json"

    def stop_redis():
        while not latest.exists():
            time.sleep(0.01)
        server.stop()

    threading.Thread(target=stop_redis, daemon=True).start()
    with pytest.raises(runner.JobFailed, match=r"the update store was lost \(.*\) and did not come back") as failed:
        run_local(spec)
    assert failed.value.report["steps"] >= 6 and failed.value.report["history"]  # what it had done is kept
    assert not (tmp_path / "model.npz").exists()


def test_32_workers_for_200_steps(tmp_path):
    """A load test: 32 worker processes on this machine's cores, no deadlock; the report says
    how long the supervisor spends on each step."""
    data, _ = planted_ratings(
        tmp_path, users=400, items=300, ratings=12_000, rank=4, noise=0.3, seed=5, batch_size=100, val_fraction=0.0
    )
    parts = len(json.loads((Path(data) / "manifest.json").read_text())["train"]["parts"])
    spec = _spec(data, tmp_path / "out", workers=32, **{"hyper.rank": 4, "stop.max_epochs": 200 * 32 / parts})
    report, _ = run_local(spec)
    assert report["status"] == "max_epochs" and report["steps"] == 200 and report["workers"]["final"] == 32
    handling = report["supervisor_ms_per_step"]
    assert handling["steps"] == 200 and 0 < handling["median"] <= handling["p90"] <= handling["max"]


# -- bad input, answered before anything runs -----------------------------------------------
def _ebb(*args):
    return subprocess.run([sys.executable, "-m", "ebb.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "text, message",
    [
        ("stop:\n  max_seconds: .inf\n", "job.yaml:2: stop.max_seconds: Input should be a finite number"),
        ("workers: true\n", "job.yaml:1: workers: Input should be a valid integer"),
        ("workers: 2.5\n", "job.yaml:1: workers: Input should be a valid integer"),
    ],
)
def test_spec_values_must_be_what_they_say(tmp_path, text, message):
    (tmp_path / "job.yaml").write_text("model: pmf\ndata: x\n" + text)
    with pytest.raises(SpecError) as bad:
        load_spec(tmp_path / "job.yaml")
    assert str(bad.value).replace(str(tmp_path) + "/", "").replace(":3:", ":1:").replace(":4:", ":2:") == message
    r = _ebb("train", "--model", "pmf", "--data", "x", "--lr", "nan")
    assert r.returncode == 2
    assert r.stderr.strip() == "ebb train: command line: hyper.lr: Input should be a finite number"


def test_prepare_refuses_an_out_of_range_rating_and_an_empty_file(tmp_path):
    (tmp_path / "r.csv").write_text("userId,movieId,rating,timestamp\n1,2,3.5,10\n1,3,1e300,11\n")
    r = _ebb("prepare", "--format", "movielens", "--input", str(tmp_path / "r.csv"), "--out", str(tmp_path / "p"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"ebb prepare: {tmp_path / 'r.csv'}:3: rating '1e300' is out of range (|rating| ≤ 1e+06)"
    )
    (tmp_path / "empty.csv").write_text("")
    r = _ebb("prepare", "--format", "movielens", "--input", str(tmp_path / "empty.csv"), "--out", str(tmp_path / "q"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.fixture
def prepared(small_ratings, tmp_path):
    """A copy of the small dataset this test may damage."""
    import shutil

    shutil.copytree(small_ratings[0], tmp_path / "ds")
    return tmp_path / "ds"


def _train(data, out, *extra):
    return _ebb("train", "--model", "pmf", "--data", str(data), "--out", str(out), "--max-epochs", "1", *extra)


def test_a_damaged_dataset_is_refused_before_training(prepared, tmp_path):
    manifest = json.loads((prepared / "manifest.json").read_text())
    n_parts = len(manifest["train"]["parts"])
    r = _train(prepared, tmp_path / "o1", "--workers", str(n_parts + 1))
    assert r.returncode == 2 and r.stderr.startswith(
        f"ebb train: workers: {n_parts + 1} is more than the {n_parts} training minibatches"
    )
    (prepared / "test" / "part-000001").unlink()
    r = _train(prepared, tmp_path / "o2")
    assert r.returncode == 2 and "listed in" in r.stderr and "are missing, e.g. test/part-000001" in r.stderr
    (prepared / "test" / "part-000001").write_bytes(b"changed")
    r = _train(prepared, tmp_path / "o3")
    assert r.returncode == 2 and "test/part-000001 does not match its checksum" in r.stderr
    (prepared / "manifest.json").write_text("{not json")
    r = _train(prepared, tmp_path / "o4")
    assert r.returncode == 2 and "manifest.json is corrupt" in r.stderr
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))  # nothing was written anywhere


def test_out_never_mixes_two_runs(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    good = tmp_path / "good"
    assert _train(data_dir, good).returncode == 0
    before = {f.name: f.stat().st_mtime_ns for f in good.iterdir()}
    r = _train(data_dir, good, "--lr", "90")  # would fail: it must not touch the good run's folder
    assert r.returncode == 2 and "holds a run already (report.json, status max_epochs)" in r.stderr
    assert {f.name: f.stat().st_mtime_ns for f in good.iterdir()} == before
    (tmp_path / "afile").write_text("x")
    r = _train(data_dir, tmp_path / "afile")
    assert r.returncode == 2 and "is a file" in r.stderr
    # A failed run's folder may be reused: its report is replaced by the new run's.
    failed = tmp_path / "failed"
    assert _train(data_dir, failed, "--optimizer", "sgd_momentum", "--lr", "90").returncode == 1  # SGD diverges
    report = json.loads((failed / "report.json").read_text())
    assert report["status"] == "failed"
    assert "diverged at step" in report["error"] and "lower hyper.lr" in report["error"]
    assert report["history"] and not (failed / "model.npz").exists()
    assert _train(data_dir, failed).returncode == 0
    assert json.loads((failed / "report.json").read_text())["status"] == "max_epochs"
    assert Path(failed / "model.npz").exists()


def test_a_waiting_worker_leaves_when_given_up_on_and_fails_when_the_supervisor_goes_silent(small_ratings, tmp_path):
    from ebb.engine.clock import wall
    from ebb.engine.errors import EngineError
    from ebb.engine.worker import Lost, Worker
    from ebb.ports.keys import ABORT_BLOB, SUPERVISOR_SLOT, lost_blob
    from ebb.ports.launcher import WorkerStart
    from ebb.stores.memory import MemorySignalChannel, MemoryUpdateStore

    data_dir, _ = small_ratings
    spec = _spec(data_dir, tmp_path, **{"faults.worker_timeout_s": 5, "faults.supervisor_timeout_s": 5})
    updates = MemoryUpdateStore()
    worker = Worker(
        spec,
        WorkerStart(worker=1, members=[0, 1, 2, 3]),
        data=FolderObjectStore(data_dir),
        checkpoints=FolderObjectStore(tmp_path / "ckpt"),
        updates=updates,
        signals=MemorySignalChannel(),
    )
    worker._round_started = wall() - 20  # this invocation began its round 20 s ago
    updates.heartbeat(SUPERVISOR_SLOT, wall() - 30)
    worker._check_still_wanted(need=7)  # the previous round's beat: this round's supervisor may be cold-starting
    worker._round_started = wall() - 200
    updates.heartbeat(SUPERVISOR_SLOT, wall() - 250)
    with pytest.raises(EngineError, match=r"the supervisor went silent \(nothing for 200 s\)"):
        worker._check_still_wanted(need=7)  # ... but not for longer than start-up may take (120 s)
    worker._round_started = wall() - 20
    updates.heartbeat(SUPERVISOR_SLOT, wall() - 2)
    worker._check_still_wanted(need=7)  # the supervisor beats: a slow step, not a dead one
    updates.heartbeat(SUPERVISOR_SLOT, wall() - 12)
    with pytest.raises(
        EngineError,
        match=r"worker 1: the supervisor went silent \(nothing for 1[23] s\) while "
        r"this worker waited for step 7's directive",
    ):
        worker._check_still_wanted(need=7)
    updates.heartbeat(SUPERVISOR_SLOT, wall())
    updates.put_blob(ABORT_BLOB, b"worker 0 failed after step 6: EngineError: ...")
    with pytest.raises(EngineError, match=r"worker 1: the supervisor gave the round up \(worker 0 failed after step 6"):
        worker._check_still_wanted(need=7)
    updates.put_blob(lost_blob(1), b"1")
    with pytest.raises(Lost):
        worker._check_still_wanted(need=7)


class _InterruptInDestructor:
    """Delivers a Ctrl-C while a destructor runs, where CPython prints "Exception ignored in
    ..." and drops the KeyboardInterrupt (cpython#95959): the rare way a real Ctrl-C is lost."""

    def __del__(self):
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # the handler runs at one of these bytecodes: still inside __del__
            pass


def test_a_ctrl_c_lost_in_a_destructor_still_stops_the_job(small_ratings, tmp_path, monkeypatch):
    data_dir, _ = small_ratings
    spec = _spec(data_dir, tmp_path, name="lost-ctrl-c", **{"stop.max_epochs": 400, "workers": 2})

    class InterruptAtStep3:
        def step(self, record):
            if record["step"] == 3:
                _InterruptInDestructor()  # made and dropped at once: its __del__ runs here

        def close(self, report):
            pass

    dropped = []  # what CPython could not raise ("Exception ignored in ...")
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))
    with pytest.raises(JobFailed) as failed:
        run_local(spec, InterruptAtStep3())
    assert dropped == [KeyboardInterrupt]  # the first interrupt was indeed lost
    report = failed.value.report
    assert report["status"] == "failed" and report["error"] == "interrupted (Ctrl-C)"
    assert report["steps"] < 100  # stopped within a poll, not after the job's 400 epochs
