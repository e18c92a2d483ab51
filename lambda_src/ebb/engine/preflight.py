"""What can be checked before a job trains, is: the dataset is whole and fits the job.

A job that would fail on a missing test part, a corrupt manifest or a dataset with fewer
minibatches than workers fails here, in one line that says what to fix, before anyone
pays for training.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ebb.catalogue import entry
from ebb.data.format import checksum
from ebb.engine.errors import EngineError
from ebb.ports.keys import MANIFEST_KEY, OUTPUT_KEYS, REPORT_KEY
from ebb.ports.manifest import SPLITS, Manifest, ManifestError, SplitInfo, load_manifest
from ebb.ports.objects import ObjectStore, is_s3
from ebb.spec import JobSpec


class PreflightError(EngineError):
    """The job cannot train on this dataset (the message says what to fix)."""


def _splits(manifest: Manifest) -> dict[str, SplitInfo]:
    return {name: getattr(manifest, name) for name in SPLITS if getattr(manifest, name, None)}


def preflight(spec: JobSpec, data: ObjectStore) -> Manifest:
    """Check the dataset against the job; returns its manifest or raises PreflightError.

    Every part the job reads (test parts too) must exist; for a local dataset each part's
    checksum is verified as well (on S3, workers verify each part as they first read it,
    and the test parts are verified here, since only finalize reads them).
    """
    where = f"{spec.data}/{MANIFEST_KEY}"
    try:
        manifest = load_manifest(data, spec.data)
    except ManifestError as exc:
        raise PreflightError(f"data: {exc}") from None
    kind = entry(spec.model).data
    if manifest.kind != kind:
        raise PreflightError(
            f"model: {spec.model} trains on {kind} data, but {spec.data} holds {manifest.kind} data ({manifest.format})"
        )
    dims = (manifest.num_users, manifest.num_items) if manifest.kind == "ratings" else (manifest.num_features,)
    if manifest.batch_size < 1 or min(dims) < 1:
        raise PreflightError(
            f"{where}: batch_size and dimensions must be positive (batch_size "
            f"{manifest.batch_size}, dimensions {dims}); prepare the dataset again"
        )
    need_mb = worker_memory_mb(spec, manifest)
    if need_mb > spec.aws.memory_mb:
        raise PreflightError(
            f"aws.memory_mb: a worker of this job needs about {need_mb:,} MB ({model_parameters(spec, manifest):,} "
            f"parameters of dimensions {dims}, its optimiser and sync state, the part cache and the runtime), "
            f"more than its {spec.aws.memory_mb:,} MB; prepare a smaller dataset or raise --memory-mb"
        )
    for name, value in manifest.stats.items():
        if isinstance(value, (int, float)) and not math.isfinite(value):
            raise PreflightError(
                f"{where}: stats.{name} is {value}; a value in the data is out of range: prepare the dataset again"
            )
    parts = len(manifest.train.parts)
    if parts == 0:
        raise PreflightError(f"{where}: the dataset has no training minibatches")
    most = max([spec.workers] + [e.workers for e in spec.scaling.schedule])
    if most > parts:
        raise PreflightError(
            f"workers: {most} is more than the {parts} training minibatches of {spec.data}: each "
            f"worker needs a minibatch of its own every step; use at most {parts} workers, or a "
            "smaller --batch-size in `ebb prepare`"
        )
    listed = {p.key: (split, p) for split, info in _splits(manifest).items() for p in info.parts}
    present = set(data.list())
    missing = sorted(set(listed) - present)
    if missing:
        raise PreflightError(
            f"data: {len(missing)} part(s) listed in {where} are missing, e.g. {missing[0]}; prepare the dataset again"
        )
    verify = listed if not is_s3(spec.data) else {k: v for k, v in listed.items() if v[0] != "train"}
    for key, (_, part) in sorted(verify.items()):
        if checksum(data.get(key)) != part.sha256:
            raise PreflightError(
                f"data: {spec.data}/{key} does not match its checksum in {MANIFEST_KEY}; "
                "the dataset was changed after `ebb prepare`: prepare it again"
            )
    return manifest


# What a worker holds besides the model: Python, numpy and torch, measured at about this.
RUNTIME_MB = 300


def model_parameters(spec: JobSpec, manifest: Manifest) -> int:
    """The model's parameter count: factors and biases (PMF), or weights and bias (LR)."""
    if manifest.kind == "ratings":
        rank = int(spec.hyper.rank or 0)
        return (manifest.num_users + manifest.num_items) * (rank + 1) + 1
    return manifest.num_features + 1


def worker_memory_mb(spec: JobSpec, manifest: Manifest) -> int:
    """A worker's memory, estimated from the manifest: float32 copies of the model (the
    replica, two working buffers, the optimiser's state, ISP's accumulators), the part
    cache and the runtime."""
    copies = 3 + (2 if spec.hyper.optimizer == "adam" else 1) + (1 if spec.sync.mode == "isp" else 0)
    model_bytes = 4 * copies * model_parameters(spec, manifest)
    return RUNTIME_MB + (spec.aws.part_cache_bytes() + model_bytes) // (1 << 20)


def check_outputs(spec: JobSpec, out: ObjectStore) -> None:
    """A new run never mixes with another: refuse an ``out`` that holds a finished run (or
    is a file); clear what a failed run left there."""
    if not is_s3(spec.out_location) and Path(spec.out_location).is_file():
        raise PreflightError(f"out: {spec.out_location} is a file; give --out a folder")
    try:
        previous = json.loads(out.get(REPORT_KEY))
    except KeyError:
        return
    except ValueError:
        previous = {"status": "unreadable"}
    if previous.get("status") != "failed":
        raise PreflightError(
            f"out: {spec.out_location} holds a run already ({REPORT_KEY}, status "
            f"{previous.get('status')}); choose another --out, or delete that one"
        )
    for key in OUTPUT_KEYS:
        out.delete(key)
