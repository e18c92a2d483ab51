"""The distributed engine over a real redis-server: sync models, the filter, the store."""

from __future__ import annotations

import time

import pytest
import torch

from ebb.engine.isp import SignificanceFilter
from ebb.engine.parts import PartCache, batch_nbytes
from ebb.engine.striping import PartSequence, position_of
from ebb.engine.worker import Worker
from ebb.local.runner import run_local
from ebb.models import build_model
from ebb.ports.manifest import load_manifest
from ebb.sparse import RowUpdate
from ebb.spec import load_spec
from ebb.stores.local import FolderObjectStore
from tests.helpers.engine import RecordingChannel, engine_spec


def test_row_update_codec_round_trips():
    upd = RowUpdate(
        {
            "user": (torch.tensor([3, 9, 1]), torch.randn(3, 5)),
            "bias": (torch.tensor([0]), torch.randn(1, 1)),
            "none": (torch.tensor([], dtype=torch.int64), torch.zeros(0, 4)),
        }
    )
    raw = upd.encode()
    assert len(raw) == upd.nbytes()
    back = RowUpdate.decode(raw)
    for name, (idx, vals) in upd.rows.items():
        assert torch.equal(back.rows[name][0], idx)
        assert torch.equal(back.rows[name][1], vals)
    with pytest.raises(ValueError, match="not an Ebb update"):
        RowUpdate.decode(b"pickle" + raw)


def test_filter_accumulators_lose_nothing():
    torch.manual_seed(0)
    params = {"w": torch.randn(50, 4)}
    filt = SignificanceFilter(params, threshold=0.5)
    total = torch.zeros(50, 4)
    sent_sum = torch.zeros(50, 4)
    sent_rows = touched_rows = 0
    for step in range(200):
        rows = torch.unique(torch.randint(0, 50, (12,)))
        vals = 0.05 * torch.randn(rows.numel(), 4)
        total.index_add_(0, rows, vals)
        sent = filt(RowUpdate({"w": (rows, vals)}), params, step)
        idx, sv = sent.rows["w"]
        assert set(idx.tolist()) <= set(rows.tolist()), "the filter only sends rows the step touched"
        sent_sum.index_add_(0, idx, sv)
        sent_rows += idx.numel()
        touched_rows += rows.numel()
    torch.testing.assert_close(sent_sum + filt.pending["w"], total, rtol=0, atol=1e-5)
    assert 0 < sent_rows < touched_rows  # it filtered something and sent something
    flushed = filt.flush()
    torch.testing.assert_close(sent_sum.index_add(0, *flushed.rows["w"]), total, rtol=0, atol=1e-5)
    assert filt.pending_nnz() == 0


def test_filter_threshold_decays_and_zero_sends_every_touched_row():
    params = {"w": torch.ones(4, 2)}
    filt = SignificanceFilter(params, threshold=0.0)
    upd = RowUpdate({"w": (torch.tensor([0, 2, 3]), torch.tensor([[1e-9, 0], [0.0, 0.0], [-1e-7, 1e-7]]))})
    assert filt(upd, params, step=5).rows["w"][0].tolist() == [0, 2, 3]
    strict = SignificanceFilter(params, threshold=1e-8)
    assert strict(upd, params, step=0).rows["w"][0].tolist() == [3]
    assert SignificanceFilter(params, 0.7).threshold_at(3) == pytest.approx(0.35)


class _SlowWorkerZero(Worker):
    def _compute_and_publish(self):
        if self.me == 0:
            time.sleep(0.015)  # long enough that the others reach their slack even on a loaded machine
        super()._compute_and_publish()


