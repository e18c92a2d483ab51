"""``ebb predict``: score a file of any size (or recommend top-K items) with a trained model.

The input streams through the training format's reader a block at a time; each chunk is
scored and written before the next is read. ``--workers N`` cuts the input into N pieces
at line boundaries (``plan_pieces``), scores each in its own process (``score_piece``)
and joins the outputs in order: a row scores the same in any piece (``ebb.models.scoring``)
and the metrics are sums in sorted order (``ebb.models.metrics``), so the result is the
one process's, byte for byte. The AWS Predict state machine runs ``score_piece`` on
shards of an S3 object the same way.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ebb.cost.model import Usage, estimate_cost, load_prices
from ebb.data.readers import DataError
from ebb.models.metrics import classification_metrics, rmse
from ebb.predict.artifact import LogisticModel, RatingsModel, load_model
from ebb.predict.inputs import PairsReader, lr_reader

Progress = Callable[[int], None]
LAMBDA_MEMORY_MB = 1769  # the predict function's default memory (cdk.json ebb:predictMemoryMb): one vCPU
STATES_PER_RUN = 3  # the Predict state machine: plan, map, manifest
STATES_PER_SHARD = 2


@dataclass
class Piece:
    """Bytes ``[start, stop)`` of the input, whole lines, the first being line ``first_line``."""

    start: int
    stop: int
    first_line: int | None


def _header(model: RatingsModel | LogisticModel) -> bytes | None:
    """The line every piece must begin with (CSV's header), or None."""
    return b"csv" if isinstance(model, LogisticModel) and model.preprocessing.get("format") == "csv" else None


def plan_pieces(path: str | os.PathLike, n: int, *, header: bool = False) -> list[Piece]:
    """Up to ``n`` pieces of about equal size, each of whole lines (a header, when the format
    has one, stays out of every piece: ``piece_file`` puts it back)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        begin = len(f.readline()) if header else 0
        cuts = [begin]
        for k in range(1, n):
            f.seek(max(begin + (size - begin) * k // n - 1, cuts[-1]))
            f.readline()  # to the start of the next line
            cut = min(f.tell(), size)
            if cut > cuts[-1]:
                cuts.append(cut)
        cuts.append(size)
        cuts = sorted(set(cuts))
        pieces, line = [], 2 if header else 1
        for a, b in zip(cuts, cuts[1:]):
            pieces.append(Piece(a, b, line))
            f.seek(a)
            line += f.read(b - a).count(b"\n")
    return pieces or [Piece(begin, size, 2 if header else 1)]


def piece_file(path: str | os.PathLike, piece: Piece, folder: str, header: bool) -> Path:
    """The piece as a file of its own (the header first when the format has one)."""
    out = Path(folder, f"piece-{piece.start:012d}{Path(path).suffix}")
    with open(path, "rb") as src, open(out, "wb") as dst:
        if header:
            dst.write(src.readline())
        src.seek(piece.start)
        left = piece.stop - piece.start
        while left > 0:
            block = src.read(min(left, 8 << 20))
            if not block:
                break
            dst.write(block)
            left -= len(block)
    return out


def _renamer(piece_path: Path, name: str, piece: Piece | None, header: bool) -> Callable[[str], str]:
    """Maps ``piece:LINE`` in a reader's message to ``input:LINE`` (or a byte offset)."""
    pattern = re.compile(re.escape(str(piece_path)) + r":(\d+)")

    def rename(message: str) -> str:
        def sub(m: re.Match) -> str:
            line = int(m.group(1))
            if piece is None:
                return f"{name}:{line}"
            first_data_line = 2 if header else 1
            if piece.first_line is None:
                return f"{name}:(piece at byte {piece.start}, line {line - first_data_line + 1})"
            return f"{name}:{piece.first_line + line - first_data_line}"

        return pattern.sub(sub, message)

    return rename


def _fmt(values: np.ndarray) -> list[str]:
    """float32 values as text that reads back to the same float32."""
    return [f"{v:.9g}" for v in values.tolist()]


def score_path(
    model: RatingsModel | LogisticModel,
    path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    name: str | None = None,
    piece: Piece | None = None,
    with_labels: bool = False,
    skip_bad_rows: bool = False,
    write_header: bool = True,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Score every row of ``path`` into CSV ``out_path``; returns what the run saw (rows,
    skipped rows, unknown ids, and the predictions and targets for the metrics)."""
    path = Path(path)
    rename = _renamer(path, name or str(path), piece, _header(model) is not None)
    ratings = isinstance(model, RatingsModel)
    reader = (
        PairsReader(path, skip_bad_rows=skip_bad_rows)
        if ratings
        else lr_reader(model.meta, path, skip_bad_rows=skip_bad_rows)
    )
    preds, targets, rows = [], [], 0
    # Kept for the metrics only while every row has its target (a rating, a label with
    # --with-labels): a file of any size streams through when there is nothing to score it by.
    metered = ratings or with_labels
    with open(out_path, "w") as out:
        if write_header:
            out.write("user,item,rating,prediction\n" if ratings else
                      ("label,probability\n" if with_labels else "probability\n"))  # fmt: skip
        try:
            for chunk in reader:
                pred = model.predict(chunk)
                if ratings:
                    rating = ["" if np.isnan(r) else t for r, t in zip(chunk["rating"].tolist(), _fmt(chunk["rating"]))]
                    lines = zip(chunk["user"].tolist(), chunk["item"].tolist(), rating, _fmt(pred))
                    out.writelines(f"{u},{i},{r},{p}\n" for u, i, r, p in lines)
                    if metered and np.isnan(chunk["rating"]).any():
                        metered, preds, targets = False, [], []
                elif with_labels:
                    out.writelines(f"{int(lab)},{p}\n" for lab, p in zip(chunk["label"].tolist(), _fmt(pred)))
                else:
                    out.writelines(f"{p}\n" for p in _fmt(pred))
                if metered:
                    preds.append(pred)
                    targets.append(chunk["rating" if ratings else "label"])
                rows += len(pred)
                if progress is not None:
                    progress(len(pred))
        except DataError as exc:
            raise DataError(rename(str(exc))) from None
    return {
        "rows": rows,
        "skipped_rows": reader.skipped_rows,
        "bad_rows": [rename(m) for m in reader.bad_rows],
        "unknown": dict(model.unknown),
        "metered": metered,
        "pred": np.concatenate(preds) if preds else np.zeros(0, np.float32),
        "target": np.concatenate(targets) if targets else np.zeros(0, np.float32),
    }


def metrics_of(model: RatingsModel | LogisticModel, pred: np.ndarray, target: np.ndarray, with_labels: bool) -> dict:
    """The training metric code's numbers: RMSE when every row has a rating; log-loss,
    accuracy and AUC with ``--with-labels``."""
    if isinstance(model, RatingsModel):
        if len(target) and not np.isnan(target).any():
            return {"rmse": rmse(pred, target)}
        return {}
    return classification_metrics(pred, target) if with_labels and len(target) else {}


def _piece_worker(args: tuple) -> dict[str, Any]:
    location, path, name, piece, folder, with_labels, skip_bad_rows, index = args
    model = load_model(location)
    header = _header(model) is not None
    pfile = piece_file(path, piece, folder, header)
    out = Path(folder, f"out-{index:06d}.csv")
    result = score_path(model, pfile, out, name=name, piece=piece, with_labels=with_labels,
                        skip_bad_rows=skip_bad_rows, write_header=index == 0)  # fmt: skip
    pfile.unlink()
    result["out"] = str(out)
    return result


def predict_file(
    location: str,
    input_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    name: str | None = None,
    with_labels: bool = False,
    skip_bad_rows: bool = False,
    workers: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Score ``input_path`` with the model at ``location`` into ``out_path`` (CSV), on
    ``workers`` processes; returns the summary ``ebb predict`` prints."""
    started = time.perf_counter()
    model = load_model(location)
    name = name or str(input_path)
    if workers <= 1:
        result = score_path(model, input_path, out_path, name=name, with_labels=with_labels,
                            skip_bad_rows=skip_bad_rows, progress=progress)  # fmt: skip
        results = [result]
    else:
        import multiprocessing as mp

        header = _header(model) is not None
        pieces = plan_pieces(input_path, workers, header=header)
        with tempfile.TemporaryDirectory(prefix="ebb-predict-") as tmp:
            jobs = [(location, str(input_path), name, p, tmp, with_labels, skip_bad_rows, k)
                    for k, p in enumerate(pieces)]  # fmt: skip
            with mp.get_context("spawn").Pool(min(workers, len(pieces))) as pool:
                results = []
                for r in pool.imap(_piece_worker, jobs):
                    results.append(r)
                    if progress is not None:
                        progress(r["rows"])
            with open(out_path, "wb") as out:
                for r in results:
                    with open(r["out"], "rb") as f:
                        shutil.copyfileobj(f, out)
    pred = np.concatenate([r["pred"] for r in results])
    target = np.concatenate([r["target"] for r in results])
    metered = all(r["metered"] for r in results)
    seconds = time.perf_counter() - started
    rows = int(sum(r["rows"] for r in results))
    unknown: dict[str, int] = {}
    for r in results:
        for k, v in r["unknown"].items():
            unknown[k] = unknown.get(k, 0) + v
    return {
        "rows": rows,
        "skipped_rows": int(sum(r["skipped_rows"] for r in results)),
        "bad_row_examples": [m for r in results for m in r["bad_rows"]][:5],
        "unknown": unknown,
        "metrics": metrics_of(model, pred, target, with_labels) if metered else {},
        "seconds": round(seconds, 3),
        "rows_per_second": rows / seconds if seconds > 0 else None,
        "workers": workers,
        # What the same work would cost as a Predict run at this host's pace (one shard a worker).
        "cost_on_lambda": predict_cost(
            seconds=seconds * workers, memory_mb=LAMBDA_MEMORY_MB, shards=workers, rows=rows
        ),  # fmt: skip
    }


def predict_cost(*, seconds: float, memory_mb: int, shards: int, rows: int, arch: str = "x86_64") -> dict[str, Any]:
    """What a Predict run costs on the stack (the same cost model as training): the shards'
    Lambda time, their invocations, their S3 requests and the state transitions; and per
    million rows scored."""
    usage = Usage(
        worker_seconds=seconds,
        memory_mb=memory_mb,
        arch=arch,
        invocations=shards + 2,  # the shards, plan and manifest
        s3_get=4 * shards + 2,  # model, id map, seen items, the input range; plan's probes
        s3_put=2 * shards + 1,
        sfn_transitions=STATES_PER_RUN + STATES_PER_SHARD * shards,
    )
    cost = estimate_cost(usage, load_prices())
    cost["usd_per_million_rows"] = cost["total_usd"] / rows * 1e6 if rows else None
    return cost


def write_table(columns: dict[str, np.ndarray], out_path: str | os.PathLike) -> str:
    """``columns`` as Parquet when ``out_path`` ends in .parquet and pyarrow is installed,
    else CSV; returns the format written."""
    if str(out_path).endswith(".parquet"):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            print("ebb predict: pyarrow is not installed; writing CSV instead", file=sys.stderr)
        else:
            pq.write_table(pa.table({k: np.asarray(v) for k, v in columns.items()}), str(out_path))
            return "parquet"
    names = list(columns)
    with open(out_path, "w") as out:
        out.write(",".join(names) + "\n")
        text = [_fmt(v) if v.dtype.kind == "f" else [str(x) for x in v.tolist()] for v in columns.values()]
        out.writelines(",".join(row) + "\n" for row in zip(*text))
    return "csv"


def recommend_users(
    location: str,
    users: np.ndarray | None,
    k: int,
    out_path: str | os.PathLike,
    *,
    exclude_seen: bool = True,
    workers: int = 1,
) -> dict[str, Any]:
    """Top-``k`` items for ``users`` (raw ids; None: all) into ``out_path``."""
    started = time.perf_counter()
    model = load_model(location)
    if not isinstance(model, RatingsModel):
        raise DataError(f"{location}: --recommend needs a ratings (pmf) model, not {model.meta['model']}")
    all_users = model.all_users() if users is None else users
    if workers <= 1 or len(all_users) < 2:
        cols = model.recommend(all_users, k, exclude_seen=exclude_seen)
        unknown = dict(model.unknown)
    else:
        import multiprocessing as mp

        groups = np.array_split(all_users, workers)
        with mp.get_context("spawn").Pool(workers) as pool:
            parts = pool.starmap(_recommend_worker, [(location, g, k, exclude_seen) for g in groups])
        cols = {c: np.concatenate([p[0][c] for p in parts]) for c in ("user", "item", "score", "rank")}
        unknown = {"users": sum(p[1]["users"] for p in parts), "items": 0}
    fmt = write_table(cols, out_path)
    seconds = time.perf_counter() - started
    return {"users": int(len(all_users)), "rows": int(len(cols["user"])), "k": k, "format": fmt,
            "unknown": unknown, "seconds": round(seconds, 3),
            "users_per_second": len(all_users) / seconds if seconds > 0 else None}  # fmt: skip


def _recommend_worker(location: str, users: np.ndarray, k: int, exclude_seen: bool):
    model = load_model(location)
    assert isinstance(model, RatingsModel)
    return model.recommend(users, k, exclude_seen=exclude_seen), model.unknown
