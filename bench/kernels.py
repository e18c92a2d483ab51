"""Training-step throughput of each Ebb model against a bare torch loop (one thread).

Both sides train on the same pre-built minibatches (6,250 samples, MLLess's size) from
the same initial state; runs are interleaved and repeated and the median is reported,
so machine noise hits both alike. "bare torch" is the same math written straight in
torch with the same fast indexing ops but no Ebb classes (no RowUpdate, no optimiser
objects), so the ratio is the cost of Ebb's abstractions; "torch autograd" is what
a user writes first: nn.Embedding(sparse=True) + loss.backward() + torch.optim.

    python bench/kernels.py            # full (≈1 min)
    python bench/kernels.py --quick    # smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, result_path, write_json  # noqa: E402

from ebb.models.logistic import DenseLR, SparseLR  # noqa: E402
from ebb.models.pmf import PMF  # noqa: E402

B = 6250


def ratings_batches(n_batches, users=70_000, items=10_000, seed=0):
    rng = np.random.default_rng(seed)
    pu = 1 / np.arange(1, users + 1) ** 0.6
    pi = 1 / np.arange(1, items + 1) ** 0.8
    return [{"user": rng.choice(users, B, p=pu / pu.sum()).astype(np.int32),
             "item": rng.choice(items, B, p=pi / pi.sum()).astype(np.int32),
             "rating": rng.uniform(1, 5, B).astype(np.float32)} for _ in range(n_batches)]


def sparse_batches(n_batches, features=100_000, nnz=39, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        indices = rng.integers(0, features, B * nnz).astype(np.int32)
        out.append({"label": (rng.random(B) < 0.25).astype(np.float32),
                    "indptr": np.arange(0, B * nnz + 1, nnz, dtype=np.int64), "indices": indices,
                    "values": rng.random(B * nnz).astype(np.float32)})
    return out


def dense_batches(n_batches, features=100, seed=0):
    rng = np.random.default_rng(seed)
    return [{"label": (rng.random(B) < 0.4).astype(np.float32), "x": rng.random((B, features)).astype(np.float32)}
            for _ in range(n_batches)]


# ---- Ebb: the engine's own step (local update + apply) --------------------------------
def ebb_step(model):
    def run(batches):
        for b in batches:
            _, _, upd = model.local_update(b)
            model.apply(upd)
    return run


# ---- bare torch: the same math, no Ebb classes --------------------------------------------
def bare_pmf(users, items, rank, lr=0.02, mom=0.9, lam=0.05, mu=3.0):
    g = torch.Generator().manual_seed(0)
    U, V = torch.randn(users, rank, generator=g) * 0.1, torch.randn(items, rank, generator=g) * 0.1
    bu, bi = torch.zeros(users, 1), torch.zeros(items, 1)
    params = [U, V, bu, bi]
    bufs = [torch.zeros_like(p) for p in params]

    def run(batches):
        for b in batches:
            Ur, Vr = U.index_select(0, b.users), V.index_select(0, b.items)
            bur, bir = bu.index_select(0, b.users), bi.index_select(0, b.items)
            Uk, Vk = Ur.index_select(0, b.user_of), Vr.index_select(0, b.item_of)
            err = ((Uk * Vk).sum(1) + bur.index_select(0, b.user_of)[:, 0] + bir.index_select(0, b.item_of)[:, 0]
                   + mu - b.rating).unsqueeze(1)
            grads = [torch.zeros_like(Ur).index_add_(0, b.user_of, err * Vk) / b.user_count + lam * Ur,
                     torch.zeros_like(Vr).index_add_(0, b.item_of, err * Uk) / b.item_count + lam * Vr,
                     torch.zeros_like(bur).index_add_(0, b.user_of, err) / b.user_count + lam * bur,
                     torch.zeros_like(bir).index_add_(0, b.item_of, err) / b.item_count + lam * bir]
            for p, buf, grad, rows in zip(params, bufs, grads, (b.users, b.items, b.users, b.items)):
                m = buf.index_select(0, rows) * mom + grad
                buf.index_copy_(0, rows, m)
                p.index_add_(0, rows, (grad + mom * m) * -lr)
    return run


def bare_adam_lr(features, sparse: bool, lr=0.02, lam=1e-6):
    w, bias = torch.zeros(features, 1), torch.zeros(1, 1)
    m, v = torch.zeros(features, 1), torch.zeros(features, 1)
    mb, vb = torch.zeros(1, 1), torch.zeros(1, 1)
    t = [0]
    all_rows = torch.arange(features)

    def adam(p, mm, vv, rows, grad, step):
        mr = mm.index_select(0, rows) * 0.9 + 0.1 * grad
        vr = vv.index_select(0, rows) * 0.999 + 0.001 * grad * grad
        mm.index_copy_(0, rows, mr)
        vv.index_copy_(0, rows, vr)
        p.index_add_(0, rows, -lr * (mr / (1 - 0.9**step)) / ((vr / (1 - 0.999**step)).sqrt() + 1e-8))

    def run(batches):
        for b in batches:
            t[0] += 1
            if sparse:
                wr = w[b.features, 0]
                logits = (
                    torch.zeros(b.label.numel()).index_add_(0, b.sample_of, wr[b.feature_of] * b.values) + bias[0, 0]
                )
                g = (torch.sigmoid(logits) - b.label) / b.label.numel()
                gw = torch.zeros(b.features.numel(), 1).index_add_(
                    0, b.feature_of, (g[b.sample_of] * b.values).unsqueeze(1)
                )
                rows = b.features
            else:
                logits = (b.x @ w)[:, 0] + bias[0, 0]
                g = (torch.sigmoid(logits) - b.label) / b.label.numel()
                gw, rows = (b.x.T @ g).unsqueeze(1), all_rows
            F.binary_cross_entropy_with_logits(logits, b.label, reduction="sum").item()
            adam(w, m, v, rows, gw + lam * w.index_select(0, rows), t[0])
            adam(bias, mb, vb, torch.zeros(1, dtype=torch.long), g.sum().reshape(1, 1), t[0])

    return run


# ---- torch autograd: what a user writes first -------------------------------------------
def autograd_pmf(users, items, rank, lr=0.05):
    class MF(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.U, self.V = torch.nn.Embedding(users, rank, sparse=True), torch.nn.Embedding(items, rank, sparse=True)
            self.bu, self.bi = torch.nn.Embedding(users, 1, sparse=True), torch.nn.Embedding(items, 1, sparse=True)

        def forward(self, u, i):
            return (self.U(u) * self.V(i)).sum(1) + self.bu(u)[:, 0] + self.bi(i)[:, 0] + 3.0

    model = MF()
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def run(raw):
        for u, i, r in raw:
            opt.zero_grad()
            loss = F.mse_loss(model(u, i), r)
            loss.backward()
            opt.step()

    return run


def measure(fn, batches, samples, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(batches)
        times.append(time.perf_counter() - t0)
    return samples / statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer batches and repeats")
    ap.add_argument("--json", help="output JSON path (default bench/results/kernels/models[-quick].json)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    n, repeats = (8, 3) if args.quick else (24, 7)
    rows = []

    # PMF at MovieLens-10M shape, rank 20.
    users, items, rank = 70_000, 10_000, 20
    raw = ratings_batches(n, users, items)
    ebb = PMF(users, items, rank=rank, lr=0.02, momentum=0.9, l2=0.05, init_std=0.1, global_mean=3.0, seed=0)
    batches = [ebb.to_batch(b) for b in raw]
    tensors = [
        (torch.from_numpy(b["user"]).long(), torch.from_numpy(b["item"]).long(), torch.from_numpy(b["rating"]))
        for b in raw
    ]
    contenders = {
        "ebb": (ebb_step(ebb), batches),
        "bare torch": (bare_pmf(users, items, rank), batches),
        "torch autograd (nn.Embedding sparse + SGD)": (autograd_pmf(users, items, rank), tensors),
    }
    rows += run_side_by_side("pmf", contenders, n * B, repeats)

    raw = sparse_batches(n)
    ebb = SparseLR(100_000, lr=0.02, l2=1e-6, seed=0)
    batches = [ebb.to_batch(b) for b in raw]
    rows += run_side_by_side(
        "sparse_lr",
        {"ebb": (ebb_step(ebb), batches), "bare torch": (bare_adam_lr(100_000, True), batches)},
        n * B,
        repeats,
    )
    raw = dense_batches(n)
    ebb = DenseLR(100, lr=0.05, l2=1e-5, seed=0)
    batches = [ebb.to_batch(b) for b in raw]
    rows += run_side_by_side(
        "lr", {"ebb": (ebb_step(ebb), batches), "bare torch": (bare_adam_lr(100, False), batches)}, n * B, repeats
    )

    print_table(
        rows,
        [("model", "model"), ("impl", "implementation"), ("samples_per_s", "samples/s"), ("vs_bare", "× bare torch")],
    )
    pmf = next(r for r in rows if r["model"] == "pmf" and r["impl"] == "ebb")
    verdict = {
        "pmf_ratings_per_s": pmf["samples_per_s"],
        "pmf_target_1M": pmf["samples_per_s"] >= 1e6,
        "all_models_ge_0.9x_bare": all(r["vs_bare"] >= 0.9 for r in rows if r["impl"] == "ebb"),
    }
    print(
        f"\nPMF: {pmf['samples_per_s'] / 1e6:.2f} M ratings/s on one thread (target ≥ 1 M); "
        f"Ebb ≥ 0.9× bare torch on every model: {verdict['all_models_ge_0.9x_bare']}"
    )
    write_json(
        result_path("kernels", "models-quick" if args.quick else "models"),
        {"batch_size": B, "repeats": repeats, "batches": n, "rows": rows, "verdict": verdict},
        args.json,
    )


def run_side_by_side(model, contenders, samples, repeats):
    for fn, batches in contenders.values():  # warm-up: allocator, caches
        fn(batches[:2])
    speeds = {name: [] for name in contenders}
    for _ in range(repeats):  # interleaved, so noise hits every contender alike
        for name, (fn, batches) in contenders.items():
            speeds[name].append(measure(fn, batches, samples, 1))
    bare = statistics.median(speeds["bare torch"])
    return [
        {"model": model, "impl": name, "samples_per_s": statistics.median(s), "vs_bare": statistics.median(s) / bare}
        for name, s in speeds.items()
    ]


if __name__ == "__main__":
    main()
