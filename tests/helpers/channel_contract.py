"""The signal channel contract, shared by the tests of every channel implementation."""

from __future__ import annotations

import time

import pytest

from ebb.ports.messages import Directive, StepReport


def make_report(w, t, sent, at, members=(0, 1, 2), **extra) -> StepReport:
    return StepReport(
        worker=w,
        step=t,
        members=list(members),
        loss_sum=1.0,
        samples=1,
        empty=not sent,
        sent_bytes=100 if sent else 0,
        sent_nnz=0,
        local_nnz=0,
        read_bytes=0,
        applied_upto=t - 1,
        position=0,
        cpu_seconds=0.0,
        sent_at=at,
        **extra,
    )


def announce(ch, w, t, sent, at, members=(0, 1, 2), **extra):
    ch.report(make_report(w, t, sent, at, members, **extra))


def read_until(ch, seen: list, step: int, n: int, timeout: float = 5.0) -> None:
    """The supervisor's loop: read reports until ``n`` of ``step`` are in ``seen``."""
    deadline = time.monotonic() + timeout
    while sum(r.step == step for r in seen) < n:
        assert time.monotonic() < deadline, f"only {sum(r.step == step for r in seen)} reports of step {step}"
        seen += ch.next_reports(0.5)


def drain(ch) -> list:
    seen = []
    while batch := ch.next_reports(0.2):
        seen += batch
    return seen


def barrier_contract(ch) -> None:
    """The contract of ``SignalChannel.release``, as the supervisor and workers use it:
    the last announcement or a late release opens the barrier, whichever comes second."""
    now = time.time()
    seen: list = []
    # Released ahead (the supervisor keeps up): nothing moves until the last of 3 announces.
    assert ch.release(0, [0, 1, 2], Directive(step=0)) is False
    announce(ch, 2, 0, True, now + 0.5)
    announce(ch, 0, 0, False, now + 0.25)
    seen += ch.next_reports(0.2)  # the supervisor reads whatever is there
    assert ch.next_directive(1, 0) is None and ch.next_directive(0, 0) is None
    announce(ch, 1, 0, True, now + 0.75)
    read_until(ch, seen, step=0, n=3)
    got = [ch.next_directive(w, 1.0) for w in range(3)]
    assert all(d == got[0] for d in got)
    assert got[0].step == 0 and got[0].senders == [1, 2]
    assert got[0].last_sent_at == pytest.approx(now + 0.75, abs=1e-6)  # wall time survives the trip exactly
    assert got[0].evict == [] and got[0].stop is False
    # Released late (the step is complete already): delivered at once, nobody sent anything.
    for w in range(3):
        announce(ch, w, 1, False, now + 1 + w)
    read_until(ch, seen, step=1, n=3)
    assert ch.next_directive(0, 0) is None
    assert ch.release(1, [0, 1, 2], Directive(step=1, stop=True)) is True
    late = ch.next_directive(2, 1.0)
    assert late.step == 1 and late.stop is True and late.senders == []
    assert late.last_sent_at == pytest.approx(now + 3, abs=1e-6)
    # Every step report reaches the supervisor too, once.
    seen += drain(ch)
    assert sorted((r.step, r.worker) for r in seen) == [(t, w) for t in (0, 1) for w in range(3)]
