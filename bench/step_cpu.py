"""CPU per worker-step of BSP and ISP, phase by phase, side by side in one process.

Replays what P workers do each step with the engine's own classes — the model's local
update, the significance filter (ISP), encoding the payload, decoding the P−1 peers'
payloads and adding the row-wise mean (``RowMean``) — on the bench's prepared PMF
data (bench/sync.py's shapes), without Redis, processes or messages. Every phase is
timed in process CPU time, so other load on the machine barely moves the figures. BSP
and ISP run alternately over the same steps (``--repeats`` times; the median is kept),
so both see the same machine.

    python bench/step_cpu.py                 # ML-10M shape, 8 workers, 120 steps (≈2 min)
    python bench/step_cpu.py --quick         # 1M ratings, 60 steps
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_json  # noqa: E402
from sync import dataset  # noqa: E402

from ebb.engine.aggregate import RowMean  # noqa: E402
from ebb.engine.isp import SignificanceFilter  # noqa: E402
from ebb.engine.striping import PartSequence  # noqa: E402
from ebb.engine.worker import PartCache, load_manifest  # noqa: E402
from ebb.models import build_model  # noqa: E402
from ebb.sparse import RowUpdate  # noqa: E402
from ebb.spec import load_spec  # noqa: E402
from ebb.stores.local import FolderObjectStore  # noqa: E402

PHASES = ("compute", "filter", "encode", "decode", "apply")


def run_mode(data_dir: str, mode: str, workers: int, steps: int, v: float, seed: int) -> dict:
    """Train ``steps`` steps of ``workers`` simulated workers; CPU seconds by phase (all workers)."""
    spec = load_spec(overrides={"model": "pmf", "data": data_dir, "workers": workers, "hyper.rank": 20,
                                "sync.mode": mode, "sync.significance": v, "seed": seed})
    objects = FolderObjectStore(data_dir)
    manifest = load_manifest(objects)
    models = [build_model("pmf", manifest, spec.hyper, seed) for _ in range(workers)]
    parts = PartCache(objects, manifest, models[0])
    sequence = PartSequence(len(manifest.train.parts), seed)
    batches = [parts.get(sequence.part_at(i)) for i in range(steps * workers)]  # converted before timing
    filters = [SignificanceFilter(m.params, v, spec.sync.quantize) if mode == "isp" else None for m in models]
    means = [RowMean(m.params) for m in models]
    cpu = dict.fromkeys(PHASES, 0.0)
    sent = 0

    def lap(phase, t0):
        now = time.process_time()
        cpu[phase] += now - t0
        return now

    for t in range(steps):
        own, payloads = [], []
        for w, (model, flt) in enumerate(zip(models, filters)):
            t0 = time.process_time()
            _, _, update = model.local_update(batches[t * workers + w])
            t0 = lap("compute", t0)
            out = flt(update, model.params, t) if flt else update
            t0 = lap("filter", t0)
            payloads.append(out.encode())
            lap("encode", t0)
            own.append(update)
            sent += len(payloads[-1])
        for w, (model, mean) in enumerate(zip(models, means)):
            t0 = time.process_time()
            contributions = [own[q] if q == w else RowUpdate.decode(payloads[q]) for q in range(workers)]
            t0 = lap("decode", t0)
            mean.apply(model.params, contributions)
            lap("apply", t0)
    per = {k: 1000 * s / (steps * workers) for k, s in cpu.items()}
    return {"mode": mode, **{f"{k}_ms": val for k, val in per.items()}, "total_ms": sum(per.values()),
            "kb_sent_per_worker_step": sent / 1e3 / (steps * workers),
            "replica_checksum": float(sum(p.double().sum() for p in models[0].params.values()))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1M ratings, 60 steps")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 120; 60 with --quick)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--isp-v", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="", help="a tag stored with the results (e.g. before/after)")
    ap.add_argument("--json", help="output JSON (default bench/results/step_cpu[-quick].json)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # a worker is one process on one core, as in a real run
    shape = "quick" if args.quick else "ml10m"
    steps = args.steps or (60 if args.quick else 120)
    data_dir, _ = dataset(shape, args.seed)
    runs: dict[str, list[dict]] = {"bsp": [], "isp": []}
    for _ in range(args.repeats):
        for mode in runs:  # alternately, so both see the same machine
            runs[mode].append(run_mode(data_dir, mode, args.workers, steps, args.isp_v, args.seed))
    rows = []
    for mode, rs in runs.items():
        row = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "mode"}
        rows.append({"mode": mode, **row})
    print_table(rows, [("mode", "sync"), *((f"{p}_ms", f"{p} ms") for p in PHASES), ("total_ms", "CPU ms/worker-step"),
                       ("kb_sent_per_worker_step", "KB sent")])
    ratio = rows[1]["total_ms"] / rows[0]["total_ms"]
    print(f"\nISP/BSP CPU per worker-step at {args.workers} workers: {ratio:.3f}× (target ≤ 1.15)")
    write_json("step_cpu-quick" if args.quick else "step_cpu",
               {"shape": shape, "workers": args.workers, "steps": steps, "repeats": args.repeats,
                "isp_v": args.isp_v, "label": args.label, "rows": rows, "isp_over_bsp": ratio}, args.json)


if __name__ == "__main__":
    main()