def test_ssp_never_lets_a_worker_run_more_than_slack_ahead(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    slack = 2
    spec = engine_spec(data_dir, tmp_path, workers=3, **{"sync.mode": "ssp", "sync.slack": slack, "stop.max_epochs": 4})
    signals = RecordingChannel()
    report, _ = run_local(spec, in_process=True, worker_cls=_SlowWorkerZero, signals=signals)
    leads = [m.step - 1 - m.applied_upto for m in signals.steps()]  # steps not yet applied from everyone
    assert max(leads) == slack, "fast workers used their slack"
    assert all(lead <= slack for lead in leads)
    assert report["status"] == "max_epochs"


def test_striping_visits_every_part_once_per_epoch_across_membership_changes():
    seq = PartSequence(num_parts=23, seed=4)
    members_by_step = [list(range(8))] * 3 + [[0, 1, 2, 4, 5, 6, 7]] * 5 + [[1, 2, 4, 6]] * 20
    cursor, positions = 0, []
    for members in members_by_step:
        positions += [position_of(cursor, members, w) for w in members]
        cursor += len(members)
    assert positions == list(range(cursor))  # no gap, no repeat
    for epoch in range(cursor // 23):
        parts = [seq.part_at(p) for p in range(epoch * 23, (epoch + 1) * 23)]
        assert sorted(parts) == list(range(23))
    assert [seq.part_at(p) for p in range(23)] != [seq.part_at(p) for p in range(23, 46)]  # reshuffled


def test_row_mean_averages_each_row_over_its_contributors():
    from ebb.engine.aggregate import RowMean

    params = {"w": torch.zeros(8, 1), "b": torch.zeros(2, 1)}
    mean = RowMean(params)
    a = RowUpdate({"w": (torch.tensor([0, 1]), torch.tensor([[2.0], [4.0]]))})
    b = RowUpdate(
        {"w": (torch.tensor([1, 5]), torch.tensor([[6.0], [1.0]])), "b": (torch.tensor([0]), torch.tensor([[3.0]]))}
    )
    for times in (1, 2):  # the counts are clean again after each step
        mean.apply(params, [a, b])
        assert params["w"][:, 0].tolist() == [2.0 * times, 5.0 * times, 0, 0, 0, 1.0 * times, 0, 0]
        assert params["b"][0].item() == 3.0 * times
    mean.apply(params, [a], scale=-2.0)  # one contributor: its own values
    assert params["w"][:2, 0].tolist() == [0.0, 2.0]


def test_row_mean_divides_by_the_workers_that_touched_a_row_under_isp():
    from ebb.engine.aggregate import RowMean

    own = RowUpdate({"w": (torch.tensor([0, 1]), torch.tensor([[2.0, 1.0], [4.0, 1.0]]))})
    # The other worker touched rows 1, 3 and 7 but only row 7 and one entry of row 3 were significant.
    other_sent = RowUpdate(
        {"w": (torch.tensor([3, 7]), torch.tensor([[0.0, 5.0], [6.0, 6.0]]))}, touched={"w": torch.tensor([1, 3, 7])}
    )
    received = RowUpdate.decode(other_sent.encode())
    assert torch.equal(received.touched["w"], torch.tensor([1, 3, 7]))
    params = {"w": torch.zeros(9, 2)}
    RowMean(params).apply(params, [own, received])
    # Row 1: touched by both, only our update arrived -> halved, as BSP's divisor would be.
    assert params["w"][[0, 1, 3, 7]].tolist() == [[2.0, 1.0], [2.0, 0.5], [0.0, 5.0], [6.0, 6.0]]
    assert params["w"][[2, 4, 5, 6, 8]].abs().sum() == 0


def test_row_sum_adds_every_contribution_undivided_in_order():
    """sync.combine sum: each worker's proposal lands whole, as if the workers had taken
    their steps one after another (sparse LR's default: Adam proposals are normalised steps)."""
    from ebb.engine.aggregate import RowMean

    own = RowUpdate({"w": (torch.tensor([0, 1]), torch.tensor([[2.0, 1.0], [4.0, 1.0]]))})
    other_sent = RowUpdate(
        {"w": (torch.tensor([1, 3]), torch.tensor([[0.0, 5.0], [6.0, 6.0]]))}, touched={"w": torch.tensor([1, 3, 7])}
    )
    received = RowUpdate.decode(other_sent.encode())  # masked rows travel as single entries
    params = {"w": torch.zeros(9, 2)}
    summed = RowMean(params, "sum")
    summed.apply(params, [own, received])
    assert params["w"][[0, 1, 3]].tolist() == [[2.0, 1.0], [4.0, 6.0], [6.0, 6.0]]
    assert params["w"][[2, 4, 5, 6, 7, 8]].abs().sum() == 0
    summed.apply(params, [own], scale=-1.0)
    assert params["w"][[0, 1]].tolist() == [[0.0, 0.0], [0.0, 5.0]]
    with pytest.raises(ValueError):
        RowMean(params, "median")


def test_row_sum_is_capped_for_rows_more_workers_touched_than_the_cap():
    """sync.sum_cap: past the cap's touchers a row moves by cap × their mean; rows fewer
    touched, and any step of no more contributions than the cap, are summed whole."""
    from ebb.engine.aggregate import RowMean

    def update(rows, value, touched=None):
        rows = torch.tensor(rows)
        return RowUpdate(
            {"w": (rows, torch.full((len(rows), 2), value))},
            touched=None if touched is None else {"w": torch.tensor(touched)},
        )

    # Row 0: all 4 touch it. Row 1: two. Row 2: one. Row 3: the last worker touched it
    # but its change stayed pending under ISP: it still counts as a toucher.
    contributions = [
        update([0, 1], 1.0),
        update([0, 1], 2.0),
        update([0, 2], 3.0),
        RowUpdate.decode(update([0], 4.0, touched=[0, 3]).encode()),
    ]
    params = {"w": torch.zeros(4, 2)}
    RowMean(params, "sum", sum_cap=2).apply(params, contributions)
    assert params["w"][:, 0].tolist() == [2 * (1 + 2 + 3 + 4) / 4, 1 + 2, 3, 0]

    uncapped, capped = {"w": torch.zeros(4, 2)}, {"w": torch.zeros(4, 2)}
    RowMean(uncapped, "sum").apply(uncapped, contributions)
    RowMean(capped, "sum", sum_cap=4).apply(capped, contributions)  # 4 contributions: nothing to cap
    assert torch.equal(uncapped["w"], capped["w"]) and uncapped["w"][0, 0] == 10
    one = {"w": torch.zeros(4, 2)}
    RowMean(one, "sum", sum_cap=1).apply(one, contributions)  # a cap of 1 is the mean
    mean = {"w": torch.zeros(4, 2)}
    RowMean(mean, "mean").apply(mean, contributions)
    assert torch.equal(one["w"], mean["w"])
    with pytest.raises(ValueError):
        RowMean(params, "sum", sum_cap=0)


def test_default_scoring_cadence_is_one_workers_epoch_of_progress():
    """With a validation split, scorings are an epoch at one worker's pace apart, so
    patience_evals means the same at any fleet: under the mean (PMF) a step moves a row
    about one worker's step, so num_parts steps; under the sum (sparse LR) an epoch."""
    from ebb.engine.cadence import one_worker_epoch
    from ebb.spec import load_spec

    def spec(model, workers):
        return load_spec(overrides={"model": model, "data": "d", "workers": workers})

    assert [one_worker_epoch(spec("pmf", p), 81) for p in (1, 4)] == [81, 81]
    assert [one_worker_epoch(spec("sparse_lr", p), 81) for p in (1, 4)] == [81, 21]
    assert spec("pmf", 4).sync.combine == "mean" and spec("sparse_lr", 4).sync.combine == "sum"


def test_codec_masks_unsent_entries_and_packs_sorted_indices():
    from ebb.sparse import apply_update

    rows = torch.arange(0, 2000, 2)
    dense = RowUpdate({"u": (rows, torch.randn(1000, 16))})
    masked_vals = dense.rows["u"][1].clone()
    masked_vals[:, 1:] = 0.0  # one significant entry per row
    masked = RowUpdate({"u": (rows, masked_vals), "b": (rows, torch.randn(1000, 1))}, touched={"u": rows, "b": rows})
    assert len(dense.encode()) < 1000 * 16 * 4 + 300  # sorted indices: a bitmap of 250 bytes
    # Two mask bytes and one value per row; the bias and the touched rows share one index list.
    assert len(masked.encode()) < 1000 * (2 + 4 + 4) + 3 * 300
    back = RowUpdate.decode(dense.encode())
    assert torch.equal(back.rows["u"][0], rows) and torch.equal(back.rows["u"][1], dense.rows["u"][1])
    back = RowUpdate.decode(masked.encode())
    assert set(back.elements) == {"u"} and back.elements["u"][2].numel() == 1000  # carried as single entries
    assert back.nnz() == masked.nnz() == 2000 and torch.equal(back.touched["b"], rows)
    got, want = (
        {"u": torch.zeros(2000, 16), "b": torch.zeros(2000, 1)},
        {"u": torch.zeros(2000, 16), "b": torch.zeros(2000, 1)},
    )
    apply_update(got, back)
    apply_update(want, masked)
    assert all(torch.equal(got[n], want[n]) for n in got)
    for idx in ([9, 2, 5], [0, 70_000], [4], list(range(0, 300_000, 3))):  # unsorted, far apart, alone, gaps
        upd = RowUpdate({"u": (torch.tensor(idx), torch.randn(len(idx), 1))})
        assert torch.equal(RowUpdate.decode(upd.encode()).rows["u"][0], torch.tensor(idx))


def test_quantized_filter_sends_exact_wire_values_and_keeps_the_rounding_pending():
    torch.manual_seed(1)
    params = {"w": torch.randn(60, 8), "b": torch.randn(60, 1)}
    filt = SignificanceFilter(params, threshold=0.5, quantize=True)
    plain = SignificanceFilter(params, threshold=0.5)
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    received = {n: torch.zeros_like(p) for n, p in params.items()}
    q_bytes = f_bytes = 0
    for step in range(150):
        rows = torch.unique(torch.randint(0, 60, (15,)))
        upd = RowUpdate(
            {"w": (rows, 0.05 * torch.randn(rows.numel(), 8)), "b": (rows, 0.05 * torch.randn(rows.numel(), 1))}
        )
        for n, (r, v) in upd.rows.items():
            total[n].index_add_(0, r, v)
        sent = filt(upd, params, step)
        wire = sent.encode()
        back = RowUpdate.decode(wire)
        for n, (r, v) in sent.rows.items():  # what travels is bit for bit what the sender accounted for
            if r.numel():
                got = torch.zeros_like(params[n])
                from ebb.sparse import apply_update

                apply_update(
                    {n: got},
                    RowUpdate({n: back.rows[n]}) if n in back.rows else RowUpdate(elements={n: back.elements[n]}),
                )
                want = torch.zeros_like(params[n]).index_add_(0, r, v)
                assert torch.equal(got, want)
                received[n] += got
        q_bytes += len(wire)
        f_bytes += len(plain(upd, params, step).encode())
    for n in params:  # nothing lost: received + pending = every local update
        torch.testing.assert_close(received[n] + filt.pending[n], total[n], rtol=0, atol=1e-6)
    assert 0 < q_bytes < 0.6 * f_bytes


def test_codec_sends_a_subset_of_touched_rows_as_one_bit_per_touched_row():
    touched = torch.arange(0, 60_000, 7)  # sparse enough that its own bitmap is large
    sub = touched[::3]
    vals = torch.randn(sub.numel(), 4)
    upd = RowUpdate({"u": (sub, vals), "b": (sub, torch.randn(sub.numel(), 1))}, touched={"u": touched, "b": touched})
    raw = upd.encode()
    index_bytes = len(raw) - sub.numel() * 5 * 4
    assert index_bytes < 60_000 // 8 + touched.numel() // 8 + 200  # touched bitmap + one subset bitmap + header
    back = RowUpdate.decode(raw)
    assert torch.equal(back.rows["u"][0], sub) and torch.equal(back.rows["u"][1], vals)
    assert back.rows["b"][0] is back.rows["u"][0] and back.touched["b"] is back.touched["u"]
    unsorted = torch.tensor([14, 7, 0])  # not a sorted subset: carried as its own index, order kept
    odd = RowUpdate({"u": (unsorted, torch.randn(3, 4))}, touched={"u": touched})
    assert torch.equal(RowUpdate.decode(odd.encode()).rows["u"][0], unsorted)


def test_the_part_cache_holds_at_most_its_byte_budget_dropping_the_oldest(small_logistic):
    # Workers visit every part in time (re-striped each epoch): a count bound let each
    # worker keep the whole converted dataset.
    store = FolderObjectStore(small_logistic[0])
    manifest = load_manifest(store)
    model = build_model("sparse_lr", manifest, load_spec(overrides={"model": "sparse_lr", "data": "x"}).hyper, 0)
    part = PartCache(store, manifest, model, max_bytes=0).get(0)
    size = batch_nbytes(part)
    assert size >= 1000 * 10 * 4  # 1,000 rows of 10 values: at least their float32 values
    cache = PartCache(store, manifest, model, max_bytes=2 * size + size // 2)
    parts = len(manifest.train.parts)
    assert parts >= 4
    for i in range(parts):
        cache.get(i)
    assert cache.held_bytes <= cache.max_bytes and cache.gets == parts
    cache.get(parts - 1)  # the newest is held: no read
    assert cache.gets == parts
    cache.get(0)  # the oldest went: read again
    assert cache.gets == parts + 1
    assert PartCache(store, manifest, model, max_bytes=0).held_bytes == 0


def test_a_workers_part_cache_budget_defaults_to_a_quarter_of_its_memory():
    spec = load_spec(overrides={"model": "pmf", "data": "x", "aws.memory_mb": 2048})
    assert spec.aws.part_cache_bytes() == 512 << 20
    assert load_spec(overrides={"model": "pmf", "data": "x", "aws.part_cache_mb": 0}).aws.part_cache_bytes() == 0


def test_the_report_gives_the_cpu_of_a_worker_step_by_phase(small_ratings, tmp_path):
    """totals.cpu_ms_per_worker_step: CPU (not wall) per phase over every worker-step, and
    the busiest worker's CPU per step, so a job's step can be broken down from its report."""
    data_dir, _ = small_ratings
    spec = engine_spec(data_dir, tmp_path, workers=3, **{"sync.mode": "isp", "stop.max_epochs": 1})
    signals = RecordingChannel()
    report, _ = run_local(spec, in_process=True, signals=signals)
    totals = report["totals"]
    steps = [m for m in signals.log if m.kind == "step"]
    assert totals["worker_steps"] == len(steps) == 3 * report["steps"]
    per_step = totals["cpu_ms_per_worker_step"]
    assert {"fetch", "compute", "filter", "write", "read", "apply", "wait"} <= set(per_step)
    summed = {p: sum(m.cpu_timing.get(p, 0.0) for m in signals.log) for p in per_step}
    for phase, ms in per_step.items():
        assert ms == pytest.approx(1000 * summed[phase] / len(steps), abs=1e-3)
    # The report rounds cpu_critical_seconds to the millisecond: up to 0.5 ms over all steps.
    assert totals["busiest_cpu_ms_per_step"] == pytest.approx(
        1000 * totals["cpu_critical_seconds"] / report["steps"], abs=0.5 / report["steps"] + 1e-3
    )
