"""Issue 24's hostile inputs that need no process: manifests of the wrong shape, values that
overflow their stored type, bounded dimensions, corrupt checkpoints (the whole commands are
in tests/integration/test_hostile_outputs.py)."""

from __future__ import annotations

import json
import os

import pytest

from ebb.ports.manifest import Manifest

GOOD = {
    "format": "movielens",
    "kind": "ratings",
    "batch_size": 10,
    "seed": 0,
    "train": {"rows": 10, "parts": [{"key": "train/part-000000", "rows": 10, "sha256": "ab"}]},
    "test": {"rows": 0, "parts": []},
    "num_users": 3,
    "num_items": 4,
}


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda m: [], "expected an object, found list"),
        (lambda m: "test", "expected an object, found str"),
        (lambda m: {k: v for k, v in m.items() if k != "test"}, "'test' is missing"),
        (lambda m: {**m, "num_users": "500"}, 'num_users: expected int, found "500"'),
        (lambda m: {**m, "num_items": True}, "num_items: expected int, found true"),
        (lambda m: {**m, "train": {**m["train"], "parts": {}}}, "train.parts: expected list"),
        (lambda m: {**m, "train": {"rows": 1, "parts": [{"key": 3, "rows": 1, "sha256": ""}]}}, "train.parts[0].key"),
        (lambda m: {**m, "extra": 1}, "unknown field 'extra'"),
    ],
)
def test_a_manifest_of_the_wrong_shape_names_its_first_wrong_field(edit, expected):
    assert Manifest.from_json(json.dumps(GOOD)).num_users == 3
    with pytest.raises(ValueError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        Manifest.from_json(json.dumps(edit(GOOD)))


# -- values checked in the type they are stored in; bounded dimensions --------------------
def _prepare(tmp_path, fmt: str, text: str, name: str = "input", **kwargs):
    from ebb.data.prepare import prepare_dataset
    from ebb.stores.local import FolderObjectStore

    path = tmp_path / name
    path.write_text(text)
    return prepare_dataset(fmt, path, FolderObjectStore(tmp_path / "ds"), batch_size=2, test_fraction=0.0, **kwargs)


CRITEO_ROW = "1\t" + "\t".join(["5"] * 13) + "\t" + "\t".join(["a1b2"] * 26) + "\n"


@pytest.mark.parametrize(
    "fmt, name, rows, bad_line, expected",
    [
        (
            "libsvm",
            "x.svm",
            "1 1:0.5\n0 2:1e39\n1 3:1\n",
            2,
            "feature value '1e39' is out of range: it is stored as float32",
        ),
        ("csv", "x.csv", "label,a,b\n1,0.5,1\n0,-1e39,2\n1,3,4\n", 3, "column 'a' value '-1e39' is out of range"),
        ("criteo", "x.tsv", CRITEO_ROW + CRITEO_ROW.replace("\t5\t", "\t1e39\t", 1) + CRITEO_ROW, 2, "I1 value '1e39'"),
        (
            "movielens",
            "u.data",
            "1\t2\t3\t0\n123456789012345678901234567890\t2\t3\t0\n3\t4\t5\t0\n",
            2,
            "user id '123456789012345678901234567890' is out of range (a 64-bit integer)",
        ),
        ("movielens", "u.data", "1\t2\t3\t0\n2\t1e300\t3\t0\n3\t4\t5\t0\n", 2, "item id '1e300' is out of range"),
    ],
)
def test_a_value_that_does_not_fit_its_stored_type_is_refused_with_file_and_line(
    tmp_path, fmt, name, rows, bad_line, expected
):
    """Before: 1e39 became +inf (or zeroed a CSV column); a 30-digit id wrapped to INT64_MIN."""
    from ebb.data.readers import DataError

    with pytest.raises(DataError) as info:
        _prepare(tmp_path, fmt, rows, name)
    assert str(info.value).startswith(f"{tmp_path / name}:{bad_line}: ") and expected in str(info.value)


def test_ids_just_inside_int64_are_kept_exactly_not_wrapped(tmp_path):
    from ebb.data.format import decode_batch
    from ebb.data.prepare import ID_MAP_KEY
    from ebb.stores.local import FolderObjectStore

    big = 2**63 - 1
    _prepare(tmp_path, "movielens", f"1\t2\t3\t0\n{big}\t2\t4\t0\n3\t{big - 1}\t5\t0\n", "u.data")
    ids = decode_batch(FolderObjectStore(tmp_path / "ds").get(ID_MAP_KEY))
    assert big in ids["user"].tolist() and big - 1 in ids["item"].tolist()


def test_dimensions_are_bounded_by_max_dimension(tmp_path):
    from ebb.data.readers import DataError

    with pytest.raises(DataError, match=r"x.svm:2: feature index 2147483000 is out of range \[0, 16777215\]"):
        _prepare(tmp_path, "libsvm", "1 1:1\n0 2147483000:1\n", "x.svm")
    with pytest.raises(DataError, match=r"more than 3 distinct users by this line \(prepare.max_dimension"):
        _prepare(tmp_path, "movielens", "".join(f"{u}\t1\t3\t0\n" for u in range(6)), "u.data", max_dimension=3)
    assert _prepare(tmp_path, "libsvm", "1 1:1\n0 40:1\n", "y.svm", max_dimension=41).num_features == 41


def test_a_ten_megabyte_line_makes_a_short_error(tmp_path):
    from ebb.data.readers import DataError

    with pytest.raises(DataError) as info:
        _prepare(tmp_path, "libsvm", "1 1:1\n0 1:" + "9" * 10_000_000 + "x\n", "x.svm")
    assert len(str(info.value)) <= 200 and ":2: " in str(info.value)


@pytest.mark.parametrize(
    "dims, expected",
    [
        ({"kind": "sparse", "format": "libsvm", "num_features": 2_147_483_000}, "needs about 49,893 MB"),
        ({"num_users": 100_000_000_000}, "needs about"),
    ],
)
def test_preflight_refuses_a_model_that_cannot_fit_a_workers_memory(tmp_path, dims, expected):
    """Before: 2.1e9 features tried 8.6 GB per worker; num_users 1e11 an 8.4 TB allocation."""
    from ebb.engine.preflight import PreflightError, preflight
    from ebb.spec import load_spec
    from ebb.stores.local import FolderObjectStore

    store = FolderObjectStore(tmp_path)
    store.put("manifest.json", json.dumps({**GOOD, **dims}).encode())
    store.put("train/part-000000", b"")
    model = "sparse_lr" if dims.get("kind") == "sparse" else "pmf"
    spec = load_spec(overrides={"model": model, "data": str(tmp_path)})
    with pytest.raises(PreflightError, match=f"^aws.memory_mb: a worker of this job {expected}"):
        preflight(spec, store)


def test_skipped_ten_megabyte_lines_keep_the_manifest_small(tmp_path):
    manifest = _prepare(
        tmp_path, "libsvm", "1 1:1\n" * 4 + ("0 1:" + "9" * 10_000_000 + "x\n") * 3, "x.svm", skip_bad_rows=True
    )
    assert manifest.source["skipped_rows"] == 3
    assert len((tmp_path / "ds" / "manifest.json").read_bytes()) < 10_000


# -- checkpoints -------------------------------------------------------------------------
def test_checkpoints_carry_a_checksum_that_catches_what_the_zip_does_not(tmp_path):
    import numpy as np

    from ebb.data.format import encode_batch
    from ebb.engine import checkpoint
    from ebb.engine.errors import CheckpointError
    from ebb.stores.local import FolderObjectStore

    store = FolderObjectStore(tmp_path)
    checkpoint.write_worker(store, "w.npz", {"step": 3}, {"param.x": np.arange(4, dtype=np.float32)})
    meta, arrays = checkpoint.read_worker(store, "w.npz")
    assert meta["step"] == 3 and len(meta["sha256"]) == 64
    # Rewritten whole (zip CRCs and all) with other numbers under the old metadata: only the checksum knows.
    raw_meta = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    store.put("other.npz", encode_batch({"param.x": np.arange(1, 5, dtype=np.float32), "meta": raw_meta}))
    with pytest.raises(CheckpointError, match=r"other.npz is corrupt \(its arrays do not match the checksum"):
        checkpoint.read_worker(store, "other.npz")
    store.put("latest.json", b"{not json")
    with pytest.raises(CheckpointError, match=r"latest.json is corrupt \(JSONDecodeError"):
        checkpoint.latest(store)
    store.put("round-000001/supervisor.json", b"[]")
    with pytest.raises(CheckpointError, match=r"round-000001/supervisor.json is corrupt \(ValidationError"):
        checkpoint.read_supervisor(store, 1)


def test_wall_seconds_and_cost_count_restarted_attempts():
    """Before: a round run again cost nothing and took no time in report.json."""
    from ebb.engine.finalize import build_report, failure_report
    from ebb.engine.state import SupervisorState
    from ebb.spec import load_spec

    spec = load_spec(overrides={"model": "pmf", "data": "d", "workers": 4})
    state = SupervisorState.initial(spec)
    state.elapsed, state.worker_seconds = 100.0, 400.0
    plain = build_report(spec, state, {}, 0.0)
    state.faults = [{"round": 1, "restart": 1, "reason": "r", "recovery": "x", "attempt_seconds": 50.0, "workers": 4}]
    counted = build_report(spec, state, {}, 0.0)
    assert plain["wall_seconds"] == 100.0 and counted["wall_seconds"] == 150.0
    assert counted["totals"]["worker_seconds"] == 600.0
    assert counted["cost"]["total_usd"] > plain["cost"]["total_usd"]
    assert plain["model"] == "merged" and failure_report(spec, state, "x", failed_in_round=1)["model"] is None


# -- the lock on OUT -----------------------------------------------------------------------
@pytest.fixture(params=["folder", "s3"])
def out_store(request, tmp_path, monkeypatch):
    from ebb.stores.local import FolderObjectStore

    if request.param == "folder":
        yield FolderObjectStore(tmp_path / "run"), str(tmp_path / "run")
        return
    from moto import mock_aws

    from ebb.stores.s3 import S3ObjectStore, s3_client

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    with mock_aws():
        client = s3_client()
        client.create_bucket(Bucket="ebb-lock", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        yield S3ObjectStore("ebb-lock", "run", client=client), "s3://ebb-lock/run"


def test_the_lock_on_out_admits_one_job_at_a_time_on_a_folder_and_on_s3(out_store):
    from ebb.local.out_lock import OutLock, OutLocked
    from ebb.ports.keys import LOCK_KEY

    store, location = out_store
    first, second = OutLock(store, location), OutLock(store, location)
    first.acquire()
    with pytest.raises(OutLocked, match=rf"^out: {location} is in use by another job \(pid {os.getpid()} on host"):
        second.acquire()
    with pytest.raises(OutLocked, match="in use"):  # a live owner is not taken over by a resume either
        second.acquire(resume=True)
    first.release()
    assert not store.exists(LOCK_KEY)
    second.acquire()
    second.release()


def test_a_dead_owners_lock_is_named_and_taken_over_only_by_a_resume(tmp_path):
    import socket
    import subprocess
    import sys

    from ebb.local.out_lock import OutLock, OutLocked
    from ebb.ports.keys import LOCK_KEY
    from ebb.stores.local import FolderObjectStore

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    store = FolderObjectStore(tmp_path)
    store.put(LOCK_KEY, json.dumps({"pid": gone.pid, "host": socket.gethostname(), "since": "then"}).encode())
    with pytest.raises(OutLocked, match=rf"no longer running .*ebb train --resume {tmp_path}"):
        OutLock(store, str(tmp_path)).acquire()
    other_host = OutLock(FolderObjectStore(tmp_path / "b"), str(tmp_path / "b"))
    other_host.out.put(LOCK_KEY, json.dumps({"pid": 1, "host": "elsewhere", "since": "then"}).encode())
    with pytest.raises(OutLocked, match="on another host"):
        other_host.acquire(resume=True)
    taker = OutLock(store, str(tmp_path))
    taker.acquire(resume=True)
    assert json.loads(store.get(LOCK_KEY))["pid"] == os.getpid()


def test_a_worker_that_cannot_start_fails_the_job_with_its_message_not_an_exit_code(tmp_path, small_ratings):
    """Before: only "exited with code 1", and the job went on without it."""
    from ebb.engine.worker import Worker
    from ebb.local.runner import JobFailed, run_local
    from ebb.spec import load_spec

    class Unstartable(Worker):
        def __init__(self, *args, **kwargs):
            raise RuntimeError("the part cache cannot be allocated")

    data_dir, _ = small_ratings
    spec = load_spec(overrides={"model": "pmf", "data": data_dir, "out": str(tmp_path / "run"), "workers": 1})
    with pytest.raises(JobFailed) as info:
        run_local(spec, worker_cls=Unstartable)
    assert str(info.value) == (
        "worker 0 failed before its first step: could not start: RuntimeError: the part cache cannot be allocated"
    )
