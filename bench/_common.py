"""Shared bits of the benchmark scripts: a results table on stdout and a JSON file."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    import os

    import torch

    return {"python": sys.version.split()[0], "torch": torch.__version__, "cpus": os.cpu_count(),
            "platform": platform.platform(), "when": time.strftime("%Y-%m-%d %H:%M:%S")}


def print_table(rows: list[dict], columns: list[tuple[str, str]]) -> None:
    """Print ``rows`` with ``columns`` = [(key, header)], values formatted compactly."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
        return "-" if v is None else str(v)

    cells = [[fmt(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (_, h) in enumerate(columns)]
    print("  ".join(h.ljust(w) for (_, h), w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)))


def write_json(name: str, payload: dict, path: str | None = None) -> Path:
    out = Path(path) if path else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), **payload}, indent=2))
    print(f"\nwrote {out}")
    return out
