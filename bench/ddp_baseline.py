"""Baseline: PMF trained with PyTorch DistributedDataParallel (gloo all-reduce).

This is what a PyTorch user would run instead of Ebb: one process per worker on one
machine, ``nn.Embedding`` factors and biases, mean-squared-error loss over the worker's
minibatch, and DDP averaging the gradients of all workers every step (BSP by
construction). The data and its order are Ebb's: the prepared dataset's training parts,
walked in the same ``PartSequence(num_parts, seed)`` order, worker ``r`` of ``P`` taking
position ``step * P + r`` at each step (what Ebb's striping does with a fixed fleet).

Variants:

* ``dense``: dense embedding gradients, ``torch.optim.SGD(momentum=0.9, nesterov=True)``
  (Ebb's optimiser); DDP all-reduces the whole model every step.
* ``sparse``: ``nn.Embedding(sparse=True)`` and ``torch.optim.SparseAdam``. SGD accepts
  sparse gradients only without momentum, and with the mean loss over tens of thousands
  of samples plain SGD needs a learning rate no single value serves (rare users barely
  move while popular items diverge); Adam's per-coordinate scaling removes that, which
  is why a user reaching for sparse embeddings picks SparseAdam.
* ``dense_adam``: dense gradients and ``torch.optim.Adam`` (the whole model all-reduced,
  Adam's per-coordinate steps without SparseAdam's per-step CPU).
* ``sparse_sgd``: sparse embeddings with plain SGD, for completeness.

Sparse logistic regression (``--model sparse_lr``, a prepared LibSVM/Criteo dataset):
``nn.EmbeddingBag(num_features, 1, mode="sum")`` weighted by the feature values, plus a
bias, ``binary_cross_entropy_with_logits`` (mean over the part) + ``l2/2 |w_j|²`` over the
features the part touches (Ebb's regulariser). ``dense``: dense gradients and
``torch.optim.Adam``, DDP all-reduces the whole weight vector each step; ``sparse``:
sparse gradients and ``SparseAdam`` (Ebb's optimiser for this model). The target is the
test log-loss.

Loss (PMF): ``F.mse_loss`` (mean over the worker's part) plus ``l2 * mean(|U_u|² + |V_i|² +
b_u² + b_i²)`` over the rows each sample uses. That is the recommender-code habit, and
with l2 = 0.05 it is exactly Ebb's per-rating regulariser; ``weight_decay`` would not
do, as it shrinks every row at every step in dense SGD and SparseAdam has none.
Without L2 every variant overfits (test RMSE bottoms out at 0.66-0.70, then climbs).

Clock: rank 0 starts it once the process group is up, every rank holds its data in
memory and DDP has broadcast the initial parameters (after a barrier, so all ranks start
together); it stops when the test RMSE first reaches the target. Evaluating the test
split is excluded: rank 0 pauses the clock while it evaluates and the other ranks wait
for its stop/continue broadcast, so nobody trains meanwhile.

Usage: ``python bench/ddp_baseline.py --data DIR --workers 8 --target 0.65`` (PMF) or
``... --model sparse_lr --data DIR --target 0.47``.
``run_ddp`` starts its workers with the ``spawn`` method, so a script calling it needs
the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time

import numpy as np
import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from _common import result_path, write_json
from torch import nn

from ebb.catalogue import CATALOGUE
from ebb.data.format import checksum, decode_batch
from ebb.engine.striping import PartSequence
from ebb.models import auto_hyper
from ebb.ports.manifest import load_manifest
from ebb.stores.local import FolderObjectStore

VARIANTS = ("dense", "dense_adam", "sparse", "sparse_sgd")
OPTIMISERS = {
    "dense": "SGD(momentum=0.9, nesterov=True)",
    "dense_adam": "Adam",
    "sparse": "SparseAdam",
    "sparse_sgd": "SGD (no momentum)",
}
LR_OPTIMISERS = {"dense": "Adam", "sparse": "SparseAdam"}
# Learning rates tuned on the 1M-rating synthetic set (rank 20, 6,250 per part, l2 0.05,
# 4 and 8 workers). The mean loss gives a row a gradient of ~1/(P*B) per sample, hence
# lrs in the tens. The linear scaling rule (lr ∝ P*B) does not apply: the curvature of
# the mean loss along an item's row is ~2 x (the item's share of the samples) x E[UUᵀ],
# whatever P and B, so the stable lr is fixed too, set by the most popular items.
# SGD + Nesterov diverges at lr 100 with 4 and 8 workers; 75 is the largest grid value
# that converges. Plain SGD (no momentum) is stable to about 50 but barely moves the rare
# users (test RMSE 1.01 after 10 epochs); SparseAdam's best is 0.03 (0.01 slower, 0.06+
# plateaus higher).
DEFAULT_LR = {"dense": 75.0, "dense_adam": 0.03, "sparse": 0.03, "sparse_sgd": 50.0}
# Sparse LR: Ebb's own default (SparseAdam lr 0.02) for both; dense Adam sees the same
# per-coordinate scaling, so the same lr serves (LR_TUNE_GRID checks it).
LR_DEFAULT_LR = {"dense": 0.02, "sparse": 0.02}
LR_TUNE_GRID = {"dense": [0.005, 0.01, 0.02, 0.05], "sparse": [0.005, 0.01, 0.02, 0.05]}
TUNE_GRID = {
    "dense": [25.0, 50.0, 75.0, 100.0],
    "sparse_sgd": [25.0, 50.0, 75.0, 100.0],
    "dense_adam": [0.01, 0.03, 0.06],
    "sparse": [0.01, 0.03, 0.06, 0.1],
}


class PMFNet(nn.Module):
    """r̂ = μ + b_u + b_i + U_u · V_i, with μ the training mean (a constant)."""

    def __init__(self, num_users: int, num_items: int, rank: int, mu: float, *, sparse: bool, init_std: float):
        super().__init__()
        self.mu = mu
        self.user = nn.Embedding(num_users, rank, sparse=sparse)
        self.item = nn.Embedding(num_items, rank, sparse=sparse)
        self.user_bias = nn.Embedding(num_users, 1, sparse=sparse)
        self.item_bias = nn.Embedding(num_items, 1, sparse=sparse)
        nn.init.normal_(self.user.weight, std=init_std)
        nn.init.normal_(self.item.weight, std=init_std)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, users: torch.Tensor, items: torch.Tensor):
        """Predictions and the per-sample squared norm of the rows used (for the L2 term)."""
        u, v = self.user(users), self.item(items)
        bu, bi = self.user_bias(users).squeeze(1), self.item_bias(items).squeeze(1)
        pred = (u * v).sum(1) + bu + bi + self.mu
        sq = u.square().sum(1) + v.square().sum(1) + bu.square() + bi.square()
        return pred, sq


class LRNet(nn.Module):
    """p = sigmoid(b + Σ_j x_j w_j) over a sample's hashed features (CSR rows)."""

    def __init__(self, num_features: int, *, sparse: bool):
        super().__init__()
        self.sparse = sparse
        self.weight = nn.EmbeddingBag(num_features, 1, mode="sum", sparse=sparse)
        self.bias = nn.Embedding(1, 1, sparse=sparse)  # an embedding, so SparseAdam can own it too
        nn.init.zeros_(self.weight.weight)
        nn.init.zeros_(self.bias.weight)

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor, rows: torch.Tensor):
        """Logits, and the squared norm of the (distinct) weights the batch touches, for L2."""
        bias = self.bias(torch.zeros(1, dtype=torch.long))[0, 0]
        logits = self.weight(indices, offsets, per_sample_weights=values).squeeze(1) + bias
        # A lookup (not index_select), so the L2 term's gradient is sparse like the loss's.
        touched = F.embedding(rows, self.weight.weight, sparse=self.sparse)
        return logits, touched.square().sum()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _verified_parts(objects, infos):
    """The decoded arrays of each part, its checksum verified."""
    for info in infos:
        raw = objects.get(info.key)
        if checksum(raw) != info.sha256:
            raise RuntimeError(f"dataset part {info.key} does not match its checksum in manifest.json")
        yield decode_batch(raw)


