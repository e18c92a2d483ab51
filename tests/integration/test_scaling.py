"""Scaling in the running engine: eviction with replica averaging, min_workers,
scale-out joins, re-striping, and the budget stop."""

from __future__ import annotations

import pytest
import torch

from ebb.autotune.policies import ScaleDecision
from ebb.data.format import decode_batch
from ebb.engine.worker import Worker
from ebb.local.runner import run_local
from ebb.ports.keys import replica_blob
from ebb.ports.manifest import load_manifest
from ebb.spec import load_spec
from ebb.stores.local import FolderObjectStore
from tests.helpers.engine import RecordingChannel


class ScriptedPolicy:
    """Evicts (or joins) ``count`` workers at the given steps; nothing else."""

    name = "scripted"

    def __init__(self, at_steps: dict[int, ScaleDecision]):
        self.at_steps = at_steps

    def observe(self, seen):
        pass

    def decide(self, step, elapsed_s, workers, epoch):
        return self.at_steps.get(step)

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class AveragingProbe(Worker):
    """Records its replica right before and after it folds a leaver's replica in."""

    snapshots: dict[int, dict] = {}

    def _act_on(self, directive, k):
        before = {n: p.clone() for n, p in self.model.params.items()}
        outcome = super()._act_on(directive, k)
        if directive.evict and self.me not in directive.evict:
            (left,) = directive.evict
            AveragingProbe.snapshots[self.me] = {
                "before": before,
                "after": {n: p.clone() for n, p in self.model.params.items()},
                "step": k,
                "leaver": decode_batch(self.updates.get_blob(replica_blob(left, k))),
            }
        return outcome


def _run_threads(spec, data_dir, policy, worker_cls=Worker):
    signals = RecordingChannel()
    report, replica = run_local(spec, in_process=True, policy=policy, worker_cls=worker_cls, signals=signals)
    return report, replica, signals


def _spec(data_dir, tmp_path, **fields):
    base = {
        "model": "pmf",
        "data": data_dir,
        "out": str(tmp_path),
        "seed": 2,
        "hyper.rank": 4,
        "stop.max_epochs": 3,
        "scaling.policy": "autotune",
    }
    base.update(fields)
    return load_spec(overrides=base)


