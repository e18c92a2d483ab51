"""``ebb prepare`` to and from S3: the real CLI as subprocesses against a moto_server."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from ebb.data.prepare import prepare_dataset
from ebb.spec import PrepareSpec, field_default
from ebb.stores.local import FolderObjectStore
from tests.helpers.aws import unique_bucket

DEFAULT_VAL_FRACTION = field_default(PrepareSpec, "val_fraction")

PREPARE = ["prepare", "--format", "movielens", "--batch-size", "1000", "--seed", "3"]


def run_ebb_together(
    commands: list[list[str]], env: dict[str, str], timeout: float = 60
) -> list[subprocess.CompletedProcess]:
    """Run several ``ebb`` commands at once (each is a separate interpreter start)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ebb.cli", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for argv in commands
    ]
    results = []
    for argv, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    return results


@pytest.fixture
def s3_env(moto_env, tmp_path):
    """moto_env with a TMPDIR of the test's own, to see that temporary copies are removed."""
    (tmp_path / "tmp").mkdir()
    return {**moto_env, "TMPDIR": str(tmp_path / "tmp")}


@pytest.fixture(scope="module")
def ratings_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("raw") / "ratings.csv"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ebb.cli",
            "synth",
            "ratings",
            "--out",
            str(path),
            "--users",
            "200",
            "--items",
            "150",
            "--ratings",
            "6000",
            "--seed",
            "5",
        ],
        check=True,
        capture_output=True,
    )
    return path


def stored(client, bucket: str, key: str) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_prepare_writes_to_and_reads_from_s3(moto_s3, s3_env, ratings_csv, tmp_path):
    bucket = unique_bucket()
    moto_s3.create_bucket(Bucket=bucket)
    moto_s3.upload_file(str(ratings_csv), bucket, "raw/ml/ratings.csv")
    local_input, s3_input = run_ebb_together(
        [
            [*PREPARE, "--input", str(ratings_csv), "--out", f"s3://{bucket}/datasets/ml"],
            [*PREPARE, "--input", f"s3://{bucket}/raw/ml/ratings.csv", "--out", f"s3://{bucket}/datasets/ml-from-s3/"],
        ],
        s3_env,
    )
    assert local_input.returncode == 0, local_input.stderr
    assert s3_input.returncode == 0, s3_input.stderr
    assert f"-> s3://{bucket}/datasets/ml" in local_input.stdout

    # The same preparation into a folder, in-process: what the bucket must hold, byte for byte.
    expected = prepare_dataset(
        "movielens",
        ratings_csv,
        FolderObjectStore(tmp_path / "ref"),
        batch_size=1000,
        seed=3,
        val_fraction=DEFAULT_VAL_FRACTION,
    )  # ebb prepare's default
    for prefix, source in (
        ("datasets/ml", str(ratings_csv)),
        ("datasets/ml-from-s3", f"s3://{bucket}/raw/ml/ratings.csv"),
    ):
        manifest = json.loads(stored(moto_s3, bucket, f"{prefix}/manifest.json"))
        parts = manifest["train"]["parts"] + manifest["val"]["parts"] + manifest["test"]["parts"]
        assert len(manifest["train"]["parts"]) == len(expected.train.parts) >= 5
        assert sum(p["rows"] for p in parts) == 6000
        for part in parts:
            assert hashlib.sha256(stored(moto_s3, bucket, f"{prefix}/{part['key']}")).hexdigest() == part["sha256"]
        reference = expected.train.parts + expected.val.parts + expected.test.parts
        assert [p["sha256"] for p in parts] == [p.sha256 for p in reference]
        assert manifest["source"]["input"] == source  # the URL, not the temporary copy
        listed = moto_s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")["Contents"]
        assert sorted(o["Key"] for o in listed) == sorted(
            [f"{prefix}/manifest.json", f"{prefix}/id_map"] + [f"{prefix}/{p['key']}" for p in parts]
        )
    assert list((tmp_path / "tmp").iterdir()) == []  # the downloaded input and the shuffle buckets are gone


