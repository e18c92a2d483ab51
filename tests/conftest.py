"""Shared fixtures: a real redis-server per test session, and small prepared datasets."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import pytest
import torch

from ebb.data.prepare import prepare_dataset
from ebb.data.synth import synth_logistic
from ebb.local.redis_server import RedisServer
from ebb.stores.local import FolderObjectStore
from tests.helpers.data import planted_ratings

torch.set_num_threads(1)
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


# Test layers (`pytest -m unit | integration | infra`; README "Tests"): a test's folder is its layer.
# Under pytest-xdist (scripts/test.sh runs `-n auto --dist loadgroup`) the infra layer stays on
# one worker: its syntheses are session fixtures, shared by every infra test, and overlap its
# own subprocesses (tests/infra/conftest.py); the other layers spread over the rest. First:
# xdist reads the group from the marks in its own collection hook, registered after this file,
# so called before it (a group added later is not seen, and every worker synthesised).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        layer = Path(str(item.fspath)).parent.name
        item.add_marker(getattr(pytest.mark, layer))
        if layer == "infra":
            item.add_marker(pytest.mark.xdist_group("infra"))


@pytest.fixture(scope="session")
def native_library(tmp_path_factory):
    """The compiled kernels (ebb.native), built once per session into a temporary folder
    with the machine's C compiler, whatever the checkout holds; loaded even under EBB_NATIVE=0."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler")
    from ebb import native
    from ebb.native.build import build

    if os.environ.get("PYTEST_XDIST_WORKER"):  # one build for the run's workers (7 s of CPU each)
        from filelock import FileLock

        shared = tmp_path_factory.getbasetemp().parent  # this run's, beside every worker's own
        path = shared / "native" / "_kernels.so"
        with FileLock(str(shared / "native.lock")):
            if not path.exists():
                path.parent.mkdir(exist_ok=True)
                build(path)
    else:
        path = build(tmp_path_factory.mktemp("native") / "_kernels.so")
    with pytest.MonkeyPatch.context() as env:
        env.delenv("EBB_NATIVE", raising=False)
        lib = native._load(path)
    assert lib is not None
    lib.ebb_set_simd.restype = ctypes.c_int
    return lib


@pytest.fixture(scope="session")
def redis_server():
    """A private redis-server on a free loopback port, stopped at the end of the session."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def small_ratings(tmp_path_factory):
    """A prepared planted-rank ratings dataset small enough for engine tests (and its meta)."""
    root = tmp_path_factory.mktemp("ratings")
    return planted_ratings(
        root, users=300, items=200, ratings=24_000, rank=5, noise=0.3, seed=7, batch_size=1000, val_fraction=0.0
    )


@pytest.fixture(scope="session")
def small_logistic(tmp_path_factory):
    root = tmp_path_factory.mktemp("logistic")
    meta = synth_logistic(root / "data.svm", rows=20_000, features=300, nnz=10, seed=3)
    prepare_dataset(
        "libsvm",
        root / "data.svm",
        FolderObjectStore(root / "prepared"),
        batch_size=1000,
        test_fraction=0.2,
        seed=1,
        val_fraction=0.0,
    )
    return str(root / "prepared"), meta


# ------------------------------------------------------------------ AWS (moto_server)
# For tests that run a real CLI against S3, SQS, SNS, ... as a subprocess. In-process
# tests use ``moto.mock_aws`` instead. See tests/aws_helpers.py.


@pytest.fixture(scope="session")
def moto_server():
    """URL (``http://127.0.0.1:PORT``) of a ``moto_server`` process shared by the session, for
    every AWS service; stopped by pid at the end. Each test should use its own bucket/queue
    names (``aws_helpers.unique_bucket``); the server is never reset."""
    from tests.helpers.aws import MotoServer

    with MotoServer() as server:
        yield server.url


@pytest.fixture
def moto_env(moto_server) -> dict[str, str]:
    """Environment for a subprocess whose boto3 must reach only ``moto_server``: the current
    environment without any ``AWS_*``, plus ``AWS_ENDPOINT_URL``, fake keys and a region.
    A fresh dict per test, free to modify."""
    from tests.helpers.aws import aws_env

    return aws_env(moto_server)


@pytest.fixture(scope="session")
def moto_s3(moto_server):
    """A boto3 S3 client on ``moto_server``, for a test's own set-up and checks."""
    from tests.helpers.aws import server_client

    return server_client(moto_server, "s3")


@pytest.fixture
def aws_mock(monkeypatch):
    """moto in-process (``mock_aws``), with the fake credentials and region boto3 needs."""
    from moto import mock_aws

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield
