"""The pause-adjusted clock (ebb.engine.pauses): a heartbeat's age leaves out the time the
judge itself was not running, and nothing else."""

from __future__ import annotations

from ebb.engine import pauses
from ebb.engine.failures import lost_workers
from ebb.engine.pauses import PauseClock
from ebb.spec import FaultSpec


class _Wall:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _started(wall: _Wall) -> PauseClock:
    clock = PauseClock(now=wall)
    clock._thread = object()  # type: ignore[assignment]  # counts pauses as if its thread ran; no thread
    return clock


def _run(clock: PauseClock, wall: _Wall, seconds: float) -> None:
    """Time passes with the clock's thread ticking as it does."""
    for _ in range(round(seconds / pauses.TICK_S)):
        wall.t += pauses.TICK_S
        clock.tick()


def test_a_gap_between_ticks_is_a_pause_and_only_it_is_left_out():
    wall = _Wall()
    clock = _started(wall)
    beat = wall.t - 0.5  # a worker's heartbeat, half a second before the lid closed
    _run(clock, wall, 1.0)  # ticking as usual: no pause
    assert clock.pauses == [] and clock.age(beat) == 1.5
    wall.t += 20  # suspended
    assert clock.age(beat) == 1.5  # whoever asks first notices the pause
    assert clock.pauses == [(1001.0, 1021.0)]
    _run(clock, wall, 3.0)  # awake, and the worker still silent: that counts
    assert clock.age(beat) == 4.5
    assert clock.age(wall.t - 2) == 2  # a heartbeat written after the pause: plain age


def test_no_pause_is_counted_before_the_clock_is_started():
    wall = _Wall()
    clock = PauseClock(now=wall)
    wall.t += 30
    assert clock.age(wall.t - 30) == 30 and clock.pauses == []


def test_the_supervisor_judges_workers_on_its_own_running_time():
    wall = _Wall()
    clock = _started(wall)
    faults = FaultSpec(worker_timeout_s=3)
    beats = {0: wall.t - 0.2, 1: wall.t - 0.2}
    wall.t += 20  # the whole job suspended 20 s
    judge = dict(exited={}, faults=faults, round_elapsed=60, stalled_s=20, heartbeats=lambda ws: beats)
    assert lost_workers([0, 1], **judge, age=clock.age) == {}
    # The same heartbeats on wall time (what it did before): everyone "went silent".
    assert lost_workers([0, 1], **judge, age=lambda t: wall.t - t) == {
        0: "went silent (no heartbeat for 20 s)",
        1: "went silent (no heartbeat for 20 s)",
    }
    # Worker 1 alone stays silent after the pause: it is lost once its running silence is past the timeout.
    _run(clock, wall, 3.0)
    beats[0] = wall.t - 0.5
    assert lost_workers([0, 1], **judge, age=clock.age) == {1: "went silent (no heartbeat for 3 s)"}


def test_a_started_clock_ticks_from_its_own_thread():
    clock = PauseClock().start()
    try:
        assert clock._thread is not None and clock._thread.is_alive()
    finally:
        clock.stop()
    assert clock._thread is None
