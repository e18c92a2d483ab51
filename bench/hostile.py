"""The hostile runtime of issue 24 (items 7 and 9) at the issue's own scale, with the shipped
settings: how long a silent S3 endpoint and a silent `--redis` server hold a caller, and what
a 20 s SIGSTOP of `ebb train` alone, or of every process of the job, does to a 3-worker job.

The tests (tests/integration/test_hostile_runtime.py) prove the same with lowered deadlines
in seconds; this shows the shipped numbers. Each case runs `ebb` in a process of its own;
``--src DIR`` runs another checkout's ``lambda_src`` (e.g. main's, for a before/after).

    python bench/hostile.py [--cases s3,redis,supervisor,job] [--src DIR] [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402
from _common import ROOT, print_table, result_path, write_json  # noqa: E402

sys.path.insert(0, str(ROOT))
from tests.helpers.silent import SilentServer  # noqa: E402

PAUSE_S = 20.0
_S3_CALL = """
import time
from ebb.stores.s3 import S3ObjectStore
store = S3ObjectStore("silent-bucket", "p")
started = time.monotonic()
try:
    store.get("k")
    print("answered")
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


def _env(src: str | None) -> dict:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1"}
    if src:
        env["PYTHONPATH"] = str(Path(src, "lambda_src").resolve())
    return env


def silent_s3(src: str | None, work: Path) -> dict:
    with SilentServer() as server:
        env = {**_env(src), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.port}"}
        started = time.monotonic()
        run = subprocess.run([sys.executable, "-c", _S3_CALL], capture_output=True, text=True, env=env)
        return {
            "case": "silent S3 endpoint: one GetObject",
            "seconds": round(time.monotonic() - started, 1),
            "connections": server.connections,
            "outcome": (run.stdout.strip() or run.stderr.strip().splitlines()[-1])[:160],
        }


def _train(src: str | None, data: Path, out: Path, name: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ebb.cli", "train", "--model", "pmf", "--data", str(data), "--workers", "3"]
    cmd += ["--policy", "none", "--max-epochs", "60", "--name", name, "--out", str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(src))


def silent_redis(src: str | None, work: Path) -> dict:
    with SilentServer() as server:
        started = time.monotonic()
        proc = _train(
            src, work / "ds", work / "out-redis", "silent-redis", "--redis", f"redis://127.0.0.1:{server.port}/0"
        )
        _, err = proc.communicate()
        return {
            "case": "silent --redis server: ebb train",
            "seconds": round(time.monotonic() - started, 1),
            "connections": server.connections,
            "outcome": (err.strip().splitlines() or ["?"])[-1][:160],
        }


def _paused(src: str | None, work: Path, whole_job: bool) -> dict:
    name = "paused-job" if whole_job else "paused-supervisor"
    out = work / f"out-{name}"
    started = time.monotonic()
    proc = _train(src, work / "ds", out, name)
    supervisor = psutil.Process(proc.pid)
    while len([c for c in supervisor.children(recursive=True) if c.name() != "redis-server"]) < 3:
        if proc.poll() is not None:
            raise RuntimeError(proc.communicate())
        time.sleep(0.05)
    time.sleep(4)  # training
    stopped = [supervisor, *supervisor.children(recursive=True)] if whole_job else [supervisor]
    for p in stopped:
        p.suspend()
    time.sleep(PAUSE_S)
    for p in stopped:
        p.resume()
    proc.communicate()
    report = json.loads((out / "report.json").read_text())
    lost = [e for e in report.get("scale_events", []) if e["action"] == "lost"]
    what = "every process of the job" if whole_job else "ebb train (the supervisor)"
    return {
        "case": f"SIGSTOP {what} {PAUSE_S:g} s",
        "seconds": round(time.monotonic() - started, 1),
        "exit": proc.returncode,
        "workers": f"{report['workers']['initial']}->{report['workers']['final']}",
        "outcome": (report.get("error") or report["status"])[:160],
        "lost": [f"worker {e['worker']} {e['reason']}" for e in lost],
        "faults": report.get("faults", []),
    }


CASES = {
    "s3": silent_s3,
    "redis": silent_redis,
    "supervisor": lambda src, work: _paused(src, work, whole_job=False),
    "job": lambda src, work: _paused(src, work, whole_job=True),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--src", help="a checkout whose lambda_src runs instead of this one's")
    ap.add_argument("--label", default="current", help="results file name (default current)")
    ap.add_argument("--json", help="output JSON path (default bench/results/hostile/<label>.json)")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ebb-hostile-") as tmp:
        work = Path(tmp)
        prepared = [sys.executable, "-m", "ebb.cli"]
        subprocess.run([*prepared, "synth", "ratings", "--out", str(work / "r.csv")], check=True, capture_output=True)
        subprocess.run(
            [*prepared, "prepare", "--format", "movielens", "--input", str(work / "r.csv"), "--out", str(work / "ds")],
            check=True,
            capture_output=True,
        )
        for case in args.cases.split(","):
            row = CASES[case](args.src, work)
            print(f"{row['case']}: {row['seconds']} s: {row['outcome']}", flush=True)
            rows.append(row)
    print()
    print_table(
        rows, [("case", "case"), ("seconds", "s"), ("connections", "conns"), ("workers", "workers"), ("exit", "exit")]
    )
    write_json(result_path("hostile", args.label), {"src": args.src, "pause_s": PAUSE_S, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
