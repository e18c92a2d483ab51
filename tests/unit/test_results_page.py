"""docs/RESULTS.md (the engine) and docs/RESULTS-TOOLS.md (plan, tune, predict) are pages a
reader takes in, and every figure on them has its file.

Every result file it cites exists under bench/results/ and records the command that made it
and the commit it ran at; nothing sits in bench/results/ that no doc cites (a plot may sit
beside its JSON when a doc links it); the page stays short.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULT_PAGES = [ROOT / "docs" / "RESULTS.md", ROOT / "docs" / "RESULTS-TOOLS.md"]
CITED = re.compile(r"bench/results/[\w./-]+\.(?:json|png)")
MAX_LINES = 400  # per page: a new question gets a section on the page it belongs to, history goes to git


def cited_in(*docs: Path) -> set[str]:
    """Repository paths of the result files these docs name (``../bench/results/...`` links included)."""
    return {match.group(0) for doc in docs for match in CITED.finditer(doc.read_text())}


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def stored_results() -> set[str]:
    """The files under bench/results/ that the repository holds (git's view, so that a bench just run and
    not committed is not counted; every file there when git cannot say)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return {p.relative_to(ROOT).as_posix() for p in (ROOT / "bench" / "results").rglob("*") if p.is_file()}
    return {p for p in out if (ROOT / p).is_file()}


@pytest.mark.parametrize("page", RESULT_PAGES, ids=lambda p: p.name)
def test_the_results_pages_are_short(page):
    lines = len(page.read_text().splitlines())
    assert lines < MAX_LINES, f"docs/{page.name} has {lines} lines (under {MAX_LINES}: history belongs to git)"


@pytest.mark.parametrize("page", RESULT_PAGES, ids=lambda p: p.name)
def test_every_result_a_page_cites_exists_and_says_how_it_was_made(page):
    cited = sorted(path for path in cited_in(page) if path.endswith(".json"))
    assert cited, f"docs/{page.name} cites no bench/results/*.json"
    for path in cited:
        assert (ROOT / path).is_file(), f"docs/{page.name} cites {path}, which does not exist"
        record = json.loads((ROOT / path).read_text())
        command = record.get("command")
        assert command and (isinstance(command, str) or all(isinstance(c, str) and c for c in command)), (
            f"{path}: no command"
        )
        assert re.fullmatch(r"[0-9a-f]{40}", record.get("commit") or ""), f"{path}: no commit"


def test_nothing_in_bench_results_goes_uncited():
    cited = cited_in(*docs())
    linked_plots = {p for p in cited if p.endswith(".png")}
    for plot in linked_plots:
        assert plot[: -len(".png")] + ".json" in cited, f"{plot} is linked, but not the JSON it plots"
    stored = stored_results()
    uncited = sorted(stored - cited)
    assert not uncited, f"cited by no doc (delete them, or cite them in docs/RESULTS.md): {uncited}"
    missing = sorted(p for p in cited if not (ROOT / p).is_file())
    assert not missing, f"docs name result files that do not exist: {missing}"
