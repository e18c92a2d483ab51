"""Small seeded datasets for tests: planted structure, prepared as ``ebb prepare`` would."""

from __future__ import annotations

from pathlib import Path

from ebb.data.prepare import prepare_dataset
from ebb.data.synth import synth_ratings
from ebb.stores.local import FolderObjectStore


def planted_ratings(
    root: Path,
    *,
    users: int,
    items: int,
    ratings: int,
    rank: int,
    noise: float,
    seed: int,
    batch_size: int,
    val_fraction: float = 0.1,
    split_seed: int = 1,
) -> tuple[str, dict]:
    """Low-rank ratings planted by ``synth_ratings`` (``root/ratings.csv``), prepared into
    ``root/prepared`` (10 % test, ``val_fraction`` validation): the prepared folder and the
    generator's meta (the planted noise among it)."""
    meta = synth_ratings(
        root / "ratings.csv", users=users, items=items, ratings=ratings, rank=rank, noise=noise, seed=seed
    )
    prepare_dataset(
        "movielens",
        root / "ratings.csv",
        FolderObjectStore(root / "prepared"),
        batch_size=batch_size,
        test_fraction=0.1,
        val_fraction=val_fraction,
        seed=split_seed,
    )
    return str(root / "prepared"), meta
