"""Models: hand-written gradients against autograd, lazy optimisers against torch.optim,
and single-worker training against a plain torch loop (MLLess's sanity check)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ebb.data.format import decode_batch
from ebb.engine.striping import PartSequence
from ebb.local.runner import run_local
from ebb.models import build_model, resolve_hyper
from ebb.models.logistic import DenseLR, SparseLR
from ebb.models.metrics import auc
from ebb.models.optim import SparseAdam, SparseSGD
from ebb.models.pmf import PMF
from ebb.ports.manifest import load_manifest
from ebb.spec import load_spec
from ebb.stores.local import FolderObjectStore


def _ratings(n=400, users=30, items=20, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "user": rng.integers(0, users, n).astype(np.int32),
        "item": rng.integers(0, items, n).astype(np.int32),
        "rating": rng.uniform(1, 5, n).astype(np.float32),
    }


def test_pmf_gradients_match_autograd_with_per_row_normalisation():
    model = PMF(30, 20, rank=4, lr=0.1, momentum=0.0, l2=0.05, init_std=0.3, global_mean=3.0, seed=1, row_grad="mean")
    arrays = _ratings()
    batch = model.to_batch(arrays)
    _, _, grads = model.gradients(batch)

    u = torch.from_numpy(arrays["user"]).long()
    i = torch.from_numpy(arrays["item"]).long()
    r = torch.from_numpy(arrays["rating"])
    p = {k: v.clone().requires_grad_(True) for k, v in model.params.items()}
    count_u = torch.bincount(u, minlength=30).float()
    count_i = torch.bincount(i, minlength=20).float()
    U, V = p["user"], p["item"]  # [rows, rank + 1]: the factors, then the bias
    assert U.shape == (30, 5) and V.shape == (20, 5) and not model.params["user"][:, 4].any()
    err = 3.0 + U[u, 4] + V[i, 4] + (U[u, :4] * V[i, :4]).sum(1) - r
    # Each row's gradient is the mean over its ratings in the batch: one weighted loss per side.
    g = {}
    for name, counts, idx in (("user", count_u, u), ("item", count_i, i)):
        side = (0.5 * err**2 / counts[idx]).sum()
        (grad,) = torch.autograd.grad(side, p[name], retain_graph=True)
        g[name] = grad
    for name, (rows, grad, *_) in grads.items():
        expected = g[name][rows] + 0.05 * model.params[name][rows]
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)
        untouched = torch.ones(model.params[name].shape[0], dtype=torch.bool)
        untouched[rows] = False
        assert torch.all(g[name][untouched] == 0)


def test_pmf_row_grad_sum_is_the_autograd_gradient_of_the_minibatch_loss():
    """hyper.row_grad sum: a row's gradient is that of Σ ½(r̂ − r)² + ½λ(|U_u|² + |V_i|²) over
    the batch's ratings, each rating's penalty on its own rows (planted repeats: 400 ratings
    over 30 users and 20 items); a row seen once gets what the mean gives it."""
    model = PMF(30, 20, rank=4, lr=0.1, momentum=0.0, l2=0.05, init_std=0.3, global_mean=3.0, seed=1, row_grad="sum")
    arrays = _ratings()
    _, _, grads = model.gradients(model.to_batch(arrays))
    u, i = torch.from_numpy(arrays["user"]).long(), torch.from_numpy(arrays["item"]).long()
    p = {k: v.clone().requires_grad_(True) for k, v in model.params.items()}
    U, V = p["user"], p["item"]
    err = 3.0 + U[u, 4] + V[i, 4] + (U[u, :4] * V[i, :4]).sum(1) - torch.from_numpy(arrays["rating"])
    loss = (0.5 * err**2).sum() + 0.5 * 0.05 * (U[u].square().sum() + V[i].square().sum())
    want = dict(zip(p, torch.autograd.grad(loss, list(p.values()))))
    for name, (rows, grad, *_) in grads.items():
        torch.testing.assert_close(grad, want[name][rows], rtol=1e-5, atol=1e-5)
    once = PMF(30, 20, rank=4, lr=0.1, momentum=0.0, l2=0.05, init_std=0.3, global_mean=3.0, seed=1)
    single = {k: v[:1] for k, v in arrays.items()}
    for (_, g_sum, *_), (_, g_mean, *_) in zip(
        model.gradients(model.to_batch(single))[2].values(), once.gradients(once.to_batch(single))[2].values()
    ):
        torch.testing.assert_close(g_sum, g_mean)
    with pytest.raises(ValueError, match="row_grad"):
        PMF(3, 2, rank=1, lr=0.1, momentum=0.0, l2=0.0, init_std=0.1, global_mean=0.0, seed=0, row_grad="max")


@pytest.mark.parametrize("cls", [SparseLR, DenseLR])
def test_logistic_gradients_match_autograd(cls):
    rng = np.random.default_rng(0)
    d, n = 50, 64
    x = (rng.random((n, d)) < 0.1) * rng.normal(size=(n, d))
    y = (rng.random(n) < 0.4).astype(np.float32)
    if cls is SparseLR:
        rows, cols = np.nonzero(x)
        indptr = np.searchsorted(rows, np.arange(n + 1)).astype(np.int64)
        arrays = {
            "label": y,
            "indptr": indptr,
            "indices": cols.astype(np.int32),
            "values": x[rows, cols].astype(np.float32),
        }
    else:
        arrays = {"label": y, "x": x.astype(np.float32)}
    model = cls(d, lr=0.1, l2=0.01, seed=0)
    model.params["weight"].normal_(0, 0.5)
    batch = model.to_batch(arrays)
    loss_sum, count, grads = model.gradients(batch)

    w = model.params["weight"].clone().requires_grad_(True)
    b = model.params["bias"].clone().requires_grad_(True)
    logits = torch.from_numpy(x.astype(np.float32)) @ w[:, 0] + b[0, 0]
    bce = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(y))
    gw, gb = torch.autograd.grad(bce, [w, b])
    rows, gwr = grads["weight"]
    torch.testing.assert_close(gwr, gw[rows] + 0.01 * model.params["weight"][rows], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads["bias"][1], gb, rtol=1e-5, atol=1e-6)
    assert loss_sum / count == pytest.approx(float(bce.detach()), rel=1e-5)
    if cls is SparseLR:
        assert set(rows.tolist()) == set(np.nonzero(x.any(axis=0))[0].tolist())


def test_sparse_lr_l2_every_step_charges_the_idle_steps_penalty_at_the_next_touch():
    """Planted: feature 0 is touched at step 1 and next at step 5 (feature 2 alone in steps
    2-4). At step 5 its gradient holds 4 steps of λ·w (a dense penalty's gradients over
    steps 2-5, w unmoved meanwhile), where touched-only l2 holds one; the last-touched steps
    are checkpointed and a checkpoint without them is refused."""
    one = lambda f: {  # noqa: E731
        "label": np.ones(1, np.float32),
        "indptr": np.array([0, 1], np.int64),
        "indices": np.array([f], np.int32),
        "values": np.ones(1, np.float32),
    }
    every = SparseLR(4, lr=0.1, l2=0.5, seed=0, l2_every_step=True)
    plain = SparseLR(4, lr=0.1, l2=0.5, seed=0)
    for model in (every, plain):
        for f in (0, 2, 2, 2):
            model.apply(model.local_update(model.to_batch(one(f)))[2])
    assert torch.equal(every.params["weight"], plain.params["weight"])  # the first touches: same l2
    w0 = float(every.params["weight"][0, 0])
    assert w0 != 0.0
    g_every = every.gradients(every.to_batch(one(0)))[2]["weight"][1]
    g_plain = plain.gradients(plain.to_batch(one(0)))[2]["weight"][1]
    assert float(g_every - g_plain) == pytest.approx(3 * 0.5 * w0, rel=1e-5)
    state = every.state_arrays()
    assert state["opt.last.weight"][:, 0].tolist() == [1.0, 0.0, 4.0, 0.0]
    again = SparseLR(4, lr=0.1, l2=0.5, seed=0, l2_every_step=True)
    again.load_state_arrays(state)
    assert torch.equal(again.optimizer.last["weight"], every.optimizer.last["weight"])
    with pytest.raises(ValueError, match="last.weight"):
        again.load_state_arrays(plain.state_arrays())


def test_sparse_sgd_nesterov_matches_torch_sgd_when_all_rows_touched():
    torch.manual_seed(0)
    x0 = torch.randn(6, 3)
    ours = {"p": x0.clone()}
    opt = SparseSGD(ours, lr=0.05, momentum=0.9, nesterov=True)
    ref = x0.clone().requires_grad_(True)
    torch_opt = torch.optim.SGD([ref], lr=0.05, momentum=0.9, nesterov=True)
    rows = torch.arange(6)
    for _ in range(20):
        grad = torch.randn(6, 3)
        opt.begin_step()
        ours["p"].index_add_(0, rows, opt.delta("p", rows, grad))
        ref.grad = grad.clone()
        torch_opt.step()
    torch.testing.assert_close(ours["p"], ref.detach(), rtol=1e-5, atol=1e-6)


def test_sparse_adam_matches_torch_sparse_adam_on_touched_rows():
    torch.manual_seed(0)
    x0 = torch.randn(10, 2)
    ours = {"p": x0.clone()}
    opt = SparseAdam(ours, lr=0.01)
    emb = torch.nn.Embedding(10, 2, sparse=True)
    emb.weight.data.copy_(x0)
    torch_opt = torch.optim.SparseAdam(emb.parameters(), lr=0.01)
    for _ in range(25):
        rows = torch.unique(torch.randint(0, 10, (4,)))
        grad = torch.randn(rows.numel(), 2)
        opt.begin_step()
        ours["p"].index_add_(0, rows, opt.delta("p", rows, grad))
        emb.weight.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), grad, (10, 2), check_invariants=True)
        torch_opt.step()
    torch.testing.assert_close(ours["p"], emb.weight.detach(), rtol=1e-5, atol=1e-6)


def test_lazy_adam_with_row_steps_matches_torch_sparse_adam_with_a_parameter_per_row():
    """Per-row bias correction is torch.optim.SparseAdam with every row its own parameter:
    torch counts a parameter's steps only when it has a gradient."""
    torch.manual_seed(0)
    x0 = torch.randn(12, 3)
    ours = {"p": x0.clone()}
    opt = SparseAdam(ours, lr=0.05, row_steps=True)
    rows_as_params = [torch.nn.Parameter(x0[r : r + 1].clone()) for r in range(12)]
    torch_opt = torch.optim.SparseAdam(rows_as_params, lr=0.05)
    touched = torch.zeros(12)
    for _ in range(40):
        # Rows at very different rates: row r is touched with probability about 1/(r+1).
        rows = torch.nonzero(torch.rand(12) < 1 / torch.arange(1, 13)).flatten()
        if rows.numel() == 0:
            continue
        grad = torch.randn(rows.numel(), 3)
        opt.begin_step()
        ours["p"].index_add_(0, rows, opt.delta("p", rows, grad))
        for p in rows_as_params:
            p.grad = None
        for j, r in enumerate(rows.tolist()):
            rows_as_params[r].grad = torch.sparse_coo_tensor(
                torch.zeros(1, 1, dtype=torch.long), grad[j : j + 1], (1, 3), check_invariants=True
            )
        torch_opt.step()
        touched[rows] += 1
    assert touched.min() >= 1 and touched.max() >= 5 * touched.min()  # the rates really differ
    torch.testing.assert_close(ours["p"], torch.cat([p.detach() for p in rows_as_params]), rtol=1e-5, atol=1e-6)
    assert torch.equal(opt.row_steps["p"].flatten(), touched.double())


