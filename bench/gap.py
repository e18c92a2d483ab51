"""Where does Ebb's quality gap to the torch reference come from? Plain-torch variants of
bench/quality.py's references on its splits, each changing one thing towards Ebb's model.

PMF (biased MF, rank 20, Adam lr 0.01, minibatch 1,000, best epoch on validation, a
weight-decay grid): ``opt`` dense Adam (torch.optim.Adam: every row's moments decay and
move it every step) or lazy Adam with per-row bias correction (Ebb's: only the rows a
step touches); ``grad`` sum (the minibatch loss's gradient, torch's) or mean (a recurring
row gets the mean of its ratings' gradients: Ebb's ``hyper.row_grad mean``); ``batches``
reshuffled every epoch (torch's DataLoader) or fixed (Ebb's prepared parts, their order
shuffled). Sparse LR (Criteo-shaped): dense Adam with coupled weight decay on every row
(torch.optim.Adam(weight_decay)), lazy Adam with l2 on the touched rows (Ebb's), lazy
Adam plus a decoupled decay of every row (what a lazily caught-up decay would give), and
lazy Adam scored on an average of its iterates.

    python bench/gap.py pmf --datasets ml-100k,ml-100k-wild
    python bench/gap.py lr --epochs 10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, result_path, write_json  # noqa: E402
from quality import _load, dataset  # noqa: E402

from ebb.data.prepare import take_rows  # noqa: E402
from ebb.models.metrics import logloss, rmse  # noqa: E402
from ebb.stores.local import FolderObjectStore  # noqa: E402

B, BETA1, BETA2, EPS = 1000, 0.9, 0.999, 1e-8
PMF_VARIANTS = {  # name: (optimizer, row gradient, batches)
    "torch": ("dense", "sum", "reshuffled"),
    "torch, fixed batches": ("dense", "sum", "fixed"),
    "lazy Adam, fixed": ("lazy", "sum", "fixed"),
    "lazy Adam, mean, fixed (Ebb row_grad mean)": ("lazy", "mean", "fixed"),
    "dense Adam, mean, fixed": ("dense", "mean", "fixed"),
}
LR_VARIANTS = {  # name: (optimizer, weight decay mode, decoupled decay, iterate average)
    "torch (coupled wd, every row)": ("dense", "coupled", 0.0, 0.0),
    "lazy Adam, l2 on touched rows (Ebb)": ("lazy", "touched", 0.0, 0.0),
    "lazy + decoupled decay 0.01 (caught up)": ("lazy", "touched", 0.01, 0.0),
    "lazy + decoupled decay 0.1": ("lazy", "touched", 0.1, 0.0),
    "lazy, scored on an EMA of iterates (0.01)": ("lazy", "touched", 0.0, 0.01),
    "dense Adam, l2 on touched rows": ("dense", "touched", 0.0, 0.0),
}


def _batches(rng, n: int, fixed: np.ndarray | None) -> list[np.ndarray]:
    if fixed is not None:  # one partition, its parts' order shuffled each epoch
        return [fixed[k * B : (k + 1) * B] for k in rng.permutation((n + B - 1) // B)]
    order = rng.permutation(n)
    return [order[s : s + B] for s in range(0, n, B)]


def _adam(p, m, v, rows, g, lr, step, counts=None):
    """Adam on ``rows`` of p (dense: rows is None and g covers every row)."""
    if rows is None:
        m.mul_(BETA1).add_(g, alpha=1 - BETA1)
        v.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
        p.sub_(lr * (m / (1 - BETA1**step)) / ((v / (1 - BETA2**step)).sqrt() + EPS))
        return
    mr = m[rows].mul_(BETA1).add_(g, alpha=1 - BETA1)
    vr = v[rows].mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
    m[rows], v[rows] = mr, vr
    if counts is not None:  # per-row bias correction (Ebb's PMF)
        n = counts[rows] + 1
        counts[rows] = n
        c1, c2 = (1 - BETA1**n).float(), (1 - BETA2**n).float()
    else:
        c1, c2 = 1 - BETA1**step, 1 - BETA2**step
    p[rows] -= lr * (mr / c1) / ((vr / c2).sqrt() + EPS)


def pmf(name: str, opt: str, grad: str, batches: str, wd: float, epochs: int, lr: float = 0.01, rank: int = 20):
    data = dataset(name)
    store, man = FolderObjectStore(data["prepared"]), data["manifest"]
    splits = {s: _load(store, man, s, "ratings") for s in ("train", "val", "test")}
    t = {
        s: {k: torch.from_numpy(v.astype(np.float32 if k == "rating" else np.int64)) for k, v in d.items()}
        for s, d in splits.items()
    }
    gen = torch.Generator().manual_seed(0)
    tables = {"user": torch.zeros(man.num_users, rank + 1), "item": torch.zeros(man.num_items, rank + 1)}
    for p in tables.values():
        p[:, :rank] = torch.randn(p.shape[0], rank, generator=gen) * 0.1
    state = {
        k: (torch.zeros_like(p), torch.zeros_like(p), torch.zeros(p.shape[0], 1, dtype=torch.float64))
        for k, p in tables.items()
    }
    mu = float(splits["train"]["rating"].mean())
    low, high = float(man.stats["rating_min"]), float(man.stats["rating_max"])

    def predict(u, i):
        pu, pi = tables["user"][u], tables["item"][i]
        return mu + pu[:, rank] + pi[:, rank] + (pu[:, :rank] * pi[:, :rank]).sum(1), pu, pi

    def score(split):
        pred = predict(t[split]["user"], t[split]["item"])[0].clamp(low, high)
        return rmse(pred.numpy(), t[split]["rating"].numpy())

    rng = np.random.default_rng(0)
    n = len(splits["train"]["rating"])
    fixed = rng.permutation(n) if batches == "fixed" else None
    step, curve = 0, []
    for epoch in range(1, epochs + 1):
        for rows in _batches(rng, n, fixed):
            step += 1
            rows = torch.from_numpy(rows)
            u, i, r = (t["train"][k][rows] for k in ("user", "item", "rating"))
            pred, pu, pi = predict(u, i)
            e = (pred - r)[:, None]
            for side, idx, other in (("user", u, pi), ("item", i, pu)):
                d = torch.cat([other[:, :rank] * e, e], 1)
                uniq, inv = torch.unique(idx, return_inverse=True)
                g = torch.zeros(len(uniq), rank + 1).index_add_(0, inv, d)
                count = torch.bincount(inv).float()[:, None]
                x = tables[side][uniq]
                g = g + count * wd * x if grad == "sum" else g / count + wd * x
                m, v, counts = state[side]
                if opt == "dense":
                    full = torch.zeros_like(tables[side])
                    full[uniq] = g
                    _adam(tables[side], m, v, None, full, lr, step)
                else:
                    _adam(tables[side], m, v, uniq, g, lr, step, counts)
        curve.append((epoch, score("val"), score("test")))
    best = min(curve, key=lambda c: c[1])
    return {"best_epoch": best[0], "val": best[1], "test": best[2]}


def sparse_lr(opt: str, wd_mode: str, wd: float, decoupled: float, ema: float, epochs: int, lr: float = 0.01):
    data = dataset("criteo-shaped")
    store, man = FolderObjectStore(data["prepared"]), data["manifest"]
    splits = {s: _load(store, man, s, "sparse") for s in ("train", "val", "test")}
    f = man.num_features
    p = torch.zeros(f + 1)  # the weights, then the bias
    m, v, avg = torch.zeros(f + 1), torch.zeros(f + 1), torch.zeros(f + 1)

    def logits(chunk, params):
        ptr = chunk["indptr"]
        idx = torch.from_numpy(chunk["indices"].astype(np.int64))
        sample = torch.from_numpy(np.repeat(np.arange(len(ptr) - 1), np.diff(ptr)))
        val = torch.from_numpy(chunk["values"].astype(np.float32))
        z = torch.zeros(len(ptr) - 1).index_add_(0, sample, params[idx] * val) + params[f]
        return z, idx, sample, val

    def score(split):
        z = logits(splits[split], avg if ema else p)[0]
        return logloss(torch.sigmoid(z).numpy(), splits[split]["label"])

    rng = np.random.default_rng(0)
    n = len(splits["train"]["label"])
    step, curve = 0, []
    for epoch in range(1, epochs + 1):
        for rows in _batches(rng, n, None):
            step += 1
            chunk = take_rows("sparse", splits["train"], rows)
            z, idx, sample, val = logits(chunk, p)
            gz = (torch.sigmoid(z) - torch.from_numpy(chunk["label"].astype(np.float32))) / len(rows)
            uniq, inv = torch.unique(idx, return_inverse=True)
            g = torch.zeros(f + 1)
            g[uniq] = torch.zeros(len(uniq)).index_add_(0, inv, gz[sample] * val)
            g[f] = gz.sum()
            if wd_mode == "coupled":  # torch.optim.Adam(weight_decay): every row, the bias too
                g += wd * p
            else:
                g[uniq] += wd * p[uniq]
            if opt == "dense":
                _adam(p, m, v, None, g, lr, step)
            else:
                touched = torch.cat([uniq, torch.tensor([f])])
                _adam(p, m, v, touched, g[touched], lr, step)
            if decoupled:
                p[:f].mul_(1 - lr * decoupled)
            if ema:
                avg.add_(p - avg, alpha=ema)
        curve.append((epoch, score("val"), score("test")))
    best = min(curve, key=lambda c: c[1])
    return {"best_epoch": best[0], "val": best[1], "test": best[2]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=["pmf", "lr"])
    ap.add_argument("--datasets", default="ml-100k,ml-latest-small,ml-100k-wild,ml-latest-small-wild")
    ap.add_argument("--wd", default=None, help="weight-decay grid (default pmf 0.1,0.15; lr 1e-5)")
    ap.add_argument("--epochs", type=int, default=None, help="default pmf 30, lr 10")
    ap.add_argument("--label", default=None)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    epochs = args.epochs or (30 if args.model == "pmf" else 10)
    grid = [float(w) for w in (args.wd or ("0.1,0.15" if args.model == "pmf" else "1e-5")).split(",")]
    rows = []
    names = args.datasets.split(",") if args.model == "pmf" else ["criteo-shaped"]
    for name in names:
        variants = PMF_VARIANTS if args.model == "pmf" else LR_VARIANTS
        for variant, setting in variants.items():
            runs = []
            for wd in grid:
                started = time.perf_counter()
                if args.model == "pmf":
                    r = pmf(name, *setting, wd=wd, epochs=epochs)
                else:
                    opt, mode, decoupled, ema = setting
                    r = sparse_lr(opt, mode, wd, decoupled, ema, epochs)
                runs.append({**r, "wd": wd, "host_s": round(time.perf_counter() - started, 1)})
                print(f"   {name} {variant} wd {wd:g}: {runs[-1]}", flush=True)
            best = min(runs, key=lambda r: r["val"])
            rows.append({"dataset": name, "variant": variant, **best, "grid": runs})
    print_table(
        rows,
        [("dataset", "dataset"), ("variant", "variant"), ("wd", "wd"), ("val", "best val"), ("test", "test"),
         ("best_epoch", "epoch")],
    )  # fmt: skip
    write_json(result_path("gap", args.label or args.model), {"rows": rows}, args.json)


if __name__ == "__main__":
    main()
