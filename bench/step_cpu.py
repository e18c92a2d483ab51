"""CPU per worker-step, phase by phase, and the busiest worker's CPU per step (issue 28).

Replays what P workers do each step with the engine's own classes — the model's local
update, the significance filter (ISP), encoding the payload, and applying the step's
row-wise mean (``RowMean``) — on the bench's prepared PMF data (bench/sync.py's shapes),
without Redis, processes or messages. Every phase is timed in thread CPU time, so other
load on the machine barely moves the figures. Each code and mode runs in turn over the
same steps, ABBA (the order reversed every other repeat; the median is kept). A tree
with ``RowMean.apply_wire`` applies the encoded payloads in one compiled call ("apply",
decoding included); an older one decodes each payload ("decode") and then applies.

    python bench/step_cpu.py                 # ML-10M shape, 8 workers, BSP and ISP, 120 steps
    python bench/step_cpu.py --quick         # 1M ratings, 60 steps

``--before DIR`` (a source tree's ``lambda_src``: ``git worktree add --detach /tmp/base
main``) runs each replay in a subprocess, under that tree's engine and this one's;
``--reduce`` adds option (a), one reducer merging the step's payloads for everyone
(see ``run_mode``). The JSON keeps, per fleet size, mode and code, the CPU by phase, the
busiest worker's CPU per step, the step on the fleet clock, and bytes sent and read:

    python bench/step_cpu.py --workers 8,16,32 --modes isp --steps 20 --repeats 2 \
        --before /tmp/base/lambda_src --reduce   # bench/results/step_cpu/ml10m-P8-16-32-vs-before.json

With ``--native-vs-numpy`` the two codes are this engine with its compiled kernels
(``python -m ebb.native`` builds them) and without them (``EBB_NATIVE=0``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, result_path, write_json  # noqa: E402
from sync import dataset  # noqa: E402

from ebb.engine.aggregate import RowMean  # noqa: E402
from ebb.engine.fleet_clock import MB, Links, WorkerStep, barrier_step_seconds  # noqa: E402
from ebb.engine.isp import SignificanceFilter  # noqa: E402
from ebb.engine.parts import PartCache  # noqa: E402
from ebb.engine.striping import PartSequence  # noqa: E402
from ebb.models import build_model  # noqa: E402
from ebb.ports.manifest import load_manifest  # noqa: E402
from ebb.sparse import RowUpdate, apply_update  # noqa: E402
from ebb.spec import load_spec  # noqa: E402
from ebb.stores.local import FolderObjectStore  # noqa: E402

try:
    from ebb.native import available as native_available
except ImportError:  # a --before tree from before the compiled kernels

    def native_available() -> bool:
        return False


PHASES = ("compute", "filter", "encode", "decode", "apply", "reduce")


def _apply_kind(requested: str | None) -> str:
    """How this tree's workers apply a step: "wire" (the compiled apply of the encoded
    payloads, ``RowMean.apply_wire``) where it has it, else "decode" (each payload decoded,
    then ``RowMean.apply``); "reduce" only when asked."""
    if requested:
        return requested
    return "wire" if hasattr(RowMean, "apply_wire") else "decode"


def run_mode(data_dir: str, mode: str, workers: int, steps: int, v: float | None, seed: int, apply: str | None = None):
    """Train ``steps`` steps of ``workers`` simulated workers; CPU by phase per worker-step,
    the busiest worker's CPU per step, bytes, and the step on the fleet clock.

    ``apply`` "reduce" is option (a) of issue 28: one reducer merges the step's P payloads
    into one (the same compiled kernel, over all P, into a zeroed table; the merged rows
    found and encoded as float32, exact), and every worker fetches and applies only that
    one. The reducer's CPU lies on the step's critical path, between the workers' writes
    and their reads, so the busiest worker's step is its own CPU plus the reducer's.
    """
    overrides = {
        "model": "pmf",
        "data": data_dir,
        "workers": workers,
        "hyper.rank": 20,
        "sync.mode": mode,
        "seed": seed,
    }
    if v is not None:
        overrides["sync.significance"] = v
    spec = load_spec(overrides=overrides)
    apply = _apply_kind(apply)
    objects = FolderObjectStore(data_dir)
    manifest = load_manifest(objects)
    models = [build_model("pmf", manifest, spec.hyper, seed) for _ in range(workers)]
    parts = PartCache(objects, manifest, models[0])
    sequence = PartSequence(len(manifest.train.parts), seed)
    batches = [parts.get(sequence.part_at(i)) for i in range(steps * workers)]  # converted before timing
    quantize, threshold = spec.sync.quantize, spec.sync.significance
    filters = [SignificanceFilter(m.params, threshold, quantize) if mode == "isp" else None for m in models]
    combine, cap = spec.sync.combine, spec.sync.sum_cap
    means = [RowMean(m.params, combine, cap) for m in models]
    merged = {n: torch.zeros_like(p) for n, p in models[0].params.items()}  # the reducer's table (option a)
    merger = RowMean(merged, combine, cap)
    links = Links()
    cpu = dict.fromkeys(PHASES, 0.0)
    sent = read = busiest = fleet = 0.0
    clock = time.thread_time

    for t in range(steps):
        own, payloads, used = [], [], [0.0] * workers
        for w, (model, flt) in enumerate(zip(models, filters)):
            t0 = clock()
            _, _, update = model.local_update(batches[t * workers + w])
            t1 = clock()
            out = flt(update, model.params, t) if flt else update
            t2 = clock()
            payloads.append(out.encode())
            t3 = clock()
            own.append(update)
            cpu["compute"] += t1 - t0
            cpu["filter"] += t2 - t1
            cpu["encode"] += t3 - t2
            used[w] += t3 - t0
        sizes = [len(p) for p in payloads]
        sent += sum(sizes)
        reduce_s, reads = 0.0, [sum(sizes) - sizes[w] for w in range(workers)]
        if apply == "reduce":
            t0 = clock()
            merger.apply_wire(merged, payloads)
            rows = {}
            for name, table in merged.items():
                rows[name] = torch.nonzero(table.any(dim=1)).squeeze(1)
            one = RowUpdate({n: (r, merged[n].index_select(0, r)) for n, r in rows.items()}).encode()
            for name, r in rows.items():
                merged[name].index_fill_(0, r, 0.0)
            reduce_s = clock() - t0
            cpu["reduce"] += reduce_s
            reads = [len(one)] * workers
        for w, (model, mean) in enumerate(zip(models, means)):
            t0 = clock()
            if apply == "reduce":
                apply_update(model.params, RowUpdate.decode(one))
                t1 = t0
            elif apply == "wire":
                t1 = t0
                mean.apply_wire(model.params, [own[q] if q == w else payloads[q] for q in range(workers)])
            else:
                contributions = [own[q] if q == w else RowUpdate.decode(payloads[q]) for q in range(workers)]
                t1 = clock()
                mean.apply(model.params, contributions)
            t2 = clock()
            cpu["decode"] += t1 - t0
            cpu["apply"] += t2 - t1
            used[w] += t2 - t0
        read += sum(reads)
        busiest += max(used) + reduce_s
        # The step on the fleet clock: each worker's CPU and bytes on its own vCPU and link.
        if apply == "reduce":  # write, the reducer reads all and writes one, everyone reads it
            up = [WorkerStep(used[w], sizes[w], 0, 1) for w in range(workers)]
            down = sum(sizes) / (links.link_mb_s * MB) + reduce_s + reads[0] / (links.link_mb_s * MB)
            fleet += (
                barrier_step_seconds(up, links)
                + down
                + 2 * links.rtt_ms / 1e3
                + barrier_step_seconds([WorkerStep(0.0, 0, r, 1) for r in reads], links)
            )
        else:
            fleet += barrier_step_seconds([WorkerStep(used[w], sizes[w], reads[w], 2) for w in range(workers)], links)
    per = {k: 1000 * s / (steps * workers) for k, s in cpu.items()}
    per["reduce"] = 1000 * cpu["reduce"] / steps  # the reducer's, per step
    return {
        "mode": mode,
        "apply": apply,
        **{f"{k}_ms": val for k, val in per.items()},
        "total_ms": sum(val for k, val in per.items() if k != "reduce"),
        "busiest_ms": 1000 * busiest / steps,
        "fleet_step_ms": 1000 * fleet / steps,
        "kb_sent_per_worker_step": sent / 1e3 / (steps * workers),
        "kb_read_per_worker_step": read / 1e3 / (steps * workers),
        "significance": threshold if mode == "isp" else None,
        "native_kernels": native_available(),
        "replica_checksum": float(sum(p.double().sum() for p in models[0].params.values())),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1M ratings, 60 steps")
    ap.add_argument("--workers", default="8", help="fleet sizes, comma-separated (e.g. 8,16,32)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 120; 60 with --quick)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="bsp,isp", help="sync modes, comma-separated")
    ap.add_argument(
        "--isp-v", type=float, default=None, help="ISP's threshold (default: the model's, sync.significance)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="", help="a tag stored with the results (e.g. before/after)")
    ap.add_argument(
        "--json",
        help="output JSON (default bench/results/step_cpu/<shape>-P<workers>[-native-vs-numpy|-vs-before].json)",
    )
    ap.add_argument("--before", metavar="DIR", help="also replay the engine of this lambda_src tree, interleaved")
    ap.add_argument(
        "--reduce",
        action="store_true",
        help="also replay option (a), one reducer merging the step's payloads for everyone (this tree)",
    )
    ap.add_argument(
        "--native-vs-numpy",
        action="store_true",
        help="replay this engine with its compiled kernels and without (EBB_NATIVE=0), interleaved",
    )
    ap.add_argument("--one", choices=("bsp", "isp"), help=argparse.SUPPRESS)  # a subprocess's single run
    ap.add_argument("--apply", choices=("wire", "decode", "reduce"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # a worker is one process on one core, as in a real run
    shape = "quick" if args.quick else "ml10m"
    steps = args.steps or (60 if args.quick else 120)
    fleets = [int(w) for w in str(args.workers).split(",")]
    modes = args.modes.split(",")
    data_dir, _ = dataset(shape, args.seed)
    if args.one:
        print(json.dumps(run_mode(data_dir, args.one, fleets[0], steps, args.isp_v, args.seed, args.apply)))
        return
    here = str(Path(__file__).resolve().parents[1] / "lambda_src")
    # code label -> (lambda_src tree, extra environment, apply) of a subprocess, or None: this process
    trees: dict[str, tuple[str, dict, str | None] | None] = {"": None}
    if args.before:
        trees = {"before": (args.before, {}, None), "after": (here, {}, None)}
    elif args.native_vs_numpy:
        trees = {"numpy": (here, {"EBB_NATIVE": "0"}, None), "native": (here, {}, None)}
    if args.reduce:
        trees = {k: v or (here, {}, None) for k, v in trees.items()}
        trees["reduce"] = (here, {}, "reduce")
    rows = []
    for workers in fleets:
        runs: dict[tuple[str, str], list[dict]] = {(code, mode): [] for mode in modes for code in trees}
        order = list(runs)
        for r in range(args.repeats):
            for code, mode in order if r % 2 == 0 else order[::-1]:  # ABBA: every code sees the same machine
                if trees[code] is None:
                    result = run_mode(data_dir, mode, workers, steps, args.isp_v, args.seed)
                else:
                    result = _run_tree(*trees[code], mode, args, steps, workers)
                runs[code, mode].append(result)
                print(f"P={workers} {code or 'this'} {mode}: busiest {result['busiest_ms']:.2f} ms", flush=True)
        for (code, mode), rs in runs.items():
            row = {
                k: rs[0][k] if not isinstance(rs[0][k], float) else statistics.median(r[k] for r in rs)
                for k in rs[0]
                if k != "mode"
            }
            rows.append({"workers": workers, **({"code": code} if code else {}), "mode": mode, **row})
    print()
    print_table(
        rows,
        [
            ("workers", "P"),
            *([("code", "code")] if len(trees) > 1 else []),
            ("mode", "sync"),
            *((f"{p}_ms", f"{p} ms") for p in PHASES),
            ("total_ms", "CPU ms/worker-step"),
            ("busiest_ms", "busiest ms/step"),
            ("fleet_step_ms", "fleet ms/step"),
            ("kb_sent_per_worker_step", "KB sent"),
            ("kb_read_per_worker_step", "KB read"),
        ],
    )
    ratios: dict[str, float] = {}
    if args.before:
        print()
        for workers in fleets:
            for mode in modes:
                pick = {r["code"]: r for r in rows if r["workers"] == workers and r["mode"] == mode}
                for code in [c for c in trees if c != "before"]:
                    key = f"P{workers}-{mode}-{code}"
                    ratios[key] = pick[code]["busiest_ms"] / pick["before"]["busiest_ms"]
                    print(f"{key}: busiest worker's CPU per step {ratios[key]:.3f}× before (target ≤ 0.333 at P=8)")
    versus = "-native-vs-numpy" if args.native_vs_numpy else "-vs-before" if args.before else ""
    write_json(
        result_path("step_cpu", f"{shape}-P{'-'.join(map(str, fleets))}{versus}"),
        {
            "shape": shape,
            "workers": fleets,
            "steps": steps,
            "repeats": args.repeats,
            "isp_v": args.isp_v,
            "label": args.label,
            "before": args.before,
            "rows": rows,
            "busiest_over_before": ratios,
        },
        args.json,
    )


def _run_tree(src: str, env: dict, apply: str | None, mode: str, args, steps: int, workers: int) -> dict:
    """One ``run_mode`` in a subprocess that imports the engine from ``src`` (``env`` added)."""
    cmd = [
        sys.executable,
        __file__,
        "--one",
        mode,
        "--workers",
        str(workers),
        "--steps",
        str(steps),
        "--seed",
        str(args.seed),
        *(["--isp-v", str(args.isp_v)] if args.isp_v is not None else []),
        *(["--apply", apply] if apply else []),
        *(["--quick"] if args.quick else []),
    ]
    out = subprocess.run(cmd, env={**os.environ, **env, "PYTHONPATH": src}, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