def test_pmf_with_adam_keeps_lazy_state_and_refuses_a_momentum_checkpoint():
    adam = PMF(30, 20, rank=4, lr=0.03, momentum=0.0, l2=0.05, init_std=0.1, global_mean=3.0, seed=1, optimizer="adam")
    batch = adam.to_batch(_ratings(n=50))
    _, _, update = adam.local_update(batch)
    untouched = torch.ones(30, dtype=torch.bool)
    untouched[batch.users] = False
    state = adam.state_arrays()
    assert set(k for k in state if k.startswith("opt.")) == {
        "opt.m.user",
        "opt.m.item",
        "opt.v.user",
        "opt.v.item",
        "opt.rowsteps.user",
        "opt.rowsteps.item",
        "opt.steps",
    }
    assert (state["opt.rowsteps.user"][untouched.numpy()] == 0).all()
    assert (state["opt.rowsteps.user"][batch.users.numpy()] == 1).all()
    assert (state["opt.m.user"][untouched.numpy()] == 0).all()
    # First step of lazy Adam: every touched entry with a gradient moves by lr (up to eps).
    rows, delta = update.rows["user"]
    np.testing.assert_allclose(delta.abs().numpy(), 0.03, rtol=1e-4)
    sgd = PMF(30, 20, rank=4, lr=0.03, momentum=0.8, l2=0.05, init_std=0.1, global_mean=3.0, seed=1)
    with pytest.raises(ValueError, match="optimiser state has no m.item, m.user, .*another hyper.optimizer"):
        adam.load_state_arrays(sgd.state_arrays())
    with pytest.raises(ValueError, match="hyper.optimizer 'rmsprop'"):
        PMF(3, 2, rank=2, lr=0.1, momentum=0.0, l2=0.0, init_std=0.1, global_mean=0.0, seed=0, optimizer="rmsprop")