def _load_split(objects, infos) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]:
    """Ratings parts as (user, item, rating, distinct users + distinct items)."""
    return [
        (
            torch.from_numpy(a["user"].astype(np.int64)),
            torch.from_numpy(a["item"].astype(np.int64)),
            torch.from_numpy(a["rating"].astype(np.float32)),
            len(np.unique(a["user"])) + len(np.unique(a["item"])),
        )
        for a in _verified_parts(objects, infos)
    ]


def _load_sparse(objects, infos) -> list[tuple]:
    """LibSVM/Criteo parts as (indices, offsets, values, label, distinct features)."""
    out = []
    for a in _verified_parts(objects, infos):
        indices = torch.from_numpy(a["indices"].astype(np.int64))
        out.append(
            (
                indices,
                torch.from_numpy(a["indptr"][:-1].astype(np.int64)),
                torch.from_numpy(a["values"].astype(np.float32)),
                torch.from_numpy(a["label"].astype(np.float32)),
                torch.unique(indices),
            )
        )
    return out


@torch.no_grad()
def _test_logloss(net: LRNet, test) -> float:
    total, n = 0.0, 0
    for indices, offsets, values, label, rows in test:
        logits, _ = net(indices, offsets, values, rows)
        total += float(F.binary_cross_entropy_with_logits(logits.double(), label.double(), reduction="sum"))
        n += label.numel()
    return total / n


