"""What a round costs: checkpoint sizes and write/read times at MovieLens-10M shape.

A PMF worker at the ML-10M shape (69,878 users x 10,677 items, rank 20, biases folded in,
SGD + Nesterov momentum, ISP accumulators) writes and reads back its checkpoint exactly
as the engine does (``ebb.engine.replica.state_arrays`` + ``checkpoint.write_worker``),
to a local folder and to S3 on a local moto_server; the supervisor's state is sized for
a job of ``--steps`` steps. Local and moto times measure serialisation and this disk,
not S3 from Lambda: the table adds a modelled S3 time at ``--link-mb-s`` (an assumption,
see docs/ARCHITECTURE.md) and what one round adds to the bill for P workers.

    python bench/checkpoint.py [--workers 8] [--steps 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lambda_src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers: the moto_server stand-in

import torch  # noqa: E402
from _common import print_table, result_path, write_json  # noqa: E402

from ebb.cost.model import Usage, estimate_cost, load_prices  # noqa: E402
from ebb.engine import checkpoint  # noqa: E402
from ebb.engine.isp import SignificanceFilter  # noqa: E402
from ebb.engine.replica import load_state_arrays, state_arrays  # noqa: E402
from ebb.engine.state import SupervisorState  # noqa: E402
from ebb.models.pmf import PMF  # noqa: E402
from ebb.ports.keys import worker_key  # noqa: E402
from ebb.spec import load_spec  # noqa: E402
from ebb.stores import open_object_store  # noqa: E402

USERS, ITEMS, RANK = 69_878, 10_677, 20


def worker_state(seed: int = 0):
    torch.manual_seed(seed)
    model = PMF(USERS, ITEMS, rank=RANK, lr=0.04, momentum=0.8, l2=0.05, init_std=0.1, global_mean=3.5, seed=seed)
    isp = SignificanceFilter(model.params, 0.7, quantize=True)
    for name, p in model.params.items():  # momentum and pending updates as they are mid-job: mostly non-zero
        model.optimizer.buffers[name].copy_(torch.randn_like(p) * 0.01)
        isp.pending[name].copy_(torch.randn_like(p) * 0.001)
    return model, isp


def time_store(store, model, isp, repeat: int) -> dict:
    meta = {
        "worker": 0,
        "job": "bench",
        "model": "pmf",
        "mode": "isp",
        "round": 0,
        "step": 1,
        "cursor": 8,
        "members": list(range(8)),
        "applied_upto": 0,
        "outcome": "unfinished",
    }
    key = worker_key(0, 0)
    writes, reads, size = [], [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        size = checkpoint.write_worker(store, key, meta, state_arrays(model, isp))
        writes.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _, arrays = checkpoint.read_worker(store, key)
        load_state_arrays(model, isp, arrays)
        reads.append(time.perf_counter() - t0)
    return {"bytes": size, "write_s": min(writes), "read_s": min(reads)}


def supervisor_state_bytes(steps: int, workers: int) -> int:
    spec = load_spec(overrides={"model": "pmf", "data": "unused", "workers": workers})
    state = SupervisorState.initial(spec)
    state.history = [
        {
            "step": k,
            "time": k * 0.05,
            "loss": 0.8,
            "epoch": k / 1440,
            "workers": workers,
            "round": 0,
            "bytes_sent": 1_000_000,
            "bytes_received": 7_000_000,
            "sent_fraction": 0.2,
            "cost_usd": 0.01,
        }
        for k in range(steps)
    ]
    state.overheads.sync_samples = [0.001234] * (steps * workers)
    state.overheads.sync_first = [0.000987] * steps
    return len(state.model_dump_json())


def round_cost(workers: int, checkpoint_s: float, memory_mb: int = 1769) -> float:
    """Dollars one more round adds: invocations, state transitions, checkpoint PUTs and GETs,
    and the seconds every worker spends writing then reading its checkpoint."""
    usage = Usage(
        worker_seconds=workers * checkpoint_s,
        memory_mb=memory_mb,
        invocations=workers + 1,
        s3_put=workers + 2,
        s3_get=workers + 2,
        sfn_transitions=4 + 2 * workers,
    )
    return estimate_cost(usage, load_prices())["total_usd"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2000, help="job length for the supervisor state's size")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--link-mb-s", type=float, default=75.0, help="assumed S3 throughput of one Lambda function")
    ap.add_argument("--no-moto", action="store_true", help="skip the moto_server run")
    ap.add_argument("--json", help="output JSON (default bench/results/checkpoint/ml10m-P<workers>.json)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, isp = worker_state()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append({"store": "folder (local disk)", **time_store(open_object_store(tmp), model, isp, args.repeat)})
    if not args.no_moto:
        from tests.helpers.aws import MotoServer, aws_env, server_client

        with MotoServer() as server:
            import os

            os.environ.update(aws_env(server.url))
            server_client(server.url).create_bucket(Bucket="ebb-bench")
            rows.append(
                {
                    "store": "S3 on moto_server (loopback)",
                    **time_store(open_object_store("s3://ebb-bench/ckpt"), model, isp, args.repeat),
                }
            )
    size = rows[0]["bytes"]
    s3_s = 2 * size / (args.link_mb_s * 1e6)  # one write and one read
    rows.append(
        {
            "store": f"S3 from Lambda (modelled, {args.link_mb_s:g} MB/s)",
            "bytes": size,
            "write_s": size / (args.link_mb_s * 1e6),
            "read_s": size / (args.link_mb_s * 1e6),
        }
    )
    for r in rows:
        r["MB"] = r["bytes"] / 1e6
    print(
        f"PMF worker checkpoint at ML-10M shape ({USERS:,} x {ITEMS:,}, rank {RANK}; replica, momentum, "
        "ISP accumulators):\n"
    )
    print_table(rows, [("store", "store"), ("MB", "MB"), ("write_s", "write s"), ("read_s", "read + restore s")])
    sup_bytes = supervisor_state_bytes(args.steps, args.workers)
    per_round = round_cost(args.workers, s3_s)
    print(f"\nsupervisor state after {args.steps:,} steps of {args.workers} workers: {sup_bytes / 1e6:.2f} MB")
    print(
        f"one more round for {args.workers} workers: ${per_round:.5f} (invocations, transitions, "
        f"checkpoint PUT/GET, {s3_s:.2f} s of checkpoint I/O per worker at {args.link_mb_s:g} MB/s)"
    )
    write_json(
        result_path("checkpoint", f"ml10m-P{args.workers}"),
        {
            "rows": rows,
            "workers": args.workers,
            "steps": args.steps,
            "supervisor_state_bytes": sup_bytes,
            "round_cost_usd": per_round,
            "link_mb_s": args.link_mb_s,
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
