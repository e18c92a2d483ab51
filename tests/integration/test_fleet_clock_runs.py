"""Local jobs on the fleet clock (worker processes): the report, the history, replayed runs."""

from __future__ import annotations

import pytest

from ebb.engine.fleet_clock import Links, WorkerStep
from ebb.local.runner import run_local
from ebb.spec import load_spec

LINKS = Links(link_mb_s=50.0, rtt_ms=0.5, node_mb_s=100.0, cold_start_s=2.0, barrier_ms=0.0)


def _fleet_spec(data_dir, out, **fields):
    return load_spec(
        overrides={
            "model": "pmf",
            "data": data_dir,
            "out": str(out),
            "seed": 5,
            "hyper.rank": 6,
            "workers": 2,
            "sync.mode": "bsp",
            "scaling.policy": "none",
            "stop.max_epochs": 1.0,
            "round_steps": 6,
            "clock.kind": "fleet",
            **fields,
        }
    )


def replayed(report) -> WorkerStep:
    """Fixed CPU times per (worker, step, fleet size): what a recorded run would replay; 40 ms
    a peer go into applying the peers' updates."""
    apply = 0.04 * (len(report.members) - 1)
    cpu = 0.02 + apply + 0.01 * report.worker + 0.001 * (report.step % 7)
    return WorkerStep(cpu, report.sent_bytes, report.read_bytes, report.requests, io_cpu_s=0.1 * cpu, apply_cpu_s=apply)


def test_a_local_run_on_the_fleet_clock_reports_it_and_its_history_sums_its_steps(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    spec = _fleet_spec(data_dir, tmp_path / "run")
    seen = []

    def recording(report):
        seen.append(report)
        return WorkerStep.of(report)

    report, _ = run_local(spec, measure_of=recording)
    # Each worker says what part of its CPU went into the update store's calls (it moved bytes: some).
    assert all(0.0 <= r.io_cpu_seconds <= r.cpu_seconds for r in seen)
    assert sum(r.io_cpu_seconds for r in seen) > 0 and all(r.sent_bytes and r.requests for r in seen)
    assert report["clock"]["kind"] == "fleet" and report["clock"]["link_mb_s"] == 75.0
    history = report["history"]
    assert report["rounds"] > 1  # the fleet time survived rounds
    times = [h["time"] for h in history]
    assert all(b > a for a, b in zip(times, times[1:]))
    assert all(h["host_time"] > 0 for h in history)
    # A barrier's fleet time: one cold start per round + each step's slowest worker.
    steps = report["steps"]
    cold = spec.clock.cold_start_s * report["rounds"]
    assert report["wall_seconds"] == pytest.approx(times[-1], abs=1e-3)
    assert times[-1] >= cold
    per_step = [b - a for a, b in zip([0.0] + times, times)]
    assert sum(per_step) == pytest.approx(times[-1])
    assert report["host_seconds"] > 0
    # Billing: two workers for every step's fleet time.
    assert report["totals"]["worker_seconds"] == pytest.approx(2 * times[-1], rel=1e-3)
    assert steps == len(history)


def test_with_replayed_cpu_two_fleet_runs_take_the_same_steps_and_decisions(small_ratings, tmp_path):
    """Host timing differs run to run; with the CPU replayed, everything the control loop
    reads (fleet times, bytes, losses) is the same, so its scaling decisions are too."""
    data_dir, _ = small_ratings
    # A tuner eager to evict (tolerance 1, quick knee, short intervals) so there are decisions to compare.
    fields = {
        "workers": 4,
        "clock.cold_start_s": 0.5,
        "scaling.policy": "autotune",
        "scaling.interval_s": 0.3,
        "scaling.horizon_s": 0.2,
        "scaling.knee_patience": 1,
        "scaling.knee_tolerance": 0.9,
        "scaling.knee_min_drop": 0.0,
        "scaling.tolerance": 1.0,
        "stop.max_epochs": 8,
        "round_steps": 24,
        "hyper.optimizer": "sgd_momentum",  # a loss curve whose knee comes within the run
    }
    runs = [run_local(_fleet_spec(data_dir, tmp_path / f"r{i}", **fields), measure_of=replayed)[0] for i in range(2)]
    a, b = runs
    assert [h["time"] for h in a["history"]] == [h["time"] for h in b["history"]]
    # (cost_usd at a step may differ by a checkpoint PUT: a worker's end report is counted
    # when it arrives, before or after the step that closes with it.)
    strip = [{k: v for k, v in h.items() if k not in ("host_time", "cost_usd")} for h in a["history"]]
    assert strip == [{k: v for k, v in h.items() if k not in ("host_time", "cost_usd")} for h in b["history"]]
    assert a["rounds"] > 1 and [e["action"] for e in a["scale_events"]].count("evict") >= 1
    assert a["scale_events"] == b["scale_events"] and a["autotune"] == b["autotune"]
    assert a["wall_seconds"] == b["wall_seconds"] and a["cost"] == b["cost"]