def test_auc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    score = rng.integers(0, 5, 200).astype(float)  # many ties
    label = (rng.random(200) < 0.3).astype(float)
    pos, neg = score[label == 1], score[label == 0]
    pairwise = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert auc(score, label) == pytest.approx(pairwise)


def _plain_torch_pmf_losses(data_dir: str, hp, seed: int, steps: int) -> list[float]:
    """PMF written as a user would in plain torch: autograd of the minibatch's loss (each
    rating's penalty on its own rows: hyper.row_grad sum, the default) + lazy Nesterov,
    the same minibatches."""
    store = FolderObjectStore(data_dir)
    manifest = load_manifest(store)
    hp = resolve_hyper("pmf", manifest, hp)  # l2 left unset: the data's default, as the engine's
    gen = torch.Generator().manual_seed(seed)
    U = torch.randn(manifest.num_users, hp.rank, generator=gen) * hp.init_std
    V = torch.randn(manifest.num_items, hp.rank, generator=gen) * hp.init_std
    bu, bi = torch.zeros(manifest.num_users), torch.zeros(manifest.num_items)
    params = [U, V, bu, bi]
    bufs = [torch.zeros_like(p) for p in params]
    mu = manifest.stats["rating_mean"]
    order = PartSequence(len(manifest.train.parts), seed)
    losses = []
    for t in range(steps):
        lr = hp.lr * hp.lr_decay ** (t // order.num_parts)
        arrays = decode_batch(store.get(manifest.train.parts[order.part_at(t)].key))
        u, i = torch.from_numpy(arrays["user"]).long(), torch.from_numpy(arrays["item"]).long()
        r = torch.from_numpy(arrays["rating"])
        leaves = [p.clone().requires_grad_(True) for p in params]
        err = mu + leaves[2][u] + leaves[3][i] + (leaves[0][u] * leaves[1][i]).sum(1) - r
        losses.append(float(err.detach().square().mean().sqrt()))
        penalty = sum(leaf[idx].square().sum() for leaf, idx in zip(leaves, (u, i, u, i)))
        grads = torch.autograd.grad((0.5 * err**2).sum() + 0.5 * hp.l2 * penalty, leaves)
        for p, buf, g, idx in zip(params, bufs, grads, (u, i, u, i)):
            rows = torch.unique(idx)
            g_rows = g[rows]
            buf[rows] = hp.momentum * buf[rows] + g_rows
            p[rows] -= lr * (g_rows + hp.momentum * buf[rows])
    return losses


def test_single_worker_reproduces_plain_torch_loop_pmf(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    spec = load_spec(
        overrides={
            "model": "pmf",
            "hyper.optimizer": "sgd_momentum",  # the plain loop is SGD with Nesterov momentum
            "data": data_dir,
            "workers": 1,
            "stop.max_epochs": 3,
            "hyper.rank": 6,
            "seed": 11,
            "out": str(tmp_path),
            "scaling.policy": "none",
        }
    )
    report, _ = run_local(spec)
    engine_losses = [h["loss"] for h in report["history"]]
    plain = _plain_torch_pmf_losses(data_dir, spec.hyper, spec.seed, len(engine_losses))
    assert len(engine_losses) == report["steps"] > 40
    np.testing.assert_allclose(engine_losses, plain, rtol=2e-5)
    assert engine_losses[-1] < 0.8 * engine_losses[0]


def test_single_worker_engine_equals_direct_model_loop_bit_for_bit(small_logistic, tmp_path):
    data_dir, _ = small_logistic
    spec = load_spec(
        overrides={
            "model": "sparse_lr",
            "data": data_dir,
            "stop.max_epochs": 2,
            "seed": 5,
            "out": str(tmp_path),
            "scaling.policy": "none",
        }
    )
    report, replica = run_local(spec)
    store = FolderObjectStore(data_dir)
    manifest = load_manifest(store)
    model = build_model("sparse_lr", manifest, spec.hyper, spec.seed)
    order = PartSequence(len(manifest.train.parts), spec.seed)
    losses = []
    for t in range(report["steps"]):
        batch = model.to_batch(decode_batch(store.get(manifest.train.parts[order.part_at(t)].key)))
        loss_sum, n, update = model.local_update(batch)
        model.apply(update)
        losses.append(loss_sum / n)
    assert [h["loss"] for h in report["history"]] == losses
    for name, p in model.params.items():
        assert np.array_equal(replica[name], p.numpy())


def test_pmf_scores_predictions_clipped_to_the_rating_range_and_trains_on_the_raw_ones():
    def model(rating_range):
        m = PMF(
            30,
            20,
            rank=4,
            lr=0.1,
            momentum=0.0,
            l2=0.05,
            init_std=0.3,
            global_mean=3.0,
            seed=1,
            rating_range=rating_range,
        )
        m.params["user"][:5, 4] = 4.0  # five users' predictions far above the scale
        m.params["item"][:3, 4] = -4.0  # three items' far below it
        return m

    arrays = _ratings()
    clipped, raw = model((1.0, 5.0)), model(None)
    batch = clipped.to_batch(arrays)
    pred, target = clipped.predict(batch)
    raw_pred, _ = raw.predict(batch)
    assert raw_pred.max() > 5.5 and raw_pred.min() < 0.5  # the raw model overshoots both ends
    np.testing.assert_array_equal(pred, np.clip(raw_pred, 1.0, 5.0))
    # Clipping can only bring a prediction closer to a rating inside the scale.
    assert clipped.metrics(pred, target)["rmse"] < raw.metrics(raw_pred, target)["rmse"]
    # Training is untouched: the loss and gradients are those of the unclipped prediction.
    loss, _, grads = clipped.gradients(batch)
    raw_loss, _, raw_grads = raw.gradients(batch)
    assert loss == raw_loss == pytest.approx(float(((raw_pred - target) ** 2).sum()), rel=1e-5)
    for name in grads:
        torch.testing.assert_close(grads[name], raw_grads[name], rtol=0, atol=0)


def test_build_model_takes_the_rating_range_from_the_training_split(small_ratings):
    from ebb.models import rating_range

    data_dir, _ = small_ratings
    manifest = load_manifest(FolderObjectStore(data_dir))
    hp = load_spec(overrides={"model": "pmf", "data": data_dir}).hyper
    model = build_model("pmf", manifest, hp, seed=0)
    assert model.rating_range == (manifest.stats["rating_min"], manifest.stats["rating_max"])
    assert rating_range(manifest) == model.rating_range
    # A manifest that does not record the range: nothing to clip to.
    del manifest.stats["rating_min"]
    assert build_model("pmf", manifest, hp, seed=0).rating_range is None


def test_pmf_predicts_cold_users_and_items_from_the_biases_alone():
    def model(cold_k):
        return PMF(30, 20, rank=4, lr=0.1, momentum=0.0, l2=0.05, init_std=0.5, global_mean=3.0, seed=1, cold_k=cold_k)

    train = _ratings(n=300)
    # Training counts: users 0–29 and items 0–19 from `train`, then a held-out batch.
    users, items = np.bincount(train["user"], minlength=30), np.bincount(train["item"], minlength=20)
    k = int(np.sort(items)[3])  # the rarest few items are cold
    cold_model, plain = model(k), model(0)
    assert cold_model.needs_training_pass and not plain.needs_training_pass
    cold_model.params["user"][:, 4] = torch.linspace(-0.5, 0.5, 30)
    cold_model.params["item"][:, 4] = torch.linspace(0.3, -0.3, 20)
    plain.params = {n: p.clone() for n, p in cold_model.params.items()}
    parts = [cold_model.to_batch({c: a[s : s + 100] for c, a in train.items()}) for s in (0, 100, 200)]
    cold_model.observe_training(iter(parts))
    held_out = _ratings(n=200, seed=7)
    batch = cold_model.to_batch(held_out)
    pred, _ = cold_model.predict(batch)
    base, _ = plain.predict(batch)
    is_cold = (users[held_out["user"]] <= k) | (items[held_out["item"]] <= k)
    assert 0 < is_cold.sum() < len(is_cold)
    bias_only = 3.0 + cold_model.params["user"][held_out["user"], 4] + cold_model.params["item"][held_out["item"], 4]
    np.testing.assert_allclose(pred[is_cold], bias_only.numpy()[is_cold], rtol=1e-6)
    np.testing.assert_array_equal(pred[~is_cold], base[~is_cold])  # the rest as without the rule
    assert not np.allclose(pred[is_cold], base[is_cold])


def test_cold_k_is_a_spec_field_with_a_catalogue_default_and_reaches_the_model(small_ratings, tmp_path):
    from ebb.catalogue import CATALOGUE

    data_dir, _ = small_ratings
    base = {"model": "pmf", "data": data_dir, "out": str(tmp_path), "workers": 1}
    assert load_spec(overrides=base).hyper.cold_k == CATALOGUE["pmf"].hyper["cold_k"]
    spec = load_spec(overrides={**base, "hyper.cold_k": 2, "stop.max_epochs": 1, "scaling.policy": "none"})
    manifest = load_manifest(FolderObjectStore(data_dir))
    assert build_model("pmf", manifest, spec.hyper, 0).cold_k == 2
    # Through the engine: every user and item "cold" scores the biases-only model, which the
    # engine's test figure must then equal (the counts are primed from the training split).
    runs = {}
    for cold_k in (0, 1_000_000):
        out = tmp_path / f"k{cold_k}"
        over = {**base, "out": str(out), "hyper.cold_k": cold_k, "stop.max_epochs": 1, "scaling.policy": "none"}
        runs[cold_k] = run_local(load_spec(overrides=over))
    (plain, replica), (all_cold, replica_cold) = runs[0], runs[1_000_000]
    for name in replica:
        assert np.array_equal(replica[name], replica_cold[name])  # training is unchanged
    assert plain["test_metrics"]["rmse"] != all_cold["test_metrics"]["rmse"]
    biases = build_model("pmf", manifest, spec.hyper, 0)
    biases.params = {n: torch.from_numpy(a.copy()) for n, a in replica.items()}
    biases.params["user"][:, :-1] = 0.0
    test = [biases.to_batch(decode_batch(FolderObjectStore(data_dir).get(p.key))) for p in manifest.test.parts]
    assert all_cold["test_metrics"]["rmse"] == pytest.approx(biases.evaluate(test)["rmse"], rel=1e-5)


# (training ratings, users, items) of the shapes the rule was fitted on (docs/DEFAULTS.md).
SHAPES = {
    "ml-100k": (80_000, 943, 1682),
    "ml-latest-small": (80_668, 610, 9724),
    "ml10m": (9_000_000, 70_000, 10_000),
}


def test_pmf_l2_default_is_computed_from_the_data_shape():
    from ebb.catalogue import CATALOGUE, L2_AT, L2_MIN, auto_l2, data_defaults

    values = {name: auto_l2(*shape) for name, shape in SHAPES.items()}
    assert values == {"ml-100k": 0.134, "ml-latest-small": 0.14, "ml10m": 0.0381}
    # Denser rows (more ratings per user and per item) are regularised less per rating;
    # sparse ones keep Funk's constant, and far past the data measured l2 stays above a floor.
    assert auto_l2(80_000, 943, 1682) > auto_l2(800_000, 943, 1682) > auto_l2(8_000_000, 943, 1682)
    assert auto_l2(10, 10_000, 10_000) == auto_l2(80_668, 610, 9724) == L2_AT
    assert auto_l2(10**12, 10, 10) == L2_MIN
    assert data_defaults("pmf", ratings=80_000, users=943, items=1682) == {"l2": values["ml-100k"]}
    assert data_defaults("sparse_lr", ratings=80_000) == {} and "l2" in CATALOGUE["sparse_lr"].hyper
    assert "l2" not in CATALOGUE["pmf"].hyper and "l2" in CATALOGUE["pmf"].auto


def test_pmf_l2_auto_reaches_the_model_and_the_report_and_an_explicit_l2_wins(small_ratings, tmp_path):
    from ebb.catalogue import auto_l2
    from ebb.models import auto_hyper

    data_dir, _ = small_ratings
    manifest = load_manifest(FolderObjectStore(data_dir))
    expected = auto_l2(manifest.train.rows, manifest.num_users, manifest.num_items)
    base = {"model": "pmf", "data": data_dir, "workers": 1, "stop.max_epochs": 1, "scaling.policy": "none"}
    unset = load_spec(overrides={**base, "out": str(tmp_path / "auto")})
    assert unset.hyper.l2 is None  # the spec says "auto"; the data decides
    assert build_model("pmf", manifest, unset.hyper, 0).l2 == expected
    assert resolve_hyper("pmf", manifest, unset.hyper).l2 == expected and unset.hyper.l2 is None  # not mutated
    given = load_spec(overrides={**base, "out": str(tmp_path / "given"), "hyper.l2": 0.3})
    assert build_model("pmf", manifest, given.hyper, 0).l2 == 0.3 and auto_hyper("pmf", manifest, given.hyper) == {}
    report, _ = run_local(unset)
    assert report["auto_hyper"] == {"l2": expected} and report["spec"]["hyper"]["l2"] is None
    report, _ = run_local(given)
    assert report["auto_hyper"] == {} and report["spec"]["hyper"]["l2"] == 0.3
