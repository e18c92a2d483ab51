"""The fleet clock: its arithmetic on fixed measures, the SSP run-ahead rule, and a real
local run (redis-server, worker processes) that runs its control loop on it."""

from __future__ import annotations

import math

import pytest

from ebb.engine.fleet_clock import FleetTimeline, Links, WorkerStep, barrier_step_seconds, worker_seconds
from ebb.spec import SpecError, load_spec

LINKS = Links(link_mb_s=50.0, rtt_ms=0.5, node_mb_s=100.0, cold_start_s=2.0, barrier_ms=0.0)


def test_a_workers_step_is_cpu_plus_bytes_over_its_link_plus_round_trips():
    # 0.2 s CPU + (3 MB + 2 MB) / 50 MB/s = 0.1 s + 4 requests × 0.5 ms = 2 ms
    w = WorkerStep(cpu_s=0.2, sent_bytes=3_000_000, read_bytes=2_000_000, requests=4)
    assert worker_seconds(w, LINKS) == pytest.approx(0.302)


def test_the_cpu_spent_moving_bytes_overlaps_the_wire_time():
    # 0.2 s CPU, of which 0.03 s inside the update store's calls, while 5 MB take 0.1 s on the wire
    w = WorkerStep(cpu_s=0.2, sent_bytes=3_000_000, read_bytes=2_000_000, requests=4, io_cpu_s=0.03)
    assert worker_seconds(w, LINKS) == pytest.approx(0.17 + 0.1 + 0.002)
    # I/O CPU longer than the wire (a fast link): the CPU is the bound, nothing is added
    fast = Links(link_mb_s=1000.0, rtt_ms=0.0, barrier_ms=0.0)
    assert worker_seconds(w, fast) == pytest.approx(0.2)
    # io_cpu_s is a part of cpu_s: a report that says more is read as all of it
    assert worker_seconds(WorkerStep(cpu_s=0.01, io_cpu_s=0.5), fast) == pytest.approx(0.01)


def test_a_barrier_step_is_the_release_then_its_slowest_worker_with_the_nodes_phases_in_it():
    a = WorkerStep(cpu_s=0.10, sent_bytes=1_000_000, read_bytes=4_000_000, requests=2)  # 0.1 + 0.1 + 0.001
    b = WorkerStep(cpu_s=0.15, sent_bytes=1_000_000, read_bytes=1_000_000, requests=2)  # 0.15 + 0.04 + 0.001
    assert barrier_step_seconds([a, b], Links(link_mb_s=50.0, rtt_ms=0.5, barrier_ms=0.0)) == pytest.approx(0.201)
    assert barrier_step_seconds([a, b], Links(link_mb_s=50.0, rtt_ms=0.5, barrier_ms=3.0)) == pytest.approx(0.204)
    # The node at 100 MB/s moves the fleet's 5 MB of reads in 0.05 s: no worker's read phase
    # is shorter (b = 0.15 + 0.02 + 0.05 + 0.001: an upper bound for the worker that reads less).
    assert barrier_step_seconds([a, b], LINKS) == pytest.approx(0.221)
    # A node at 10 MB/s: everyone writes 2 MB through it (0.2 s), then reads 5 MB (0.5 s),
    # one phase after the other, each worker's CPU on top: b = 0.15 + 0.2 + 0.5 + 0.001.
    slow_node = Links(link_mb_s=50.0, rtt_ms=0.5, node_mb_s=10.0, barrier_ms=0.0)
    assert barrier_step_seconds([a, b], slow_node) == pytest.approx(0.851)


def test_with_an_infinite_link_and_no_latency_a_step_is_its_busiest_workers_cpu():
    free = Links(link_mb_s=math.inf, rtt_ms=0.0, node_mb_s=math.inf, cold_start_s=0.0, barrier_ms=0.0)
    cpu = [[0.3, 0.1, 0.2], [0.05, 0.4, 0.1], [0.2, 0.2, 0.25]]  # per step, per worker
    line = FleetTimeline(free)
    line.launch(range(3))
    times = [
        line.close(s, {w: WorkerStep(c, 10**9, 10**9, 100) for w, c in enumerate(row)}) for s, row in enumerate(cpu)
    ]
    assert times == pytest.approx([0.3, 0.7, 0.95])
    assert line.worker_seconds == pytest.approx(3 * 0.95)  # three invocations billed for every step


