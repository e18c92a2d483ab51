"""``ebb predict`` on AWS: the Predict state machine's three steps, each a call of the predict
function (``ebb.aws.handlers.predict``; docs/AWS.md "Predicting").

* ``plan``: cut the input into ``shards`` byte ranges of the S3 object (for
  ``--recommend``, ranges of the users) — the Map's items;
* ``shard``: score one range, exactly as ``ebb predict --workers`` scores a piece (its
  lines are those that *start* in the range), and write ``shard-NNNNNN.csv`` (shard 0
  with the header) and ``shard-NNNNNN.npz`` (predictions and targets, for the metrics);
* ``manifest``: the shards in order, the rows, the metrics over every row (the training
  metric code, so they are the local run's), the cost and ``manifest.json``.

Joined in order, the shards' CSVs are the file a local run writes.
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ebb.ports import deployment as names
from ebb.predict.artifact import LogisticModel, RatingsModel, load_model
from ebb.predict.run import Piece, metrics_of, predict_cost, score_path, write_table

PROBE = 64 * 1024  # bytes read at a time when looking for a line's end
MANIFEST = "manifest.json"


def shard_key(run: str, index: int, ext: str) -> str:
    return f"{names.predict_prefix(run)}/shard-{index:06d}.{ext}"


def _s3():
    from ebb.stores.s3 import s3_client

    return s3_client()


def _split(url: str) -> tuple[str, str]:
    from ebb.stores import parse_s3_url

    return parse_s3_url(url)


def _get(bucket: str, key: str, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of an object."""
    if stop <= start:
        return b""
    return _s3().get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{stop - 1}")["Body"].read()


def _line_start_at_or_after(bucket: str, key: str, size: int, at: int) -> int:
    """The first byte of the first line that starts at or after ``at``."""
    if at <= 0:
        return 0
    pos = at - 1
    while pos < size:
        block = _get(bucket, key, pos, min(pos + PROBE, size))
        nl = block.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(block)
    return size


def _has_header(model: RatingsModel | LogisticModel) -> bool:
    return isinstance(model, LogisticModel) and model.preprocessing.get("format") == "csv"


