"""Training-step throughput of each Ebb model against a bare torch loop (one thread).

Every contender trains on the same pre-built minibatches (6,250 samples, MLLess's size)
from the same initial state, and takes whole steps: the local update and its scatter into
the replica. Runs are interleaved in ABBA order (forward, then backward) and repeated, and
the median is reported, so the noise of a shared machine hits every contender alike.

- "ebb": the engine's step as it runs here: the fused compiled kernel where it is built
  (``python -m ebb.native``; ebb.models.compiled), else the torch path;
- "ebb, torch path": the same step with the kernels off (as with ``EBB_NATIVE=0``), the
  reference the kernel is tested against;
- "bare torch": the same math written straight in torch with the same fast indexing ops
  but no Ebb classes (no RowUpdate, no optimiser objects);
- "torch autograd": what a user writes first: nn.Embedding(sparse=True) + backward + SGD.

    python bench/kernels.py            # full (about 30 s)
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

from ebb import native  # noqa: E402
from ebb.models.logistic import DenseLR, SparseLR  # noqa: E402
from ebb.models.pmf import PMF  # noqa: E402

B = 6250


def ratings_batches(n_batches, users=70_000, items=10_000, seed=0):
    rng = np.random.default_rng(seed)
    pu = 1 / np.arange(1, users + 1) ** 0.6
    pi = 1 / np.arange(1, items + 1) ** 0.8
    return [
        {
            "user": rng.choice(users, B, p=pu / pu.sum()).astype(np.int32),
            "item": rng.choice(items, B, p=pi / pi.sum()).astype(np.int32),
            "rating": rng.uniform(1, 5, B).astype(np.float32),
        }
        for _ in range(n_batches)
    ]


def sparse_batches(n_batches, features=100_000, nnz=39, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        indices = rng.integers(0, features, B * nnz).astype(np.int32)
        out.append(
            {
                "label": (rng.random(B) < 0.25).astype(np.float32),
                "indptr": np.arange(0, B * nnz + 1, nnz, dtype=np.int64),
                "indices": indices,
                "values": rng.random(B * nnz).astype(np.float32),
            }
        )
    return out


def dense_batches(n_batches, features=100, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {"label": (rng.random(B) < 0.4).astype(np.float32), "x": rng.random((B, features)).astype(np.float32)}
        for _ in range(n_batches)
    ]


# ---- Ebb: the engine's own step (local update + apply) --------------------------------
def ebb_step(model, kernels: bool = True):
    """The model's step; with ``kernels=False`` its torch path, as with EBB_NATIVE=0."""

    def run(batches):
        for b in batches:
            _, _, upd = model.local_update(b)
            model.apply(upd)

    def torch_path(batches):
        loaded, native._lib = native._lib, None
        try:
            run(batches)
        finally:
            native._lib = loaded

    return run if kernels else torch_path


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
            err = (
                (Uk * Vk).sum(1)
                + bur.index_select(0, b.user_of)[:, 0]
                + bir.index_select(0, b.item_of)[:, 0]
                + mu
                - b.rating
            ).unsqueeze(1)
            grads = [
                torch.zeros_like(Ur).index_add_(0, b.user_of, err * Vk) / b.user_count + lam * Ur,
                torch.zeros_like(Vr).index_add_(0, b.item_of, err * Uk) / b.item_count + lam * Vr,
                torch.zeros_like(bur).index_add_(0, b.user_of, err) / b.user_count + lam * bur,
                torch.zeros_like(bir).index_add_(0, b.item_of, err) / b.item_count + lam * bir,
            ]
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer batches and repeats")
    ap.add_argument("--json", help="output JSON path (default bench/results/kernels/models[-quick].json)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    n, repeats = (8, 4) if args.quick else (48, 20)  # repeats: whole ABBA rounds, so even
    kernels = native.available()
    if not kernels:
        print("the compiled kernels are not loaded here (python -m ebb.native builds them): 'ebb' is the torch path")
    rows = []

    # PMF at MovieLens-10M shape, rank 20.
    users, items, rank = 70_000, 10_000, 20
    raw = ratings_batches(n, users, items)

    def pmf():
        return PMF(users, items, rank=rank, lr=0.02, momentum=0.9, l2=0.05, init_std=0.1, global_mean=3.0, seed=0)

    batches = [pmf().to_batch(b) for b in raw]
    tensors = [
        (torch.from_numpy(b["user"]).long(), torch.from_numpy(b["item"]).long(), torch.from_numpy(b["rating"]))
        for b in raw
    ]
    contenders = {
        "ebb": (ebb_step(pmf()), batches),
        "ebb, torch path": (ebb_step(pmf(), kernels=False), batches),
        "bare torch": (bare_pmf(users, items, rank), batches),
        "torch autograd (nn.Embedding sparse + SGD)": (autograd_pmf(users, items, rank), tensors),
    }
    rows += run_side_by_side("pmf", contenders, n * B, repeats)

    raw = sparse_batches(n)
    batches = [SparseLR(100_000, lr=0.02, l2=1e-6, seed=0).to_batch(b) for b in raw]
    contenders = {
        "ebb": (ebb_step(SparseLR(100_000, lr=0.02, l2=1e-6, seed=0)), batches),
        "ebb, torch path": (ebb_step(SparseLR(100_000, lr=0.02, l2=1e-6, seed=0), kernels=False), batches),
        "bare torch": (bare_adam_lr(100_000, True), batches),
    }
    rows += run_side_by_side("sparse_lr", contenders, n * B, repeats)
    raw = dense_batches(n)
    ebb = DenseLR(100, lr=0.05, l2=1e-5, seed=0)
    batches = [ebb.to_batch(b) for b in raw]
    rows += run_side_by_side(
        "lr", {"ebb": (ebb_step(ebb), batches), "bare torch": (bare_adam_lr(100, False), batches)}, n * B, repeats
    )

    print_table(
        rows,
        [
            ("model", "model"),
            ("impl", "implementation"),
            ("samples_per_s", "samples/s (median)"),
            ("spread", "p10-p90 samples/s"),
            ("vs_bare", "× bare torch"),
        ],
    )
    ratio = {(r["model"], r["impl"]): r["vs_bare"] for r in rows}
    pmf_speed = next(r["samples_per_s"] for r in rows if r["model"] == "pmf" and r["impl"] == "ebb")
    verdict = {
        "kernels_loaded": kernels,
        "pmf_ratings_per_s": pmf_speed,
        "pmf_vs_bare": ratio["pmf", "ebb"],
        "sparse_lr_vs_bare": ratio["sparse_lr", "ebb"],
        "pmf_ge_3x_bare": ratio["pmf", "ebb"] >= 3.0,
        "pmf_ge_6M_per_s": pmf_speed >= 6e6,
        "sparse_lr_ge_2x_bare": ratio["sparse_lr", "ebb"] >= 2.0,
        "pmf_kernel_vs_torch_path": ratio["pmf", "ebb"] / ratio["pmf", "ebb, torch path"],
        "sparse_lr_kernel_vs_torch_path": ratio["sparse_lr", "ebb"] / ratio["sparse_lr", "ebb, torch path"],
    }
    print(
        f"\nPMF: {pmf_speed / 1e6:.2f} M ratings/s on one thread, {verdict['pmf_vs_bare']:.2f}× bare torch "
        f"(targets: ≥ 3×, goal 6 M/s); sparse LR {verdict['sparse_lr_vs_bare']:.2f}× bare torch (target ≥ 2×). "
        f"The kernel against Ebb's own torch path: PMF {verdict['pmf_kernel_vs_torch_path']:.2f}×, "
        f"sparse LR {verdict['sparse_lr_kernel_vs_torch_path']:.2f}×."
    )
    payload = {
        "batch_size": B,
        "repeats": repeats,
        "batches": n,
        "order": "ABBA",
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "rows": rows,
        "verdict": verdict,
    }
    write_json(result_path("kernels", "models-quick" if args.quick else "models"), payload, args.json)


def run_side_by_side(model, contenders, samples, repeats):
    """Each contender's samples/s over ``repeats`` runs of all its batches, in ABBA order:
    forward on even repeats, backward on odd ones, so drift in the machine's load favours
    no one."""
    for fn, batches in contenders.values():  # warm-up: allocator, caches, lazy tables
        fn(batches[:2])
    speeds = {name: [] for name in contenders}
    names = list(contenders)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            fn, batches = contenders[name]
            start = time.perf_counter()
            fn(batches)
            speeds[name].append(samples / (time.perf_counter() - start))
    bare = statistics.median(speeds["bare torch"])
    out = []
    for name, s in speeds.items():
        deciles = statistics.quantiles(s, n=10)
        out.append(
            {
                "model": model,
                "impl": name,
                "samples_per_s": statistics.median(s),
                "spread": f"{deciles[0]:,.0f}-{deciles[-1]:,.0f}",
                "vs_bare": statistics.median(s) / bare,
                "runs": s,
            }
        )
    return out


if __name__ == "__main__":
    main()
