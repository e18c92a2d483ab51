"""Shared fixtures: a real redis-server per test session, and small prepared datasets."""

from __future__ import annotations

import os

import pytest
import torch

from ebb.data.prepare import prepare_dataset
from ebb.data.synth import synth_logistic, synth_ratings
from ebb.local.redis_server import RedisServer
from ebb.stores.local import FolderObjectStore

torch.set_num_threads(1)
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


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
    meta = synth_ratings(root / "ratings.csv", users=300, items=200, ratings=24_000, rank=5, noise=0.3, seed=7)
    prepare_dataset("movielens", root / "ratings.csv", FolderObjectStore(root / "prepared"), batch_size=1000,
                    test_fraction=0.1, seed=1)
    return str(root / "prepared"), meta


@pytest.fixture(scope="session")
def small_logistic(tmp_path_factory):
    root = tmp_path_factory.mktemp("logistic")
    meta = synth_logistic(root / "data.svm", rows=20_000, features=300, nnz=10, seed=3)
    prepare_dataset("libsvm", root / "data.svm", FolderObjectStore(root / "prepared"), batch_size=1000,
                    test_fraction=0.2, seed=1)
    return str(root / "prepared"), meta
