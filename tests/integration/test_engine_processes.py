"""The engine with real worker processes over real redis-servers: ISP at v 0 is BSP, convergence,
sharding, a crashing worker, target_val."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import redis

from ebb.local.redis_server import RedisServer
from ebb.local.runner import JobFailed, run_local
from ebb.ports.keys import part_key
from ebb.ports.manifest import load_manifest
from ebb.stores.local import FolderObjectStore
from ebb.stores.redis_store import RedisUpdateStore
from tests.helpers.engine import engine_spec


def test_isp_with_zero_threshold_is_bsp_bit_for_bit(small_ratings, redis_url, tmp_path):
    data_dir, _ = small_ratings
    runs = {}
    for name, sync in (
        ("bsp", {"sync.mode": "bsp"}),
        ("isp0", {"sync.mode": "isp", "sync.significance": 0.0}),
        ("isp", {"sync.mode": "isp", "sync.significance": 0.7}),
    ):
        spec = engine_spec(data_dir, tmp_path / name, workers=3, redis_urls=[redis_url], **sync)
        runs[name] = run_local(spec)
    (bsp, bsp_model), (isp0, isp0_model), (isp, _) = runs["bsp"], runs["isp0"], runs["isp"]
    assert [h["loss"] for h in bsp["history"]] == [h["loss"] for h in isp0["history"]]
    for name in bsp_model:
        assert np.array_equal(bsp_model[name], isp0_model[name]), name
    assert bsp["test_metrics"] == isp0["test_metrics"]
    # A real threshold sends less and still trains.
    assert isp["totals"]["bytes_sent"] < 0.7 * bsp["totals"]["bytes_sent"]
    assert isp["totals"]["sent_fraction"] < bsp["totals"]["sent_fraction"] == 1.0
    assert isp["test_metrics"]["rmse"] < 1.1 * bsp["test_metrics"]["rmse"]


def test_four_workers_converge_over_redis_processes(small_ratings, tmp_path):
    """The embedded default: a private redis-server and four worker processes."""
    data_dir, meta = small_ratings
    spec = engine_spec(data_dir, tmp_path, workers=4, **{"sync.mode": "isp", "stop.max_epochs": 25, "hyper.rank": 5})
    report, _ = run_local(spec)
    store = FolderObjectStore(data_dir)
    manifest = load_manifest(store)
    baseline = manifest.stats["rating_std"] if "rating_std" in manifest.stats else None
    assert report["status"] == "max_epochs"
    assert report["workers"] == {"initial": 4, "final": 4}
    history = report["history"]
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]
    assert report["test_metrics"]["rmse"] < 1.5 * meta["noise"] + 0.1
    assert report["totals"]["bytes_received"] > 0 and report["totals"]["updates_sent"] > 0
    assert baseline is None or report["test_metrics"]["rmse"] < 0.7 * baseline


def test_redis_update_store_shards_by_worker_and_discards(tmp_path):
    with RedisServer() as a, RedisServer() as b:
        store = RedisUpdateStore([a.url, b.url], "job1")
        for w in range(4):
            store.publish(7, w, bytes([w]) * 10)
        ra, rb = redis.Redis.from_url(a.url), redis.Redis.from_url(b.url)
        assert sorted(ra.keys("ebb:{job1}:u:*")) == [b"ebb:{job1}:u:7:0", b"ebb:{job1}:u:7:2"]
        assert sorted(rb.keys("ebb:{job1}:u:*")) == [b"ebb:{job1}:u:7:1", b"ebb:{job1}:u:7:3"]
        assert 0 < ra.ttl("ebb:{job1}:u:7:0") <= 3600
        got = store.fetch(7, [0, 1, 2, 3, 4])
        assert got == {w: bytes([w]) * 10 for w in range(4)}  # worker 4 sent nothing: absent
        store.discard([7], range(4))
        assert store.fetch(7, range(4)) == {}
        store.put_blob("x", b"abc")
        store.clear()
        assert ra.dbsize() == 0 and rb.dbsize() == 0


def test_a_crashing_worker_fails_the_job_and_leaves_nothing_running(small_ratings, tmp_path):
    import shutil

    import psutil

    data_dir, _ = small_ratings
    broken = tmp_path / "broken"
    shutil.copytree(data_dir, broken)
    # A part that matches its checksum but is not a minibatch: it passes the preflight
    # check, and the worker that reads it fails.
    (broken / part_key("train", 5)).write_bytes(b"not an npz archive")
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["train"]["parts"][5]["sha256"] = hashlib.sha256(b"not an npz archive").hexdigest()
    (broken / "manifest.json").write_text(json.dumps(manifest))
    spec = engine_spec(str(broken), tmp_path / "out", workers=2)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(
        JobFailed,
        match=r"worker \d failed after step \d+: EngineError: dataset part "
        r"train/part-000005 cannot be read as a minibatch",
    ) as failed:
        run_local(spec)
    report = failed.value.report
    assert report["status"] == "failed" and report["error"] == str(failed.value)
    assert report["steps"] >= 1 and len(report["history"]) == report["steps"]  # what it did before is kept
    leftover = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert leftover == []


def test_target_val_stops_when_the_held_out_metric_is_reached(small_ratings, redis_url, tmp_path):
    data_dir, _ = small_ratings
    spec = engine_spec(
        data_dir,
        tmp_path,
        workers=2,
        redis_urls=[redis_url],
        **{"stop.max_epochs": 40, "stop.target_val": 0.9, "stop.eval_every": 5},
    )
    report, _ = run_local(spec)
    hit = report["time_to_target_val"]
    assert report["status"] == "converged" and hit["metric"] == "rmse" and hit["value"] <= 0.9
    # The data has no validation split: the test split stands in (and says so in the history).
    scored = [h for h in report["history"] if "test" in h]
    assert [h["step"] % 5 for h in scored] == [4] * len(scored)
    assert all(h["test"] > 0.9 for h in scored[:-1]) and scored[-1]["test"] == hit["value"]
    assert hit["seconds_excluding_eval"] <= hit["time"]
    assert report["steps"] <= hit["step"] + 3  # stopped right after it was reported


def test_child_setup_runs_first_in_every_worker_process(small_ratings, tmp_path):
    """The launcher's hook (a benchmark's way to put a worker behind a shaped link) runs in
    each worker's own process, once, before the worker trains; a lone worker is then a process too."""
    import os

    data_dir, _ = small_ratings
    marks = tmp_path / "marks"
    marks.mkdir()

    def setup(worker: int) -> None:
        (marks / f"worker-{worker}").write_text(str(os.getpid()))

    spec = engine_spec(data_dir, tmp_path / "out", workers=1, **{"stop.max_epochs": 0.5})
    report, _ = run_local(spec, child_setup=setup)
    assert report["status"] == "max_epochs"
    pids = {p.name: int(p.read_text()) for p in marks.iterdir()}
    assert set(pids) == {"worker-0"}
    assert pids["worker-0"] != os.getpid()