@torch.no_grad()
def _test_rmse(net: PMFNet, test) -> float:
    se, n = 0.0, 0
    for users, items, rating, _ in test:
        pred, _ = net(users, items)
        se += float((pred.double() - rating.double()).square().sum())
        n += rating.numel()
    return math.sqrt(se / n)


def _tensor_bytes(part: tuple) -> int:
    return sum(t.untyped_storage().nbytes() for t in part if isinstance(t, torch.Tensor))


def _preload(objects, parts, load, P: int) -> dict[int, tuple]:
    """Every training part, decoded before the clock starts, when P copies fit in half the free memory.

    Otherwise it holds only the first part and the loop decodes each other part when it first trains on it
    (32 ranks of the 1M-row Criteo-shaped set would each hold 485 MB). Decoding during training
    interleaves long-lived part tensors with each step's freed gradients on glibc's heap:
    with dense PMF gradients every new part then strands about a gradient's worth of heap
    (5.5 MB a part at ML-10M shape, 8 ranks reached 3 GB each and the OOM killer), and
    the page faults of the growing heap added about 40% to a step's CPU. Preloaded,
    a rank's memory stays flat and its steps are what a DDP user would measure.
    """
    first = load(objects, parts[:1])[0]
    need = _tensor_bytes(first) * len(parts) * P
    if need > psutil.virtual_memory().available // 2:
        return {0: first}
    return {0: first, **{i: part for i, part in enumerate(load(objects, parts[1:]), start=1)}}


def _comm_bytes(variant: str, workers: int, params: int, rows: int, dim: int) -> int:
    """Bytes one rank sends for one step's gradient exchange.

    dense: gloo ring all-reduce of the whole model (float32): 2 (P-1)/P x model bytes.
    sparse: gloo's sparse all-reduce coalesces each gradient and all-gathers it (int64
    row indices + float32 rows); in a ring all-gather a rank forwards the P-1 other
    ranks' gradients, about (P-1) x its own: measured from this rank's gradient nnz.
    """
    if workers == 1:
        return 0
    if variant.startswith("dense"):
        return int(2 * (workers - 1) / workers * params * 4)
    if dim == 0:  # sparse LR: one float per distinct feature, with its int64 index
        return (workers - 1) * rows * (8 + 4)
    # Factor rows (dim floats) and bias rows (1 float), each with its int64 index.
    return (workers - 1) * rows * ((8 + 4 * dim) + (8 + 4))


