"""Top-K recommendations for every user of an ML-10M-shaped model, on one core: `ebb predict
--recommend` (``RatingsModel.recommend``: a matrix product per block of 256 users, seen items
masked in place, the exact lane-bound ``top_k``) against a plain numpy loop (per user: one
matrix-vector product, seen items masked, ``argpartition``).

The model is random (its scores' values do not change the work): 70,000 users × 10,000
items, rank 20, each user with ~143 seen items (ML-10M's 10M ratings / 70k users). BLAS is
held to one thread. The two run in ABBA order (ebb, loop, loop, ebb), each over every
user; the table gives each one's best of two (process CPU time). The share of users for
whom both return the same items is recorded (products of different shapes round
differently: items whose scores tie to the last bit may trade places). Targets: ebb ≥ the
loop, and ≥ 1M user·item scores per second per core.

    python bench/predict.py [--users 70000] [--items 10000] [--rank 20] [--k 10] [--json PATH]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core, before numpy loads
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _common import print_table, result_path, write_json  # noqa: E402

from ebb.predict.artifact import RatingsModel  # noqa: E402

SCORES_TARGET = 1_000_000  # user·item scores per second per core


def make_model(users: int, items: int, rank: int, seen_per_user: int, seed: int = 0) -> RatingsModel:
    rng = np.random.default_rng(seed)
    user = rng.normal(0, 0.3, (users, rank + 1)).astype(np.float32)
    item = rng.normal(0, 0.3, (items, rank + 1)).astype(np.float32)
    counts = rng.poisson(seen_per_user, users).clip(1, items // 2)
    indptr = np.zeros(users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    seen = np.concatenate([np.sort(rng.choice(items, c, replace=False)) for c in counts]).astype(np.int32)
    meta = {"dims": {"rank": rank}, "scoring": {"global_mean": 3.5, "rating_range": [0.5, 5.0]}}
    id_map = {"user": np.arange(1, users + 1, dtype=np.int64), "item": np.arange(1, items + 1, dtype=np.int64)}
    return RatingsModel(meta, {"user": user, "item": item}, id_map, {"indptr": indptr, "items": seen})


def numpy_loop(m: RatingsModel, k: int) -> np.ndarray:
    """The plain way: one user at a time."""
    r = m.rank
    V, b = m.item[:, :r], m.item[:, r]
    out = np.empty((m.num_users, k), dtype=np.int64)
    for u in range(m.num_users):
        s = V @ m.user[u, :r] + b + m.user[u, r] + np.float32(m.mean)
        s[m.seen_items[m.seen_indptr[u] : m.seen_indptr[u + 1]]] = -np.inf
        top = np.argpartition(s, len(s) - k)[len(s) - k :]
        out[u] = top[np.lexsort((top, -s[top]))]
    return out


def ebb_recommend(m: RatingsModel, k: int) -> np.ndarray:
    rec = m.recommend(None, k)
    return (rec["item"] - 1).reshape(m.num_users, k)  # raw ids are 1-based here


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=70_000)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--rank", type=int, default=20)
    ap.add_argument("--seen", type=int, default=143, help="mean seen items per user (default 143, as ML-10M)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--json", help="output JSON path (default bench/results/predict/recommend.json)")
    args = ap.parse_args(argv)

    m = make_model(args.users, args.items, args.rank, args.seen)
    runs: dict[str, list[float]] = {"ebb recommend (blocked)": [], "numpy argpartition loop": []}
    results = {}
    order = ["ebb recommend (blocked)", "numpy argpartition loop", "numpy argpartition loop", "ebb recommend (blocked)"]
    for name in order:  # ABBA
        fn = ebb_recommend if name.startswith("ebb") else numpy_loop
        start = time.process_time()
        results[name] = fn(m, args.k)
        runs[name].append(time.process_time() - start)
    a, b = results.values()
    # Matrix-matrix and matrix-vector products round differently, so two items whose scores
    # differ in the last bit may trade places: the share of users whose top-K lists agree.
    same = float(np.mean([set(x) == set(y) for x, y in zip(a.tolist(), b.tolist())]))
    scores = args.users * args.items
    rows = [
        {
            "method": name,
            "cpu_s": min(t),
            "users_per_s": args.users / min(t),
            "scores_per_s": scores / min(t),
            "runs_s": [round(x, 3) for x in t],
        }
        for name, t in runs.items()
    ]
    print_table(rows, [("method", "method"), ("cpu_s", "CPU s (best of 2)"), ("users_per_s", "users/s"),
                       ("scores_per_s", "user·item scores/s")])  # fmt: skip
    ebb_row, loop_row = rows
    verdict = {
        "speedup_vs_loop": loop_row["cpu_s"] / ebb_row["cpu_s"],
        "ge_loop": ebb_row["cpu_s"] <= loop_row["cpu_s"],
        "scores_per_s_per_core": ebb_row["scores_per_s"],
        "ge_scores_target": ebb_row["scores_per_s"] >= SCORES_TARGET,
        "users_with_same_items": same,
    }
    print(f"\nebb / loop speed-up {verdict['speedup_vs_loop']:.2f}x; {ebb_row['scores_per_s']:,.0f} scores/s/core "
          f"(target ≥ {SCORES_TARGET:,}); users with the same top-{args.k} items: {same:.2%}")  # fmt: skip
    payload = {
        "model": {"users": args.users, "items": args.items, "rank": args.rank, "mean_seen": args.seen, "k": args.k},
        "threads": 1,
        "clock": "process CPU time (one thread)",
        "rows": rows,
        "verdict": verdict,
    }
    write_json(result_path("predict", "recommend"), payload, args.json)


if __name__ == "__main__":
    main()
