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

With ``--before DIR`` (a source tree's ``lambda_src``, e.g. from ``git archive <commit>
lambda_src | tar -x -C /tmp/before``) each run is a subprocess, and the same replay runs
under that tree's engine and this one's, interleaved (bsp before, bsp after, isp before,
isp after, per repeat), so both codes see the same machine:

    python bench/step_cpu.py --before /tmp/before/lambda_src    # bench/results/step_cpu/ml10m-P8-vs-before.json

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
from ebb.engine.isp import SignificanceFilter  # noqa: E402
from ebb.engine.parts import PartCache  # noqa: E402
from ebb.engine.striping import PartSequence  # noqa: E402
from ebb.models import build_model  # noqa: E402
from ebb.ports.manifest import load_manifest  # noqa: E402
from ebb.sparse import RowUpdate  # noqa: E402
from ebb.spec import load_spec  # noqa: E402
from ebb.stores.local import FolderObjectStore  # noqa: E402

try:
    from ebb.native import available as native_available
except ImportError:  # a --before tree from before the compiled kernels

    def native_available() -> bool:
        return False


PHASES = ("compute", "filter", "encode", "decode", "apply")


def run_mode(data_dir: str, mode: str, workers: int, steps: int, v: float, seed: int) -> dict:
    """Train ``steps`` steps of ``workers`` simulated workers; CPU seconds by phase (all workers)."""
    spec = load_spec(
        overrides={
            "model": "pmf",
            "data": data_dir,
            "workers": workers,
            "hyper.rank": 20,
            "sync.mode": mode,
            "sync.significance": v,
            "seed": seed,
        }
    )
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
    return {
        "mode": mode,
        **{f"{k}_ms": val for k, val in per.items()},
        "total_ms": sum(per.values()),
        "kb_sent_per_worker_step": sent / 1e3 / (steps * workers),
        "native_kernels": native_available(),
        "replica_checksum": float(sum(p.double().sum() for p in models[0].params.values())),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1M ratings, 60 steps")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 120; 60 with --quick)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--isp-v", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="", help="a tag stored with the results (e.g. before/after)")
    ap.add_argument(
        "--json",
        help="output JSON (default bench/results/step_cpu/<shape>-P<workers>[-native-vs-numpy|-vs-before].json)",
    )
    ap.add_argument("--before", metavar="DIR", help="also replay the engine of this lambda_src tree, interleaved")
    ap.add_argument(
        "--native-vs-numpy",
        action="store_true",
        help="replay this engine with its compiled kernels and without (EBB_NATIVE=0), interleaved",
    )
    ap.add_argument("--one", choices=("bsp", "isp"), help=argparse.SUPPRESS)  # a subprocess's single run
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # a worker is one process on one core, as in a real run
    shape = "quick" if args.quick else "ml10m"
    steps = args.steps or (60 if args.quick else 120)
    data_dir, _ = dataset(shape, args.seed)
    if args.one:
        print(json.dumps(run_mode(data_dir, args.one, args.workers, steps, args.isp_v, args.seed)))
        return
    here = str(Path(__file__).resolve().parents[1] / "lambda_src")
    # code label -> (lambda_src tree, extra environment) of a subprocess, or None: this process
    trees: dict[str, tuple[str, dict] | None] = {"": None}
    if args.before:
        trees = {"before": (args.before, {}), "after": (here, {})}
    elif args.native_vs_numpy:
        trees = {"numpy": (here, {"EBB_NATIVE": "0"}), "native": (here, {})}
    runs: dict[tuple[str, str], list[dict]] = {(code, mode): [] for mode in ("bsp", "isp") for code in trees}
    for _ in range(args.repeats):
        for code, mode in runs:  # alternately, so all see the same machine
            if trees[code] is None:
                result = run_mode(data_dir, mode, args.workers, steps, args.isp_v, args.seed)
            else:
                result = _run_tree(*trees[code], mode, args, steps)
            runs[code, mode].append(result)
    rows = []
    for (code, mode), rs in runs.items():
        row = {
            k: rs[0][k] if isinstance(rs[0][k], bool) else statistics.median(r[k] for r in rs)
            for k in rs[0]
            if k != "mode"
        }
        rows.append({**({"code": code} if code else {}), "mode": mode, **row})
    print_table(
        rows,
        [
            *([("code", "code")] if len(trees) > 1 else []),
            ("mode", "sync"),
            *((f"{p}_ms", f"{p} ms") for p in PHASES),
            ("total_ms", "CPU ms/worker-step"),
            ("kb_sent_per_worker_step", "KB sent"),
        ],
    )
    ratios = {}
    for code in trees:
        bsp, isp = (next(r for r in rows if r.get("code", "") == code and r["mode"] == m) for m in ("bsp", "isp"))
        ratios[code or "isp_over_bsp"] = isp["total_ms"] / bsp["total_ms"]
        print(
            f"\n{code + ': ' if code else ''}ISP/BSP CPU per worker-step at {args.workers} workers: "
            f"{ratios[code or 'isp_over_bsp']:.3f}× (target ≤ 1.15)"
        )
    versus = "-native-vs-numpy" if args.native_vs_numpy else "-vs-before" if args.before else ""
    write_json(
        result_path("step_cpu", f"{shape}-P{args.workers}{versus}"),
        {
            "shape": shape,
            "workers": args.workers,
            "steps": steps,
            "repeats": args.repeats,
            "isp_v": args.isp_v,
            "label": args.label,
            "before": args.before,
            "rows": rows,
            **({"isp_over_bsp": ratios} if len(trees) > 1 else ratios),
        },
        args.json,
    )


def _run_tree(src: str, env: dict, mode: str, args, steps: int) -> dict:
    """One ``run_mode`` in a subprocess that imports the engine from ``src`` (``env`` added)."""
    cmd = [
        sys.executable,
        __file__,
        "--one",
        mode,
        "--workers",
        str(args.workers),
        "--steps",
        str(steps),
        "--isp-v",
        str(args.isp_v),
        "--seed",
        str(args.seed),
        *(["--quick"] if args.quick else []),
    ]
    out = subprocess.run(cmd, env={**os.environ, **env, "PYTHONPATH": src}, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