def _worker(r: int, P: int, port: int, cfg: dict, results) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: keep gloo on loopback
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=P)
    _train(r, P, cfg, results)
    # Leave together: a rank that tears its connections down while a peer still holds them
    # can abort the peer (gloo: "terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def _train(r: int, P: int, cfg: dict, results) -> None:
    t_setup = time.perf_counter()
    variant, rank = cfg["variant"], cfg["rank"]
    objects = FolderObjectStore(cfg["data_dir"])
    manifest = load_manifest(objects)
    seq = PartSequence(len(manifest.train.parts), cfg["seed"])
    is_lr = cfg["model"] == "sparse_lr"
    load = _load_sparse if is_lr else _load_split
    parts = manifest.train.parts
    test = load(objects, manifest.test.parts) if r == 0 else []
    train = _preload(objects, parts, load, P)
    preloaded = len(train) == len(parts)

    # Same seed on every rank; DDP broadcasts rank 0's parameters at construction anyway.
    torch.manual_seed(cfg["seed"])
    if is_lr:
        net = LRNet(manifest.num_features, sparse=variant != "dense")
    else:
        net = PMFNet(
            manifest.num_users,
            manifest.num_items,
            rank,
            float(manifest.stats.get("rating_mean", 0.0)),
            sparse=not variant.startswith("dense"),
            init_std=cfg["init_std"],
        )
    model = nn.parallel.DistributedDataParallel(net)
    params = sum(p.numel() for p in net.parameters())
    lr = cfg["lr"]
    if variant == "dense_adam":
        opt = torch.optim.Adam(net.parameters(), lr=lr)
    elif variant == "dense":
        opt = (
            torch.optim.Adam(net.parameters(), lr=lr)
            if is_lr
            else torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, nesterov=True)
        )
    elif variant == "sparse":
        opt = torch.optim.SparseAdam(list(net.parameters()), lr=lr)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=lr)
    l2, target = cfg["l2"], cfg["target"]
    evaluate = (lambda: _test_logloss(net, test)) if is_lr else (lambda: _test_rmse(net, test))

    def part_loss(part):
        """(loss, samples, distinct gradient rows) of one minibatch."""
        if is_lr:
            indices, offsets, values, label, rows = part
            logits, sq = model(indices, offsets, values, rows)
            loss = F.binary_cross_entropy_with_logits(logits, label)
            return (loss + 0.5 * l2 * sq if l2 else loss), label.numel(), rows.numel()
        users, items, rating, rows = part
        pred, sq = model(users, items)
        loss = F.mse_loss(pred, rating)
        return (loss + l2 * sq.mean() if l2 else loss), rating.numel(), rows

    num_parts = seq.num_parts
    max_steps = math.ceil(cfg["max_epochs"] * num_parts / P)
    eval_every = cfg["eval_every"] or max(1, num_parts // (16 * P))  # ~16 evaluations per epoch
    flag = torch.zeros(1)
    curve, sent_bytes, samples = [], 0, 0
    hit = None
    dist.barrier()
    setup_s = time.perf_counter() - t_setup
    clock, eval_s, eval_cpu, load_cpu = 0.0, 0.0, 0.0, 0.0
    step_cpu: list[float] = []  # this rank's process time per step, evaluation excluded
    cpu0 = cpu_mark = time.process_time()
    t0 = time.perf_counter()
    step = 0
    while step < max_steps:
        index = seq.part_at(step * P + r)
        if index not in train:
            train[index] = load(objects, [parts[index]])[0]
            load_cpu += time.process_time() - cpu_mark
            cpu_mark = time.process_time()
        loss, n, rows = part_loss(train[index])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
        samples += n
        step_cpu.append(time.process_time() - cpu_mark)
        # Sparse: coalesced gradient rows = the distinct rows of the part (counted at load).
        sent_bytes += _comm_bytes(variant, P, params, rows, 0 if is_lr else rank)
        cpu_mark = time.process_time()
        step += 1
        if step % eval_every and step < max_steps:
            continue
        if r == 0:
            now, now_cpu = time.perf_counter(), time.process_time()
            clock += now - t0
            metric = evaluate()  # test RMSE (PMF) or test log-loss (sparse LR)
            curve.append({"step": step, "epoch": step * P / num_parts, "seconds": clock, "test_metric": metric})
            if hit is None and metric <= target:
                hit = curve[-1]
            reached = hit is not None and cfg["stop_at_target"]
            stop = reached or clock >= cfg["max_seconds"] or not math.isfinite(metric)
            flag.fill_(float(stop))
            t0 = time.perf_counter()
            eval_s += t0 - now
            eval_cpu += time.process_time() - now_cpu
        dist.broadcast(flag, src=0)  # the other ranks wait here while rank 0 evaluates
        cpu_mark = time.process_time()  # rank 0's scoring and the wait for it are not a step's work
        if flag.item():
            break
    if r == 0:
        clock += time.perf_counter() - t0
    train_cpu = time.process_time() - cpu0 - eval_cpu - load_cpu
    # With a core per rank a step takes as long as its busiest rank: max over ranks, step by step.
    per_step = torch.tensor(step_cpu, dtype=torch.float64)
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX)
    critical_cpu = float(per_step.sum())
    # Every rank's traffic, samples and CPU time, summed outside the clock.
    totals = torch.tensor([float(sent_bytes), float(samples), train_cpu], dtype=torch.float64)
    dist.all_reduce(totals)
    traffic, samples, train_cpu = totals.tolist()
    if r != 0:
        return
    final = curve[-1]["test_metric"] if curve else float("nan")
    if not math.isfinite(final):
        status = "diverged"
    elif hit is not None and cfg["stop_at_target"]:
        status = "target"
    else:
        status = "max_seconds" if clock >= cfg["max_seconds"] else "max_epochs"
    results.put(
        {
            "variant": variant,
            "workers": P,
            "optimizer": (LR_OPTIMISERS if is_lr else OPTIMISERS)[variant],
            "lr": lr,
            "l2": l2,
            "rank": rank,
            "batch_size": manifest.batch_size,
            "train_parts": num_parts,
            "seed": cfg["seed"],
            "model": cfg["model"],
            "metric": "logloss" if is_lr else "rmse",
            "status": status,
            "target": target,
            "reached": hit is not None,
            "time_to_target_s": hit["seconds"] if hit else None,
            "steps_to_target": hit["step"] if hit else None,
            "epochs_to_target": hit["epoch"] if hit else None,
            "final_test_metric": final,
            "best_test_metric": min((c["test_metric"] for c in curve), default=float("nan")),
            "steps": step,
            "epochs": step * P / num_parts,
            "train_seconds": clock,
            "eval_seconds": eval_s,
            "setup_seconds": setup_s,
            "preloaded": preloaded,  # rank 0's: every part decoded before the clock (see _preload)
            "samples_per_s": samples / clock if clock else 0.0,
            "step_ms": 1000 * clock / step if step else 0.0,
            "eval_every": eval_every,
            # CPU one rank spends per step (all ranks' process time / ranks / steps): what a step
            # would take with a core per rank and a free network.
            "cpu_ms_per_worker_step": 1000 * train_cpu / P / step if step else None,
            "cpu_ms_critical_per_step": 1000 * critical_cpu / step if step else None,
            "model_params": params,
            "bytes_per_step_per_rank": traffic / P / step if step else 0.0,
            "bytes_exchanged_total": traffic,
            "mb_exchanged": traffic / 1e6,
            "bytes_method": (
                "ring all-reduce, 2(P-1)/P x float32 model, per rank"
                if variant.startswith("dense")
                else "measured gradient nnz (distinct rows x (int64 index + float32 row)) x (P-1), ring all-gather"
            ),
            "clock": "from after process-group init, in-memory data load and DDP parameter broadcast; "
            "test evaluation excluded",
            "curve": curve,
        }
    )