def test_eviction_folds_the_leavers_replica_in_so_unsent_updates_survive(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    # A threshold so high nothing is ever significant: every update stays pending locally.
    spec = _spec(data_dir, tmp_path, workers=3, **{"sync.mode": "isp", "sync.significance": 1e9})
    AveragingProbe.snapshots = {}
    report, _, signals = _run_threads(
        spec, data_dir, ScriptedPolicy({6: ScaleDecision("evict", 1, "test")}), AveragingProbe
    )
    evicted = report["scale_events"][0]["worker"]
    left = signals.ends("evicted")
    assert [m.worker for m in left] == [evicted]
    assert left[0].pending_nnz > 0, "the leaver had unsent updates"
    for snap in AveragingProbe.snapshots.values():
        assert snap["step"] == report["scale_events"][0]["applied_at"]
        for name, before in snap["before"].items():
            expected = (before + torch.from_numpy(snap["leaver"][name])) * 0.5
            torch.testing.assert_close(snap["after"][name], expected, rtol=0, atol=0)
    assert sorted(AveragingProbe.snapshots) == sorted(set(range(3)) - {evicted})
    assert report["workers"]["final"] == 2 and report["status"] == "max_epochs"


def test_eviction_picks_the_worker_with_the_highest_recent_loss(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    spec = _spec(data_dir, tmp_path, workers=4, **{"sync.mode": "bsp"})
    report, _, signals = _run_threads(spec, data_dir, ScriptedPolicy({8: ScaleDecision("evict", 1, "test")}))
    event = report["scale_events"][0]
    recent = event_losses(signals.steps(), 8)
    assert event["worker"] == max(recent, key=recent.get)
    assert event["recent_loss"] == pytest.approx(max(recent.values()), rel=1e-9)
    assert len(set(recent.values())) == 4, "the workers' recent losses differ, so the choice means something"


def event_losses(steps, upto):
    """Per-worker EWMA of batch RMSE up to a step, as the supervisor computes it."""
    out: dict[int, float] = {}
    for m in steps:
        if m.step <= upto:
            v = (m.loss_sum / m.samples) ** 0.5
            out[m.worker] = v if m.worker not in out else 0.3 * v + 0.7 * out[m.worker]
    return out


def test_no_eviction_below_min_workers(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    spec = _spec(data_dir, tmp_path, workers=4, **{"sync.mode": "isp", "scaling.min_workers": 2})
    policy = ScriptedPolicy({s: ScaleDecision("evict", 3, "greedy") for s in (3, 5, 7, 9)})
    report, *_ = _run_threads(spec, data_dir, policy)
    assert report["workers"]["final"] == 2
    assert len(report["scale_events"]) == 2
    assert all(h["workers"] >= 2 for h in report["history"])


def test_restriping_visits_every_minibatch_once_per_epoch_across_evictions(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    spec = _spec(data_dir, tmp_path, workers=4, **{"sync.mode": "isp", "stop.max_epochs": 4})
    policy = ScriptedPolicy({4: ScaleDecision("evict", 1, "a"), 9: ScaleDecision("evict", 1, "b")})
    report, _, signals = _run_threads(spec, data_dir, policy)
    positions = sorted(m.position for m in signals.steps() if m.step < report["steps"])
    assert positions == list(range(len(positions)))
    n = len(load_manifest(FolderObjectStore(data_dir)).train.parts)
    from ebb.engine.striping import PartSequence

    seq = PartSequence(n, spec.seed)
    for epoch in range(len(positions) // n):
        assert sorted(seq.part_at(p) for p in range(epoch * n, (epoch + 1) * n)) == list(range(n))
    assert [h["workers"] for h in report["history"]][-1] == 2


class LearningRateProbe(Worker):
    """Records the learning rate each step ran with, and the fleet it ran in."""

    seen: list[tuple[int, int, float]] = []

    def _compute_and_publish(self):
        super()._compute_and_publish()
        LearningRateProbe.seen.append((self.step, len(self.members), self.model.optimizer.lr))


@pytest.mark.parametrize("scale_lr", [True, False])
def test_learning_rate_scales_with_the_fleet_below_its_initial_size(small_ratings, tmp_path, scale_lr):
    data_dir, _ = small_ratings
    spec = _spec(
        data_dir,
        tmp_path,
        workers=4,
        **{"sync.mode": "bsp", "stop.max_epochs": 2, "hyper.lr_decay": 1.0, "scaling.scale_lr": scale_lr},
    )
    LearningRateProbe.seen = []
    policy = ScriptedPolicy({3: ScaleDecision("evict", 1, "a"), 6: ScaleDecision("evict", 1, "b")})
    report, *_ = _run_threads(spec, data_dir, policy, LearningRateProbe)
    assert [h["workers"] for h in report["history"]][-1] == 2
    base = spec.hyper.lr
    by_fleet = {fleet: sorted({lr for _, f, lr in LearningRateProbe.seen if f == fleet}) for fleet in (4, 3, 2)}
    # Linear scaling rule: p/P of the base rate (or the base rate throughout when off).
    want = {p: base * p / 4 if scale_lr else base for p in (4, 3, 2)}
    assert by_fleet == {p: [pytest.approx(lr, rel=1e-12)] for p, lr in want.items()}


def test_schedule_scales_out_at_an_epoch_boundary_without_breaking_the_barrier(small_ratings, tmp_path):
    """Real processes over Redis: a third worker joins after epoch 1 by copying a replica."""
    data_dir, _ = small_ratings
    spec = load_spec(
        overrides={
            "model": "pmf",
            "data": data_dir,
            "out": str(tmp_path),
            "workers": 2,
            "seed": 4,
            "hyper.rank": 4,
            "stop.max_epochs": 3,
            "sync.mode": "isp",
            "scaling.policy": "schedule",
            "scaling.schedule": [{"epoch": 1, "workers": 3}],
        }
    )
    report, _ = run_local(spec)
    joins = [e for e in report["scale_events"] if e["action"] == "join"]
    assert len(joins) == 1 and joins[0]["worker"] == 2
    assert report["status"] == "max_epochs" and report["workers"]["final"] == 3
    workers = [h["workers"] for h in report["history"]]
    assert workers[0] == 2 and workers[-1] == 3 and workers == sorted(workers)
    join_step = joins[0]["step"]
    assert report["history"][join_step]["epoch"] >= 1 > report["history"][join_step - 1]["epoch"]
    assert report["history"][-1]["loss"] < report["history"][0]["loss"]


def test_budget_stop_triggers_before_the_budget(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    spec = _spec(
        data_dir, tmp_path, workers=2, **{"sync.mode": "isp", "stop.max_epochs": 1000, "scaling.policy": "none"}
    )
    # Price a short probe run to set a budget a few steps' worth above the fixed costs.
    probe = _spec(
        data_dir, tmp_path / "probe", workers=2, **{"sync.mode": "isp", "stop.max_epochs": 1, "scaling.policy": "none"}
    )
    probe_report, *_ = _run_threads(probe, data_dir, None)
    per_step = probe_report["cost"]["total_usd"] / probe_report["steps"]
    spec.stop.budget_usd = per_step * 3 * probe_report["steps"]
    report, *_ = _run_threads(spec, data_dir, None)
    assert report["status"] == "budget"
    assert report["cost"]["total_usd"] <= spec.stop.budget_usd
    assert all(h["cost_usd"] <= spec.stop.budget_usd for h in report["history"])
    wall, usd = report["wall_seconds"], report["cost"]["total_usd"]
    assert report["perf_per_dollar"] == pytest.approx(1 / (wall * usd), rel=1e-9)
