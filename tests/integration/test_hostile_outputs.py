"""A hostile but fair user (issue 24): two jobs on one OUT, a copied folder resumed, values
that overflow their stored type, a corrupt checkpoint, a full disk. Each case failed before
and is answered in one line now (docs/RELIABILITY.md names each test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ebb.ports.keys import LOCK_KEY


def _ebb(*args, cwd=None, env=None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ebb.cli", *args],
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _run(*args, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    p = _ebb(*args, **kwargs)
    stdout, stderr = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


FAST = ["--model", "pmf", "--workers", "1", "--policy", "none", "--seed", "1", "--rank", "4"]


# -- 1. one job per OUT ----------------------------------------------------------------
def test_two_jobs_started_together_on_one_out_one_is_refused_the_other_untouched(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    out = tmp_path / "run"
    flags = [*FAST, "--data", data_dir, "--out", str(out), "--max-epochs", "6"]
    a, b = _ebb("train", *flags), _ebb("train", *flags)
    results = [(p.wait(timeout=120), *p.communicate()) for p in (a, b)]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], results
    loser = next(r for r in results if r[0] == 2)
    assert "is in use by another job (pid" in _one_line(loser[2])
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "max_epochs" and (out / "model.npz").exists()
    assert not (out / LOCK_KEY).exists()  # released at the end


def test_a_dead_owner_is_named_and_resume_offered(small_ratings, tmp_path):
    data_dir, _ = small_ratings
    out = tmp_path / "run"
    out.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    import socket

    (out / LOCK_KEY).write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname(), "since": "then"}))
    refused = _run("train", *FAST, "--data", data_dir, "--out", str(out), "--max-epochs", "1")
    assert refused.returncode == 2
    line = _one_line(refused.stderr)
    assert "no longer running" in line and f"ebb train --resume {out}" in line
    assert sorted(p.name for p in out.iterdir()) == [LOCK_KEY]  # nothing written
