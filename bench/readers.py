"""How fast `ebb prepare` parses each raw format: rows per second of each reader, one thread.

Files are generated with the project's own seeded generators (`ebb synth`) in a temporary
folder: MovieLens `u.data` and `ratings.csv`, LibSVM, dense CSV, and a Criteo TSV (13
integer and 26 hashed categorical columns). Each reader parses its file `--repeats` times
in turn (interleaved, so load spikes fall on every reader alike); the table gives the
median rows/s. The target for MovieLens is ≥ 300,000 ratings/s.

    python bench/readers.py [--rows 300000] [--repeats 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _common import print_table, result_path, write_json  # noqa: E402

from ebb.data.readers import CriteoReader, CSVReader, LibSVMReader, MovieLensReader  # noqa: E402
from ebb.data.synth import synth_logistic, synth_ratings  # noqa: E402

MOVIELENS_TARGET = 300_000  # ratings/s


def criteo_file(path: Path, rows: int, seed: int = 0) -> Path:
    """A Criteo-shaped TSV: a label, 13 small integers (some empty), 26 hex categories (some empty)."""
    rng = np.random.default_rng(seed)
    with path.open("w") as out:
        for start in range(0, rows, 50_000):
            n = min(50_000, rows - start)
            labels = rng.integers(0, 2, n)
            ints = rng.geometric(0.05, (n, 13)) - 1
            cats = rng.zipf(1.3, (n, 26)) % 1_000_003
            empty_int, empty_cat = rng.random((n, 13)) < 0.2, rng.random((n, 26)) < 0.1
            for i in range(n):
                fields = [str(labels[i])]
                fields += ["" if empty_int[i, j] else str(ints[i, j]) for j in range(13)]
                fields += ["" if empty_cat[i, j] else f"{cats[i, j]:08x}" for j in range(26)]
                out.write("\t".join(fields) + "\n")
    return path


def rows_of(reader) -> int:
    return sum(len(chunk["label"] if "label" in chunk else chunk["rating"]) for chunk in reader)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000, help="rows per file (default 300,000)")
    ap.add_argument("--repeats", type=int, default=5, help="parses of each file, interleaved (default 5)")
    ap.add_argument("--json", help="output JSON path (default bench/results/readers/formats.json)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ebb-bench-readers-") as tmp:
        folder = Path(tmp)
        users, items = max(100, args.rows // 100), max(100, args.rows // 300)
        synth_ratings(folder / "u.data", users=users, items=items, ratings=args.rows, seed=1)
        synth_ratings(folder / "ratings.csv", users=users, items=items, ratings=args.rows, seed=2)
        synth_logistic(folder / "rows.svm", rows=args.rows, features=100_000, nnz=39, seed=3)
        synth_logistic(folder / "rows.csv", rows=args.rows, seed=4)
        criteo_file(folder / "day.tsv", args.rows)
        readers = {
            "movielens u.data": lambda: MovieLensReader(folder / "u.data"),
            "movielens ratings.csv": lambda: MovieLensReader(folder / "ratings.csv"),
            "libsvm (39 non-zeros a row)": lambda: LibSVMReader(folder / "rows.svm"),
            "csv (30 dense columns)": lambda: CSVReader(folder / "rows.csv"),
            "criteo tsv (13 + 26 columns)": lambda: CriteoReader(folder / "day.tsv", num_features=100_000),
        }
        times: dict[str, list[float]] = {name: [] for name in readers}
        counts: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, make in readers.items():
                start = time.perf_counter()
                counts[name] = rows_of(make())
                times[name].append(time.perf_counter() - start)

    rows = [
        {
            "reader": name,
            "rows": counts[name],
            "rows_per_s": counts[name] / statistics.median(t),
            "min_s": min(t),
            "max_s": max(t),
        }
        for name, t in times.items()
    ]
    print_table(rows, [("reader", "reader"), ("rows", "rows"), ("rows_per_s", "rows/s (median)"),
                       ("min_s", "fastest s"), ("max_s", "slowest s")])  # fmt: skip
    movielens = min(r["rows_per_s"] for r in rows if r["reader"].startswith("movielens"))
    verdict = {"movielens_rows_per_s": movielens, "movielens_ge_target": movielens >= MOVIELENS_TARGET}
    print(f"\nMovieLens: {movielens:,.0f} ratings/s (target ≥ {MOVIELENS_TARGET:,})")
    payload = {"rows_per_file": args.rows, "repeats": args.repeats, "rows": rows, "verdict": verdict}
    write_json(result_path("readers", "formats"), payload, args.json)


if __name__ == "__main__":
    main()