def plan(event: dict[str, Any]) -> dict[str, Any]:
    """The Map's items: ``{index, start, stop, size, header}`` per shard (the state machine
    adds the run's settings to each); at most ``max_shards``."""
    n = max(1, min(int(event["shards"]), int(event.get("max_shards") or event["shards"])))
    model = load_model(event["model"])
    if event.get("recommend"):
        if not isinstance(model, RatingsModel):
            raise ValueError(f"{event['model']}: recommend needs a ratings (pmf) model")
        total = model.num_users if event.get("users") in (None, "all") else len(_users_file(event["users"]))
        size, begin = total, 0
    else:
        bucket, key = _split(event["input"])
        size = _s3().head_object(Bucket=bucket, Key=key)["ContentLength"]
        begin = _line_start_at_or_after(bucket, key, size, 1) if _has_header(model) else 0
    cuts = [begin + (size - begin) * k // n for k in range(n + 1)]
    items = [{"index": k, "start": a, "stop": b, "size": size, "header": begin}
             for k, (a, b) in enumerate(zip(cuts, cuts[1:]))]  # fmt: skip
    return {"shards": items}


def _users_file(url: str) -> np.ndarray:
    from ebb.predict.inputs import ids_file
    from ebb.stores import local_copy

    with local_copy(url) as path:
        return ids_file(path)


def score_shard(item: dict[str, Any], bucket: str) -> dict[str, Any]:
    """Score one shard into the bucket's ``predictions/<run>/``; returns what it did."""
    started = time.perf_counter()
    model = load_model(item["model"])
    s3 = _s3()
    index, run = item["index"], item["run"]
    with tempfile.TemporaryDirectory(prefix="ebb-shard-") as tmp:
        out = Path(tmp, "out.csv")
        if item.get("recommend"):
            assert isinstance(model, RatingsModel)
            users = model.all_users() if item.get("users") in (None, "all") else _users_file(item["users"])
            cols = model.recommend(users[item["start"] : item["stop"]], int(item["recommend"]),
                                   exclude_seen=item.get("exclude_seen", True) is not False)  # fmt: skip
            write_table(cols, out)
            if index > 0:  # the header once, in shard 0
                out.write_bytes(out.read_bytes().split(b"\n", 1)[1])
            result: dict[str, Any] = {"rows": int(len(cols["user"])), "skipped_rows": 0, "bad_rows": []}
            arrays = None
        else:
            in_bucket, key = _split(item["input"])
            size = item["size"]
            a = _line_start_at_or_after(in_bucket, key, size, item["start"]) if index else item["header"]
            b = _line_start_at_or_after(in_bucket, key, size, item["stop"]) if item["stop"] < size else size
            piece_path = Path(tmp, "piece" + Path(key).suffix)
            with open(piece_path, "wb") as f:
                if _has_header(model):
                    f.write(_get(in_bucket, key, 0, item["header"]))
                pos = a
                while pos < b:  # in blocks: a shard may be larger than memory allows at once
                    block = _get(in_bucket, key, pos, min(pos + (64 << 20), b))
                    f.write(block)
                    pos += len(block)
            scored = score_path(model, piece_path, out, name=item["input"], piece=Piece(a, b, None),
                                with_labels=bool(item.get("with_labels")),
                                skip_bad_rows=bool(item.get("skip_bad_rows")), write_header=index == 0)  # fmt: skip
            arrays = {"pred": scored.pop("pred"), "target": scored.pop("target")}
            arrays = arrays if scored["metered"] else None
            result = scored
        s3.upload_file(str(out), bucket, shard_key(run, index, "csv"))
        if arrays is not None:
            buf = io.BytesIO()
            np.savez(buf, **arrays)
            s3.put_object(Bucket=bucket, Key=shard_key(run, index, "npz"), Body=buf.getvalue())
    return {
        "index": index,
        "rows": result["rows"],
        "skipped_rows": result["skipped_rows"],
        "bad_rows": result["bad_rows"][:5],
        "unknown": dict(model.unknown),
        "metered": arrays is not None,
        "seconds": round(time.perf_counter() - started, 4),
    }


def write_manifest(event: dict[str, Any], bucket: str, memory_mb: int) -> dict[str, Any]:
    """Gather the shards' results (the Map's output, in shard order) into ``manifest.json``."""
    run, results = event["run"], sorted(event["results"], key=lambda r: r["index"])
    s3 = _s3()
    model = load_model(event["model"])
    metrics: dict[str, float] = {}
    if not event.get("recommend") and all(r.get("metered") for r in results):
        preds, targets = [], []
        for r in results:
            body = s3.get_object(Bucket=bucket, Key=shard_key(run, r["index"], "npz"))["Body"].read()
            with np.load(io.BytesIO(body), allow_pickle=False) as npz:
                preds.append(npz["pred"])
                targets.append(npz["target"])
        metrics = metrics_of(model, np.concatenate(preds), np.concatenate(targets), bool(event.get("with_labels")))
    rows = sum(r["rows"] for r in results)
    unknown: dict[str, int] = {}
    for r in results:
        for k, v in r["unknown"].items():
            unknown[k] = unknown.get(k, 0) + v
    seconds = sum(r["seconds"] for r in results)
    manifest = {
        "run": run,
        "model": event["model"],
        "input": event.get("input"),
        "recommend": event.get("recommend"),
        "shards": [{"key": shard_key(run, r["index"], "csv"), "rows": r["rows"]} for r in results],
        "rows": rows,
        "skipped_rows": sum(r["skipped_rows"] for r in results),
        "bad_row_examples": [m for r in results for m in r["bad_rows"]][:5],
        "unknown": unknown,
        "metrics": metrics,
        "shard_seconds": round(seconds, 4),
        "cost": predict_cost(seconds=seconds, memory_mb=memory_mb, shards=len(results), rows=rows),
    }
    key = f"{names.predict_prefix(run)}/{MANIFEST}"
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(manifest, indent=2).encode())
    return {"manifest_key": key, "rows": rows, "metrics": metrics}