def test_bad_s3_locations_fail_in_one_line_with_exit_code_2(moto_s3, s3_env, ratings_csv):
    bucket = unique_bucket()
    moto_s3.create_bucket(Bucket=bucket)
    moto_s3.put_object(
        Bucket=bucket, Key="raw/bad.csv", Body=b"userId,movieId,rating,timestamp\n1,2,3.5,10\n1,x,4,11\n"
    )
    local = str(ratings_csv)
    cases = {
        "--out: malformed S3 URL 's3://'": ["--input", local, "--out", "s3://"],
        "--input: malformed S3 URL 's3:///x'": ["--input", "s3:///x", "--out", "unused"],
        "--out: s3://ebb-no-such-bucket/ds/manifest.json: no such bucket 'ebb-no-such-bucket'": [
            "--input",
            local,
            "--out",
            "s3://ebb-no-such-bucket/ds",
        ],
        "--input: s3://ebb-no-such-bucket/raw.csv: no such bucket 'ebb-no-such-bucket'": [
            "--input",
            "s3://ebb-no-such-bucket/raw.csv",
            "--out",
            f"s3://{bucket}/ds",
        ],
        f"--test-input: no object s3://{bucket}/raw/missing.csv": [
            "--input",
            local,
            "--test-input",
            f"s3://{bucket}/raw/missing.csv",
            "--out",
            f"s3://{bucket}/ds",
        ],
        f"s3://{bucket}/raw/bad.csv:3: ": ["--input", f"s3://{bucket}/raw/bad.csv", "--out", f"s3://{bucket}/ds"],
    }
    results = run_ebb_together([[*PREPARE, *argv] for argv in cases.values()], s3_env)
    for expected, result in zip(cases, results):
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (expected, result.stderr)
        assert len(lines) == 1 and lines[0].startswith(f"ebb prepare: {expected}"), (expected, result.stderr)
    assert "Contents" not in moto_s3.list_objects_v2(Bucket=bucket, Prefix="ds/")  # nothing was written


def test_prepare_help_names_s3():
    r = subprocess.run([sys.executable, "-m", "ebb.cli", "prepare", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "s3://bucket/prefix" in r.stdout and "s3://bucket/key" in r.stdout and "AWS_ENDPOINT_URL" in r.stdout


def test_train_reads_and_writes_s3_through_rounds(moto_s3, s3_env, ratings_csv):
    """`ebb prepare --out s3://` then `ebb train --data s3:// --out s3:// --round-steps`: the report,
    the model, the plot and the checkpoints of every round land in the bucket."""
    bucket = unique_bucket()
    moto_s3.create_bucket(Bucket=bucket)
    prep = subprocess.run(
        [sys.executable, "-m", "ebb.cli", *PREPARE, "--input", str(ratings_csv), "--out", f"s3://{bucket}/datasets/ml"],
        env=s3_env,
        capture_output=True,
        text=True,
    )
    assert prep.returncode == 0, prep.stderr
    train = subprocess.run(
        [
            sys.executable,
            "-m",
            "ebb.cli",
            "train",
            "--model",
            "pmf",
            "--data",
            f"s3://{bucket}/datasets/ml",
            "--out",
            f"s3://{bucket}/jobs/j1",
            "--workers",
            "2",
            "--policy",
            "none",
            "--max-epochs",
            "150",
            "--round-steps",  # rounds by steps: by the clock a quiet machine early-stopped within one
            "3",
            "--seed",
            "2",
        ],
        env=s3_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert train.returncode == 0, train.stderr
    assert f"report: s3://{bucket}/jobs/j1/report.json" in train.stdout
    report = json.loads(stored(moto_s3, bucket, "jobs/j1/report.json"))
    assert report["status"] in ("max_epochs", "early_stopped") and report["rounds"] >= 2, report.get("rounds")
    assert report["test_metrics"]["rmse"] < 1.5 and report["files"]["model"] == "model.npz"
    assert stored(moto_s3, bucket, "jobs/j1/model.npz")[:2] == b"PK"  # an npz (zip) archive
    assert stored(moto_s3, bucket, "jobs/j1/loss.png")[:4] == b"\x89PNG"
    latest = json.loads(stored(moto_s3, bucket, "jobs/j1/checkpoints/latest.json"))
    assert latest == {"round": report["rounds"] - 1, "finished": True, "workers": [0, 1]}
    keys = [o["Key"] for o in moto_s3.list_objects_v2(Bucket=bucket, Prefix="jobs/j1/checkpoints/")["Contents"]]
    assert f"jobs/j1/checkpoints/round-{latest['round']:06d}/worker-000001.npz" in keys