def run_ddp(
    data_dir,
    workers: int,
    target: float,
    *,
    model: str = "pmf",
    variant: str = "dense",
    rank: int = 20,
    lr: float | None = None,
    max_seconds: float = 600.0,
    max_epochs: float = 20.0,
    seed: int = 0,
    eval_every: int | None = None,
    l2: float | None = None,
    init_std: float | None = None,
    stop_at_target: bool = True,
) -> dict:
    """Train ``model`` (pmf | sparse_lr) with DDP on ``workers`` local processes; rank 0's measurements.

    ``target`` is a test RMSE (pmf) or test log-loss (sparse_lr). ``lr`` None takes the
    tuned default for the variant; ``l2`` None is Ebb's default for the model (PMF's: from the data).
    ``eval_every`` is in steps (None: about 16 test evaluations per epoch). With
    ``stop_at_target`` False the run goes on to ``max_epochs`` / ``max_seconds`` so the
    final metric shows where the baseline converges.
    """
    kinds = {"pmf": "ratings", "sparse_lr": "sparse"}
    if model not in kinds:
        raise ValueError(f"unknown model {model!r}; expected pmf or sparse_lr")
    allowed = VARIANTS if model == "pmf" else tuple(LR_DEFAULT_LR)
    if variant not in allowed:
        raise ValueError(f"unknown {model} variant {variant!r}; expected one of {', '.join(allowed)}")
    manifest = load_manifest(FolderObjectStore(data_dir))  # fail here, not in every worker
    if manifest.kind != kinds[model]:
        raise ValueError(f"{model} needs a {kinds[model]} dataset, {data_dir} holds {manifest.kind} data")
    cfg = {
        "data_dir": str(data_dir),
        "model": model,
        "variant": variant,
        "rank": rank,
        "seed": seed,
        "target": target,
        "lr": lr if lr is not None else (DEFAULT_LR if model == "pmf" else LR_DEFAULT_LR)[variant],
        "max_seconds": max_seconds,
        "max_epochs": max_epochs,
        "eval_every": eval_every,
        "l2": l2 if l2 is not None else {**CATALOGUE[model].hyper, **auto_hyper(model, manifest)}["l2"],
        "init_std": init_std if init_std is not None else CATALOGUE["pmf"].hyper["init_std"],
        "stop_at_target": stop_at_target,
    }
    ctx = mp.get_context("spawn")  # fork after torch has started threads is unsafe
    results = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(workers, _free_port(), cfg, results), nprocs=workers, start_method="spawn")
    return results.get()