def test_a_barrier_timeline_sums_its_steps_after_one_cold_start():
    line = FleetTimeline(LINKS, time=10.0)  # a later round: 10 s before it
    line.launch([0, 1])
    steps = [
        {0: WorkerStep(0.1, requests=2), 1: WorkerStep(0.3, requests=2)},
        {0: WorkerStep(0.2, requests=2), 1: WorkerStep(0.1, requests=2)},
    ]
    t0 = line.close(5, steps[0])
    t1 = line.close(6, steps[1])
    assert t0 == pytest.approx(10 + 2.0 + 0.301)
    assert t1 == pytest.approx(t0 + 0.201)
    assert line.state_dict() == {"time": t1, "worker_seconds": pytest.approx(2 * (t1 - 10.0))}
    # With a 4 ms release: the wave's first step has no go to wait for, every later one does.
    waits = FleetTimeline(Links(link_mb_s=50.0, rtt_ms=0.5, cold_start_s=2.0, barrier_ms=4.0), time=10.0)
    waits.launch([0, 1])
    assert waits.close(5, steps[0]) == pytest.approx(t0)
    assert waits.close(6, steps[1]) == pytest.approx(t1 + 0.004)


def test_ssp_lets_a_fast_worker_run_ahead_by_slack_steps_and_no_further():
    """Worker 0 takes 1 s a step, worker 1 takes 3 s; slack 1: worker 1 may start step s
    once worker 0 finished s - 2, and worker 0 must wait for worker 1's step s - 2.

    By hand (no cold start, no network): worker 1 finishes steps at 3, 6, 9, 12.
    Worker 0: step 0 ends at 1, step 1 at 2; step 2 needs cleared(0) = 3: ends at 4;
    step 3 needs cleared(1) = 6: ends at 7. cleared = 3, 6, 9, 12.
    With slack 0 (a barrier) worker 0 waits every step: the same cleared times here,
    but its own virtual time trails the slow worker's every step.
    """
    free = Links(link_mb_s=math.inf, rtt_ms=0.0, node_mb_s=math.inf, cold_start_s=0.0, barrier_ms=0.0)
    line = FleetTimeline(free, slack=1)
    line.launch([0, 1])
    cleared, ready0 = [], []
    for s in range(4):
        cleared.append(line.close(s, {0: WorkerStep(1.0), 1: WorkerStep(3.0)}))
        ready0.append(line.ready[0])
    assert cleared == [3.0, 6.0, 9.0, 12.0]
    assert ready0 == [1.0, 2.0, 4.0, 7.0]  # never more than one step ahead of the slowest
    # The fast worker's lead is what lets SSP beat a barrier when the slow one alternates.
    alternating = [
        ({0: WorkerStep(1.0), 1: WorkerStep(3.0)} if s % 2 else {0: WorkerStep(3.0), 1: WorkerStep(1.0)})
        for s in range(4)
    ]
    ssp, bsp = FleetTimeline(free, slack=1), FleetTimeline(free, slack=0)
    for line in (ssp, bsp):
        line.launch([0, 1])
        for s, m in enumerate(alternating):
            line.close(s, m)
    assert bsp.time == 12.0  # 4 × 3 s
    assert ssp.time == 8.0  # each worker 1 + 3 + 1 + 3 s, never blocked by the other


def test_the_clock_section_is_strict_and_the_cli_names_it(tmp_path):
    spec = load_spec(overrides={"data": "d", "clock.kind": "fleet", "clock.link_mb_s": 100.0})
    assert Links.of(spec.clock) == Links(
        link_mb_s=100.0,
        rtt_ms=spec.clock.rtt_ms,
        node_mb_s=spec.clock.node_mb_s,
        cold_start_s=spec.clock.cold_start_s,
        barrier_ms=spec.clock.barrier_ms,
    )
    with pytest.raises(SpecError, match="clock.kind"):
        load_spec(overrides={"data": "d", "clock.kind": "lambda"})
    with pytest.raises(SpecError, match="clock.link_mb_s"):
        load_spec(overrides={"data": "d", "clock.link_mb_s": 0.0})
