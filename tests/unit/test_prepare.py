"""prepare_dataset: shuffle, split, parts, manifest, checksums — on real files and a folder store."""

import json

import numpy as np
import pytest

from ebb.data.format import decode_batch
from ebb.data.prepare import (
    ID_MAP_KEY,
    ChecksumError,
    iter_parts,
    prepare_dataset,
)
from ebb.data.readers import DataError
from ebb.ports.keys import MANIFEST_KEY, part_key
from ebb.ports.manifest import ManifestError, load_manifest
from ebb.stores.local import FolderObjectStore


def write_unique_ratings(path, users=60, items=50, count=1000, seed=0, fmt="{}\t{}\t{}\t{}"):
    """A ratings file of distinct (user, item) pairs with arbitrary raw ids; returns the rows."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(users * items, size=count, replace=False)
    raw_user = 1000 + 7 * (keys // items)  # sparse, non-contiguous raw ids
    raw_item = 5 + 3 * (keys % items)
    rating = rng.integers(1, 11, count) / 2
    lines = [fmt.format(u, i, r, 880000000 + k) for k, (u, i, r) in enumerate(zip(raw_user, raw_item, rating))]
    path.write_text("\n".join(lines) + "\n")
    return {(int(u), int(i)): float(r) for u, i, r in zip(raw_user, raw_item, rating)}


def stored_ratings(store, manifest, split):
    """(raw user, raw item) → rating of every stored row of ``split``, mapped back through the id map."""
    ids = decode_batch(store.get(ID_MAP_KEY))
    rows = {}
    for part in iter_parts(store, manifest, split):
        for u, i, r in zip(ids["user"][part["user"]], ids["item"][part["item"]], part["rating"]):
            assert (int(u), int(i)) not in rows
            rows[(int(u), int(i))] = float(r)
    return rows


def test_movielens_every_row_exactly_once(tmp_path):
    truth = write_unique_ratings(tmp_path / "u.data")
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset(
        "movielens", tmp_path / "u.data", store, batch_size=64, test_fraction=0.2, seed=3, val_fraction=0.0
    )

    assert (manifest.format, manifest.kind, manifest.batch_size) == ("movielens", "ratings", 64)
    assert manifest.train.rows == 800 and manifest.test.rows == 200
    train, test = stored_ratings(store, manifest, "train"), stored_ratings(store, manifest, "test")
    assert len(train) + len(test) == len(truth)
    assert not train.keys() & test.keys()
    assert {**train, **test} == truth  # every (u, i, rating) once, ratings intact
    # Contiguous ids over exactly the users/items present.
    assert manifest.num_users == len({u for u, _ in truth})
    assert manifest.num_items == len({i for _, i in truth})
    assert manifest.stats["rating_mean"] == pytest.approx(np.mean(list(train.values())))
    assert manifest.stats["rating_min"] == min(train.values())
    assert manifest.stats["rating_max"] == max(train.values())
    assert manifest.source["movielens_flavour"] == "tab"
    assert manifest.source["skipped_rows"] == 0


def test_parts_are_full_batches_then_one_partial(tmp_path):
    write_unique_ratings(tmp_path / "u.data", count=1000)
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset(
        "movielens", tmp_path / "u.data", store, batch_size=128, test_fraction=0.1, val_fraction=0.0
    )
    train_sizes = [p.rows for p in manifest.train.parts]
    assert train_sizes == [128] * 7 + [900 - 7 * 128]  # 900 = 1000 - 10 %
    assert [p.rows for p in manifest.test.parts] == [100]
    assert [p.key for p in manifest.train.parts] == [part_key("train", k) for k in range(8)]
    for part, arrays in zip(manifest.train.parts, iter_parts(store, manifest, "train")):
        assert len(arrays["rating"]) == part.rows
        assert arrays["user"].dtype == np.int32 and arrays["rating"].dtype == np.float32
    # The manifest on the store is the returned one, and it is complete.
    assert load_manifest(store) == manifest
    assert json.loads(store.get(MANIFEST_KEY))["train"]["rows"] == 900


def test_shuffle_is_deterministic_per_seed(tmp_path):
    write_unique_ratings(tmp_path / "u.data")

    def order(seed, name):
        store = FolderObjectStore(tmp_path / name)
        manifest = prepare_dataset("movielens", tmp_path / "u.data", store, batch_size=100, seed=seed, val_fraction=0.0)
        ids = decode_batch(store.get(ID_MAP_KEY))
        parts = list(iter_parts(store, manifest, "train"))
        return manifest, [
            (int(ids["user"][u]), int(ids["item"][i])) for p in parts for u, i in zip(p["user"], p["item"])
        ]

    first, rows_a = order(7, "a")
    again, rows_b = order(7, "b")
    other, rows_c = order(8, "c")
    assert rows_a == rows_b
    assert [p.sha256 for p in first.train.parts] == [p.sha256 for p in again.train.parts]
    assert rows_a != rows_c
    assert set(rows_a) != set(rows_c)  # another seed also picks another test split


def test_external_shuffle_with_many_buckets_is_a_permutation(tmp_path):
    truth = write_unique_ratings(tmp_path / "u.data", users=200, items=100, count=5000)
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset(
        "movielens", tmp_path / "u.data", store, batch_size=500, test_fraction=0.0, bucket_bytes=4096, val_fraction=0.0
    )
    assert manifest.source["shuffle_buckets"]["train"] >= 20
    assert manifest.test.rows == 0 and manifest.test.parts == []
    stored = stored_ratings(store, manifest, "train")
    assert stored == truth
    # Shuffled, not file order: the first part draws rows from all over the file.
    file_position = {key: k for k, key in enumerate(truth)}
    ids = decode_batch(store.get(ID_MAP_KEY))
    first_part = next(iter_parts(store, manifest, "train"))
    positions = [
        file_position[(int(ids["user"][u]), int(ids["item"][i]))]
        for u, i in zip(first_part["user"], first_part["item"])
    ]
    assert min(positions) < 500 and max(positions) > 4500
    assert abs(np.corrcoef(np.arange(500), positions)[0, 1]) < 0.2


def test_corrupt_part_is_reported_by_name(tmp_path):
    write_unique_ratings(tmp_path / "u.data")
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset("movielens", tmp_path / "u.data", store, batch_size=100, val_fraction=0.0)
    victim = manifest.train.parts[3].key
    data = bytearray(store.get(victim))
    data[-10] ^= 0xFF
    store.put(victim, bytes(data))
    parts = iter_parts(store, load_manifest(store), "train")
    for _ in range(3):
        next(parts)  # the parts before it are fine
    with pytest.raises(ChecksumError, match=f"part {victim} is corrupt"):
        next(parts)


def test_missing_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(ManifestError, match=r"^the dataset has no manifest.json; prepare it first with `ebb prepare`$"):
        load_manifest(FolderObjectStore(tmp_path / "empty"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match=r"^data/x/manifest.json is corrupt \(JSONDecodeError: .*\); prepare the"):
        load_manifest(FolderObjectStore(tmp_path / "broken"), "data/x")


def test_test_input_uses_training_id_map_and_drops_unseen(tmp_path):
    (tmp_path / "ua.base").write_text("10\t1\t4\t0\n10\t2\t3\t0\n20\t1\t5\t0\n20\t3\t2\t0\n")
    # user 30 and item 9 never appear in training: those rows cannot be evaluated.
    (tmp_path / "ua.test").write_text("20\t2\t1\t0\n30\t1\t3\t0\n10\t9\t2\t0\n10\t3\t4\t0\n")
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset(
        "movielens", tmp_path / "ua.base", store, test_input=tmp_path / "ua.test", batch_size=2, val_fraction=0.0
    )
    assert manifest.train.rows == 4 and manifest.test.rows == 2
    assert manifest.source["test_rows_dropped_unseen"] == 2
    assert manifest.source["test_input"] == str(tmp_path / "ua.test")
    assert (manifest.num_users, manifest.num_items) == (2, 3)
    assert stored_ratings(store, manifest, "test") == {(20, 2): 1.0, (10, 3): 4.0}


def test_bad_rows_fail_or_are_recorded(tmp_path):
    path = tmp_path / "u.data"
    path.write_text("1\t1\t4\t0\n1\t2\n2\t1\t3\t0\n2\t2\t5\t0\n")
    store = FolderObjectStore(tmp_path / "store")
    with pytest.raises(DataError, match=f"^{path}:2: expected 4 fields, got 2$"):
        prepare_dataset("movielens", path, store, val_fraction=0.0)
    assert not store.exists(MANIFEST_KEY)  # no manifest: the dataset is not usable
    manifest = prepare_dataset("movielens", path, store, skip_bad_rows=True, test_fraction=0.0, val_fraction=0.0)
    assert manifest.train.rows == 3
    assert manifest.source["skipped_rows"] == 1
    assert manifest.source["bad_row_examples"] == [f"{path}:2: expected 4 fields, got 2"]


def test_reprepare_removes_stale_parts(tmp_path):
    write_unique_ratings(tmp_path / "u.data")
    store = FolderObjectStore(tmp_path / "store")
    prepare_dataset("movielens", tmp_path / "u.data", store, batch_size=50, val_fraction=0.0)
    manifest = prepare_dataset("movielens", tmp_path / "u.data", store, batch_size=400, val_fraction=0.0)
    listed = set(store.list("train/")) | set(store.list("test/"))
    assert listed == {p.key for p in manifest.train.parts + manifest.test.parts}


def test_progress_is_reported(tmp_path):
    write_unique_ratings(tmp_path / "u.data", users=600, items=500, count=250_000)
    calls = []
    prepare_dataset(
        "movielens",
        tmp_path / "u.data",
        FolderObjectStore(tmp_path / "s"),
        progress=lambda n, note: calls.append((n, note)),
        val_fraction=0.0,
    )
    reading = [n for n, note in calls if note == "reading train"]
    assert reading == sorted(reading) and len(reading) >= 2
    assert (250_000, "reading train: done") in calls and (250_000, "writing parts: done") in calls


def test_libsvm_sparse_parts(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for k in range(300):
        idx = sorted(rng.choice(np.arange(1, 40), size=k % 5, replace=False))
        lines.append(" ".join([("+1" if k % 3 else "-1")] + [f"{i}:{i / 10}" for i in idx]))
    (tmp_path / "train.svm").write_text("\n".join(lines) + "\n")
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset(
        "libsvm", tmp_path / "train.svm", store, batch_size=64, test_fraction=0.2, val_fraction=0.0
    )
    assert manifest.kind == "sparse"
    assert manifest.num_features == 1 + max(int(t.split(":")[0]) for line in lines for t in line.split()[1:])
    total_nnz, labels = 0, []
    for split in ("train", "test"):
        for arrays in iter_parts(store, manifest, split):
            indptr = arrays["indptr"]
            assert indptr[0] == 0 and indptr[-1] == len(arrays["indices"]) == len(arrays["values"])
            assert len(indptr) == len(arrays["label"]) + 1
            # Values were written as index / 10: rows survive the shuffle intact.
            assert np.allclose(arrays["values"], arrays["indices"] / 10)
            total_nnz += len(arrays["indices"])
            labels.extend(arrays["label"].tolist())
    assert total_nnz == sum(k % 5 for k in range(300))
    assert sorted(labels) == sorted(float(k % 3 != 0) for k in range(300))
    assert manifest.stats["label_mean"] == pytest.approx(np.mean(labels[: manifest.train.rows]))


def test_criteo_minmax_scales_numeric_columns(tmp_path):
    rows = []
    for k in range(200):
        numeric = [str(k)] + [""] * 12
        rows.append("\t".join([str(k % 2)] + numeric + [f"{k % 7:08x}"] + [""] * 25))
    (tmp_path / "day.tsv").write_text("\n".join(rows) + "\n")
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset(
        "criteo",
        tmp_path / "day.tsv",
        store,
        num_features=50,
        numeric_scaling="minmax",
        batch_size=32,
        val_fraction=0.0,
    )
    assert manifest.num_features == 50
    scaling = manifest.source["scaling"]
    values = np.concatenate([
        a["values"][a["indices"] == 0] for split in ("train", "test") for a in iter_parts(store, manifest, split)
    ])  # fmt: skip
    assert (scaling["min"][0], scaling["max"][0]) == (0.0, 199.0)  # I1 = k for k in 0..199
    assert sorted(np.round(values * 199).astype(int).tolist()) == list(range(200))
    assert scaling["min"][1:] == [None] * 12  # empty columns: no range
    for arrays in iter_parts(store, manifest, "train"):
        assert np.array_equal(np.diff(arrays["indptr"]), np.full(len(arrays["label"]), 2))
        assert ((arrays["indices"] == 0) | (arrays["indices"] >= 13)).all()


def test_csv_dense_parts_are_scaled_with_the_input_range(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 3)) * [1, 10, 100]
    label = (x[:, 0] > 0).astype(int)
    lines = ["f0,f1,label,f2"] + [f"{a:.5f},{b:.5f},{y},{c:.5f}" for (a, b, c), y in zip(x, label)]
    (tmp_path / "data.csv").write_text("\n".join(lines) + "\n")
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset("csv", tmp_path / "data.csv", store, batch_size=100, test_fraction=0.2, val_fraction=0.0)
    assert (manifest.kind, manifest.num_features) == ("dense", 3)
    assert manifest.source["feature_names"] == ["f0", "f1", "f2"]
    train = np.concatenate([a["x"] for a in iter_parts(store, manifest, "train")])
    test = np.concatenate([a["x"] for a in iter_parts(store, manifest, "test")])
    assert train.shape == (400, 3) and train.dtype == np.float32
    both = np.concatenate([train, test])
    assert np.allclose(both.min(axis=0), 0) and np.allclose(both.max(axis=0), 1)
    lo, hi = np.array(manifest.source["scaling"]["min"]), np.array(manifest.source["scaling"]["max"])
    assert np.allclose(lo, np.round(x.min(axis=0), 5)) and np.allclose(hi, np.round(x.max(axis=0), 5))
    # Undoing the recorded scaling gives back raw rows of the file, label still attached.
    raw = lo + test * (hi - lo)
    test_labels = np.concatenate([a["label"] for a in iter_parts(store, manifest, "test")])
    assert np.array_equal(test_labels, (raw[:, 0] > 0).astype(np.float32))


def test_unknown_format_and_bad_options(tmp_path):
    (tmp_path / "u.data").write_text("1\t1\t1\t1\n")
    store = FolderObjectStore(tmp_path / "store")
    with pytest.raises(ValueError, match="unknown format"):
        prepare_dataset("parquet", tmp_path / "u.data", store, val_fraction=0.0)
    with pytest.raises(ValueError, match="test_fraction"):
        prepare_dataset("movielens", tmp_path / "u.data", store, test_fraction=1.0, val_fraction=0.0)


# ------------------------------------------------------------------ validation split


def test_val_split_is_disjoint_from_train_and_test_and_covers_the_input(tmp_path):
    truth = write_unique_ratings(tmp_path / "u.data")
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset(
        "movielens", tmp_path / "u.data", store, batch_size=64, test_fraction=0.1, val_fraction=0.2, seed=3
    )
    assert (manifest.train.rows, manifest.val.rows, manifest.test.rows) == (700, 200, 100)
    assert [p.key for p in manifest.val.parts] == [part_key("val", k) for k in range(4)]
    assert [p.rows for p in manifest.val.parts] == [64, 64, 64, 8]
    splits = {name: stored_ratings(store, manifest, name) for name in ("train", "val", "test")}
    assert not splits["train"].keys() & splits["val"].keys()
    assert not splits["val"].keys() & splits["test"].keys()
    assert not splits["train"].keys() & splits["test"].keys()
    assert {**splits["train"], **splits["val"], **splits["test"]} == truth  # every row once
    assert manifest.stats["val_rating_mean"] == pytest.approx(np.mean(list(splits["val"].values())))
    assert manifest.source["options"]["val_fraction"] == 0.2
    # The manifest on the store says the same as the one returned.
    assert load_manifest(store).val == manifest.val


def test_val_split_is_deterministic_and_leaves_the_test_split_alone(tmp_path):
    write_unique_ratings(tmp_path / "u.data")

    def prepare(name, **kw):
        store = FolderObjectStore(tmp_path / name)
        manifest = prepare_dataset("movielens", tmp_path / "u.data", store, batch_size=64, **kw)
        return store, manifest

    store_a, a = prepare("a", val_fraction=0.2, seed=3)
    _, b = prepare("b", val_fraction=0.2, seed=3)
    assert a.to_json() == b.to_json()  # same rows in the same parts, byte for byte (sha256)
    store_c, c = prepare("c", val_fraction=0.2, seed=4)
    assert stored_ratings(store_c, c, "val").keys() != stored_ratings(store_a, a, "val").keys()
    # Without a validation split, the same seed gives the same test rows, and the
    # validation rows are taken from what was training.
    store_d, d = prepare("d", val_fraction=0.0, seed=3)
    assert d.val.rows == 0 and d.val.parts == [] and not store_d.list("val/")
    assert [p.sha256 for p in d.test.parts] == [p.sha256 for p in a.test.parts]
    assert stored_ratings(store_d, d, "train").keys() == (
        stored_ratings(store_a, a, "train").keys() | stored_ratings(store_a, a, "val").keys()
    )


def test_val_split_of_sparse_rows_keeps_rows_intact(tmp_path):
    rng = np.random.default_rng(2)
    lines = []
    for k in range(500):
        idx = sorted(rng.choice(np.arange(1, 60), size=1 + k % 6, replace=False))
        lines.append(" ".join([str(k % 2)] + [f"{i}:{i / 100 + k}" for i in idx]))  # value encodes the row
    (tmp_path / "data.svm").write_text("\n".join(lines) + "\n")
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset(
        "libsvm", tmp_path / "data.svm", store, batch_size=37, test_fraction=0.2, val_fraction=0.1
    )
    assert (manifest.train.rows, manifest.val.rows, manifest.test.rows) == (350, 50, 100)
    seen = {}
    for split in ("train", "val", "test"):
        for arrays in iter_parts(store, manifest, split):
            for row in range(len(arrays["label"])):
                lo, hi = arrays["indptr"][row], arrays["indptr"][row + 1]
                k = int(np.floor(arrays["values"][lo]))
                assert np.allclose(arrays["values"][lo:hi], arrays["indices"][lo:hi] / 100 + k, atol=1e-3)
                assert len(arrays["indices"][lo:hi]) == 1 + k % 6 and arrays["label"][row] == k % 2
                assert k not in seen
                seen[k] = split
    assert sorted(seen) == list(range(500))


def test_val_split_with_a_separate_test_file(tmp_path):
    write_unique_ratings(tmp_path / "ua.base", count=500, seed=1)
    (tmp_path / "ua.test").write_text("1000\t5\t4\t0\n")  # a user and an item seen in training
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset(
        "movielens", tmp_path / "ua.base", store, test_input=tmp_path / "ua.test", val_fraction=0.2, batch_size=64
    )
    assert (manifest.train.rows, manifest.val.rows, manifest.test.rows) == (400, 100, 1)


def test_manifest_without_val_still_loads(tmp_path):
    """Datasets prepared before the validation split existed have no "val" in their manifest."""
    write_unique_ratings(tmp_path / "u.data")
    store = FolderObjectStore(tmp_path / "store")
    prepare_dataset("movielens", tmp_path / "u.data", store, batch_size=64, val_fraction=0.0)
    raw = json.loads(store.get(MANIFEST_KEY))
    del raw["val"]
    store.put(MANIFEST_KEY, json.dumps(raw).encode())
    manifest = load_manifest(store)
    assert manifest.val.rows == 0 and manifest.val.parts == []
    assert list(iter_parts(store, manifest, "val")) == []
    assert manifest.train.rows == 900


def test_reprepare_without_val_removes_stale_val_parts(tmp_path):
    write_unique_ratings(tmp_path / "u.data")
    store = FolderObjectStore(tmp_path / "store")
    prepare_dataset("movielens", tmp_path / "u.data", store, batch_size=64, val_fraction=0.3)
    assert store.list("val/")
    prepare_dataset("movielens", tmp_path / "u.data", store, batch_size=64, val_fraction=0.0)
    assert store.list("val/") == []


def test_bad_val_fraction(tmp_path):
    (tmp_path / "u.data").write_text("1\t1\t1\t1\n")
    store = FolderObjectStore(tmp_path / "store")
    with pytest.raises(ValueError, match="val_fraction must be in"):
        prepare_dataset("movielens", tmp_path / "u.data", store, val_fraction=-0.1)
    with pytest.raises(ValueError, match="test_fraction \\+ val_fraction must be below 1"):
        prepare_dataset("movielens", tmp_path / "u.data", store, test_fraction=0.5, val_fraction=0.5)


def test_cli_prepare_val_fraction(tmp_path, capsys):
    from ebb.cli import main

    write_unique_ratings(tmp_path / "u.data")
    out = tmp_path / "prep"
    prepare = ["prepare", "--format", "movielens", "--input", str(tmp_path / "u.data"), "--out", str(out)]
    assert main([*prepare, "--batch-size", "100", "--val-fraction", "0.15"]) == 0
    assert "750 train rows in 8 parts, 150 validation rows, 100 test rows" in capsys.readouterr().out
    manifest = json.loads((out / MANIFEST_KEY).read_text())
    assert manifest["val"]["rows"] == 150 and (out / "val" / "part-000001").is_file()
    assert main([*prepare, "--val-fraction", "0.95"]) == 2
    assert "--test-fraction + --val-fraction must be below 1, got 0.1 + 0.95" in capsys.readouterr().err


def test_decoding_retries_once_past_python_311s_spurious_ast_error(monkeypatch):
    import ebb.data.format as fmt

    blob = fmt.encode_batch({"label": np.arange(3, dtype=np.float32)})
    real, calls = fmt._decode_npz, []

    def flaky(data):
        calls.append(1)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=45, after=42)")
        return real(data)

    monkeypatch.setattr(fmt, "_decode_npz", flaky)
    assert fmt.decode_batch(blob)["label"].tolist() == [0.0, 1.0, 2.0] and len(calls) == 2
    monkeypatch.setattr(fmt, "_decode_npz", lambda data: (_ for _ in ()).throw(SystemError("something else")))
    with pytest.raises(SystemError, match="something else"):
        fmt.decode_batch(blob)