def tune_lr(
    data_dir, workers: int, variant: str, *, model: str = "pmf", rank: int, epochs: float, seed: int, l2: float | None
) -> dict:
    """Short runs over the variant's grid; the lr with the lowest test metric after ``epochs``."""
    trials = []
    for lr in (TUNE_GRID if model == "pmf" else LR_TUNE_GRID)[variant]:
        res = run_ddp(
            data_dir,
            workers,
            0.0,
            model=model,
            variant=variant,
            rank=rank,
            lr=lr,
            max_epochs=epochs,
            seed=seed,
            l2=l2,
            stop_at_target=False,
        )
        trials.append({"lr": lr, "final_test_metric": res["final_test_metric"]})
        print(
            f"  tune {variant:10s} lr={lr:<8g} test {res['metric']} after {epochs:g} epochs: "
            f"{res['final_test_metric']:.4f}",
            flush=True,
        )
    ok = [t for t in trials if math.isfinite(t["final_test_metric"])]
    best = min(ok, key=lambda t: t["final_test_metric"]) if ok else trials[0]
    return {"best": best, "trials": trials, "epochs": epochs}


def _json_safe(x):
    """NaN / inf (a diverged run) as null, so the file is strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict]) -> None:
    print(
        f"{'variant':11s} {'optimizer':33s} {'lr':>9s} {'workers':>7s} {'to target (s)':>13s} "
        f"{'epochs':>6s} {'final metric':>12s} {'steps':>6s} {'MB exchanged':>12s} {'samples/s':>10s}"
    )
    for r in rows:
        print(
            f"{r['variant']:11s} {r['optimizer']:33s} {r['lr']:9.4g} {r['workers']:7d} "
            f"{_fmt(r['time_to_target_s'], '13.2f')} {_fmt(r['epochs_to_target'], '6.2f')} "
            f"{r['final_test_metric']:12.4f} {r['steps']:6d} {r['bytes_exchanged_total'] / 1e6:12.1f} "
            f"{r['samples_per_s']:10.0f}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="prepared dataset folder (ebb prepare --out)")
    ap.add_argument("--model", choices=["pmf", "sparse_lr"], default="pmf")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--target", type=float, required=True, help="test RMSE (pmf) or test log-loss (sparse_lr)")
    ap.add_argument("--rank", type=int, default=CATALOGUE["pmf"].hyper["rank"])
    ap.add_argument("--lr", type=float, default=None, help="override the tuned learning rate (all variants)")
    ap.add_argument(
        "--l2",
        type=float,
        default=None,
        help="L2 on the rows each sample uses, added to the mean loss (default: Ebb's for the model)",
    )
    ap.add_argument("--max-seconds", type=float, default=600.0)
    ap.add_argument("--max-epochs", type=float, default=20.0)
    ap.add_argument("--eval-every", type=int, default=None, help="steps between test evaluations")
    ap.add_argument(
        "--variants", default="dense,sparse", help=f"comma list of {', '.join(VARIANTS)} (sparse_lr: dense, sparse)"
    )
    ap.add_argument("--no-stop", action="store_true", help="keep training after the target to see the final metric")
    ap.add_argument("--tune", action="store_true", help="grid-search the lr first (short runs), then run with the best")
    ap.add_argument("--tune-epochs", type=float, default=3.0)
    ap.add_argument(
        "--json", help="output JSON (default bench/results/ddp_baseline/<model>-P<workers>-<variants>.json)"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    allowed = VARIANTS if args.model == "pmf" else tuple(LR_DEFAULT_LR)
    for v in variants:
        if v not in allowed:
            ap.error(f"unknown {args.model} variant {v!r}; expected one of {', '.join(allowed)}")
    rows, tuning = [], {}
    for v in variants:
        lr = args.lr
        if args.tune:
            tuning[v] = tune_lr(
                args.data,
                args.workers,
                v,
                model=args.model,
                rank=args.rank,
                epochs=args.tune_epochs,
                seed=args.seed,
                l2=args.l2,
            )
            lr = tuning[v]["best"]["lr"]
        res = run_ddp(
            args.data,
            args.workers,
            args.target,
            model=args.model,
            variant=v,
            rank=args.rank,
            lr=lr,
            max_seconds=args.max_seconds,
            max_epochs=args.max_epochs,
            seed=args.seed,
            eval_every=args.eval_every,
            l2=args.l2,
            stop_at_target=not args.no_stop,
        )
        rows.append(res)
        print(
            f"{v}: {res['optimizer']} lr={res['lr']:.4g}, "
            f"{'reached' if res['reached'] else 'did not reach'} {args.target} "
            f"after {_fmt(res['time_to_target_s'], '.2f')} s; final test {res['metric']} "
            f"{res['final_test_metric']:.4f} ({res['steps']} steps, {res['epochs']:.2f} epochs, "
            f"setup {res['setup_seconds']:.1f} s)",
            flush=True,
        )
    print()
    print_table(rows)
    print("clock: " + rows[0]["clock"] if rows else "")
    label = f"{args.model}-P{args.workers}-{'-'.join(variants)}"
    write_json(result_path("ddp_baseline", label), _json_safe({"results": rows, "tuning": tuning}), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
