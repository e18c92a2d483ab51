"""The docs say what the code does: the README's job-file block is `ebb spec`'s output."""

from __future__ import annotations

import re
from pathlib import Path

from ebb.spec import example_yaml, load_spec

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_job_file_is_the_spec_and_loads(tmp_path):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Job file\n.*?```yaml\n(.*?)```", readme, re.S).group(1)
    assert block == example_yaml(), "regenerate the README's Job file block from `ebb spec`"
    (tmp_path / "job.yaml").write_text(block)
    spec = load_spec(tmp_path / "job.yaml")  # the example is itself a valid job file
    assert spec.name == "my-job" and spec.hyper.rank == 20


def test_the_docs_do_not_send_readers_outside_the_repository():
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        assert "../shared" not in doc.read_text(), doc.name
