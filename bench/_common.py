"""Shared bits of the benchmark scripts: a results table on stdout and a JSON file that says how it was made.

Every bench writes ``bench/results/<bench>/<label>.json`` by default (``--json`` elsewhere). Each
file records the command, the commit it ran (and whether the tree had uncommitted changes), the
machine, and the load average when the script started and when it wrote, because process CPU
time on a shared machine grows with its load (docs/RESULTS.md cites these files).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent
LOAD_AT_START = os.getloadavg()  # every bench imports this module first thing


def result_path(bench: str, label: str) -> Path:
    """Where a bench writes by default: ``bench/results/<bench>/<label>.json``."""
    return RESULTS / bench / f"{label}.json"


def machine() -> dict:
    """What the figures depend on: Python, torch, cores, memory, CPU model and OS, and when."""
    import torch

    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or None,
    )
    mem_kb = next(
        (int(line.split()[1]) for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal:")), None
    )
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1) if mem_kb else None,
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


@functools.cache
def source_commit() -> dict:
    """``{"commit", "dirty"}`` of the checkout the bench runs from (None where git cannot say).
    ``dirty`` ignores bench/results/, which the benches themselves write."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
    return {"commit": commit, "dirty": None if commit is None or status is None else bool(status)}


source_commit()  # at start: the code that runs is the code checked out now


def provenance() -> dict:
    """How this result was made: command, argv, commit, machine, load (1/5/15-minute) at start and now."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return {
        "command": shlex.join(["python", str(shown), *sys.argv[1:]]),
        "argv": sys.argv,
        **source_commit(),
        "machine": machine(),
        "load": {"start": list(LOAD_AT_START), "end": list(os.getloadavg())},
    }


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


def write_json(default: Path, payload: dict, path: str | os.PathLike | None = None) -> Path:
    """Write ``payload`` with its provenance to ``path``, or to ``default`` (see ``result_path``)."""
    out = Path(path) if path else default
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**provenance(), **payload}, indent=2))
    print(f"\nwrote {out}")
    return out


def train_job_file(job: Path) -> tuple[dict, float]:
    """Run ``ebb train JOB`` from this checkout's sources (stderr kept beside it, in
    stderr.txt): its report.json, read from the job's folder, and the seconds it took here."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lambda_src"), str(ROOT)])}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ebb.cli", "train", str(job)], capture_output=True, text=True, env=env, cwd=ROOT
    )
    (job.parent / "stderr.txt").write_text(proc.stderr)
    report = json.loads((job.parent / "report.json").read_text())
    return report, time.perf_counter() - started


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
