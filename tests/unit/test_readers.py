"""Readers of the raw formats, on small hand-written files."""

import numpy as np
import pytest

from ebb.data.readers import (
    CriteoReader,
    CSVReader,
    DataError,
    IdMap,
    LibSVMReader,
    MovieLensReader,
    criteo_category_index,
    detect_movielens_flavour,
    fnv1a64,
)

RATINGS = [(196, 242, 3.0, 881250949), (186, 302, 3.5, 891717742), (22, 377, 1.0, 878887116), (196, 51, 2.0, 880606923)]


def read_all(reader):
    chunks = list(reader)
    return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}


def write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "name, line, header, flavour",
    [
        ("u.data", "{}\t{}\t{}\t{}", None, "tab"),
        ("ratings.dat", "{}::{}::{}::{}", None, "dat"),
        ("ratings.csv", "{},{},{},{}", "userId,movieId,rating,timestamp", "csv"),
    ],
)
def test_movielens_flavours_parse_the_same_ratings(tmp_path, name, line, header, flavour):
    lines = ([header] if header else []) + [line.format(*r) for r in RATINGS]
    path = write(tmp_path / name, "\n".join(lines) + "\n")
    assert detect_movielens_flavour(path) == flavour
    got = read_all(MovieLensReader(path))
    assert got["user"].tolist() == [r[0] for r in RATINGS]
    assert got["item"].tolist() == [r[1] for r in RATINGS]
    assert got["rating"].tolist() == [r[2] for r in RATINGS]  # 3.5 kept, not rounded
    assert got["rating"].dtype == np.float32


def test_movielens_flavour_detected_by_content_not_name(tmp_path):
    path = write(tmp_path / "ratings.txt", "1::2::4::5\n")
    assert detect_movielens_flavour(path) == "dat"
    assert read_all(MovieLensReader(path))["rating"].tolist() == [4.0]


def test_id_map_is_contiguous_and_frozen_lookup_marks_unseen():
    ids = IdMap()
    first = ids.encode(np.array([1000, 7, 1000, 42]))
    assert sorted(set(first.tolist())) == [0, 1, 2]
    assert first[0] == first[2]
    again = ids.encode(np.array([42, 5]))
    assert again[0] == first[3] and again[1] == 3  # known id kept, new id appended
    frozen = ids.encode(np.array([5, 99]), grow=False)
    assert frozen.tolist() == [3, -1]
    assert len(ids) == 4
    assert ids.raw_ids()[first].tolist() == [1000, 7, 1000, 42]


def test_movielens_bad_row_names_file_and_line(tmp_path):
    path = write(tmp_path / "ratings.csv", "userId,movieId,rating,timestamp\n1,2,3,4\n1,2,3\n")
    with pytest.raises(DataError) as err:
        list(MovieLensReader(path))
    assert str(err.value) == f"{path}:3: expected 4 fields, got 3"


@pytest.mark.parametrize(
    "bad, message",
    [
        ("x\t2\t3\t4", "user id 'x' is not an integer"),
        ("1\t2.5\t3\t4", "item id '2.5' is not an integer"),
        ("1\t2\tgood\t4", "rating 'good' is not a number"),
        ("1\t2\tnan\t4", "rating 'nan' is not finite"),
    ],
)
def test_movielens_field_errors(tmp_path, bad, message):
    path = write(tmp_path / "u.data", f"1\t2\t3\t4\n{bad}\n5\t6\t7\t8\n")
    with pytest.raises(DataError, match=f"^{path}:2: ") as err:
        list(MovieLensReader(path))
    assert str(err.value).endswith(message)


def test_skip_bad_rows_counts_and_keeps_good_rows_across_blocks(tmp_path):
    rng = np.random.default_rng(0)
    users, items = rng.integers(1, 500, 3000), rng.integers(1, 500, 3000)
    ratings = rng.integers(1, 11, 3000) / 2
    lines = [f"{u}\t{i}\t{r}\t{k}" for k, (u, i, r) in enumerate(zip(users, items, ratings))]
    bad_at = [10, 1500, 2999]  # 0-based rows replaced by garbage
    for k in bad_at:
        lines[k] = "oops"
    path = write(tmp_path / "u.data", "\n".join(lines) + "\n")
    # Small blocks: most are parsed vectorised, the ones holding a bad row line by line.
    reader = MovieLensReader(path, skip_bad_rows=True, block_bytes=4096)
    got = read_all(reader)
    keep = np.ones(3000, dtype=bool)
    keep[bad_at] = False
    assert reader.skipped_rows == 3 and reader.rows == 2997
    assert np.array_equal(got["user"], users[keep]) and np.array_equal(got["item"], items[keep])
    assert np.array_equal(got["rating"], ratings[keep].astype(np.float32))
    assert reader.bad_rows[0] == f"{path}:11: expected 4 fields, got 1"
    with pytest.raises(DataError, match=f"^{path}:11: "):
        list(MovieLensReader(path, block_bytes=4096))


def test_a_large_file_read_in_many_blocks_gives_every_row_once(tmp_path):
    """Rows cut at block boundaries are neither lost nor doubled (the parse rate is
    bench/readers.py's to measure)."""
    rng = np.random.default_rng(1)
    n = 20_000
    columns = [rng.integers(1, 100_000, n), rng.integers(1, 30_000, n), rng.integers(1, 11, n) / 2, np.arange(n)]
    text = "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in zip(*columns))
    path = write(tmp_path / "u.data", text)
    got = read_all(MovieLensReader(path, block_bytes=4099))
    assert got["user"].tolist() == columns[0].tolist()
    assert got["item"].tolist() == columns[1].tolist()
    assert np.array_equal(got["rating"], columns[2].astype(np.float32))


CRITEO_LINE = "\t".join(["1", "5", "", "-3", "0"] + [""] * 9 + ["68fd1e64", "", "a1b2c3d4"] + [""] * 23)


def test_criteo_numeric_and_hashed_categorical(tmp_path):
    other = "\t".join(["0"] + ["2"] * 13 + ["deadbeef"] * 26)
    path = write(tmp_path / "day.tsv", CRITEO_LINE + "\n" + other + "\n")
    got = read_all(CriteoReader(path, num_features=1000))
    assert got["label"].tolist() == [1.0, 0.0]
    assert got["indptr"].tolist() == [0, 5, 5 + 39]
    first = slice(0, 5)
    # I1=5, I3=-3 (clamped to 0 before log1p), I4=0; I2 and I5..I13 empty, so absent.
    assert got["indices"][first][:3].tolist() == [0, 2, 3]
    assert np.allclose(got["values"][first][:3], [np.log1p(5), 0.0, 0.0])
    expected_c1 = criteo_category_index(1, b"68fd1e64", 1000)
    assert expected_c1 == 13 + fnv1a64(b"C1=68fd1e64") % 987  # stable, documented hash
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C  # the published FNV-1a 64 test vector
    assert got["indices"][first][3:].tolist() == [expected_c1, criteo_category_index(3, b"a1b2c3d4", 1000)]
    assert got["values"][first][3:].tolist() == [1.0, 1.0]
    assert (got["indices"][5 + 13 :] >= 13).all() and (got["indices"] < 1000).all()
    # The same value in different columns hashes to different features.
    assert len(set(got["indices"][5 + 13 :].tolist())) > 20


def test_criteo_fast_path_matches_line_by_line(tmp_path):
    rng = np.random.default_rng(3)
    lines = []
    for k in range(400):
        numeric = [str(rng.integers(-5, 1000)) if rng.random() < 0.7 else "" for _ in range(13)]
        categorical = [
            f"{rng.integers(0, 1 << 32):08x}"[: rng.integers(1, 9)] if rng.random() < 0.7 else "" for _ in range(26)
        ]
        lines.append("\t".join([str(k % 2)] + numeric + categorical))
    clean = write(tmp_path / "clean.tsv", "\n".join(lines) + "\n")
    # One bad row sends its block (here the whole file) through the per-line parse.
    with_bad = write(tmp_path / "bad.tsv", "\n".join(lines + ["garbage"]) + "\n")
    fast = read_all(CriteoReader(clean, num_features=5000))
    slow = read_all(CriteoReader(with_bad, num_features=5000, skip_bad_rows=True))
    for name in fast:
        assert np.array_equal(fast[name], slow[name]), name
    # Strings of every length hash as the scalar function does.
    row = lines[0].split("\t")
    present = [(j, row[14 + j - 1]) for j in range(1, 27) if row[14 + j - 1]]
    hashed = fast["indices"][fast["indptr"][0] : fast["indptr"][1]][-len(present) :]
    assert hashed.tolist() == [criteo_category_index(j, v.encode(), 5000) for j, v in present]


def test_criteo_minmax_and_raw_scaling(tmp_path):
    rows = ["\t".join(["0", str(v)] + [""] * 12 + [""] * 26) for v in (10, 20, 40)]
    path = write(tmp_path / "day.tsv", "\n".join(rows) + "\n")
    assert read_all(CriteoReader(path, numeric_scaling="minmax"))["values"].tolist() == pytest.approx([0, 1 / 3, 1])
    assert read_all(CriteoReader(path, numeric_scaling="none"))["values"].tolist() == [10, 20, 40]


def test_criteo_bad_rows(tmp_path):
    good = "\t".join(["0"] + ["1"] * 13 + ["ab"] * 26)
    short = "\t".join(["0"] + ["1"] * 13 + ["ab"] * 25)
    bad_number = "\t".join(["1", "x"] + ["1"] * 12 + ["ab"] * 26)
    path = write(tmp_path / "day.tsv", "\n".join([good, short, good, bad_number]) + "\n")
    with pytest.raises(DataError) as err:
        list(CriteoReader(path))
    assert str(err.value) == f"{path}:2: expected 40 fields, got 39"
    reader = CriteoReader(path, skip_bad_rows=True)
    assert read_all(reader)["label"].tolist() == [0.0, 0.0]
    assert reader.skipped_rows == 2
    assert reader.bad_rows[1] == f"{path}:4: I1 value 'x' is not a number"


def test_libsvm_labels_comments_and_indices(tmp_path):
    text = "# a header comment\n+1 1:0.5 3:2\n-1 2:1.5  # trailing comment\n\n0 4:1\n1\n"
    path = write(tmp_path / "train.svm", text)
    reader = LibSVMReader(path)
    got = read_all(reader)
    assert got["label"].tolist() == [1.0, 0.0, 0.0, 1.0]  # -1 → 0; a row may be empty
    assert got["indptr"].tolist() == [0, 2, 3, 4, 4]
    assert got["indices"].tolist() == [1, 3, 2, 4]  # kept as written
    assert got["values"].tolist() == [0.5, 2.0, 1.5, 1.0]
    assert reader.num_features == 5  # 1-based file: index 0 is simply unused


def test_libsvm_fast_path_matches_line_by_line(tmp_path):
    rng = np.random.default_rng(2)
    lines = []
    for _ in range(500):
        idx = np.sort(rng.choice(50, size=rng.integers(0, 6), replace=False))
        lines.append(" ".join([str(rng.choice([-1, 1]))] + [f"{i}:{rng.normal():.4f}" for i in idx]))
    clean = write(tmp_path / "clean.svm", "\n".join(lines) + "\n")
    commented = write(tmp_path / "commented.svm", "# forces the per-line parse\n" + "\n".join(lines) + "\n")
    fast, slow = read_all(LibSVMReader(clean)), read_all(LibSVMReader(commented))
    for name in fast:
        assert np.array_equal(fast[name], slow[name]), name
    assert fast["indices"].min() == 0  # 0-based data keeps index 0


@pytest.mark.parametrize(
    "bad, message",
    [
        ("1 x:1", "feature index 'x' is not an integer"),
        ("1 3", "feature '3' is not of the form index:value"),
        ("2 3:1", "label '2' is not 0/1 or -1/+1"),
        ("1 3:abc", "feature value 'abc' is not a number"),
        ("1 -3:1", "feature index -3 is out of range"),
    ],
)
def test_libsvm_bad_rows(tmp_path, bad, message):
    path = write(tmp_path / "train.svm", f"1 1:1\n0 2:1\n1 3:1\n1 4:1\n{bad}\n")
    with pytest.raises(DataError, match=f"^{path}:5: ") as err:
        list(LibSVMReader(path))
    assert message in str(err.value)


def test_csv_label_column_and_minmax(tmp_path):
    path = write(tmp_path / "data.csv", "a,label,b\n1,1,10\n3,-1,10\n2,0,30\n")
    reader = CSVReader(path)
    got = read_all(reader)
    assert reader.feature_names == ["a", "b"]
    assert got["label"].tolist() == [1.0, 0.0, 0.0]
    assert got["x"].tolist() == [[0.0, 0.0], [1.0, 0.0], [0.5, 1.0]]
    raw = read_all(CSVReader(path, normalize=False))
    assert raw["x"].tolist() == [[1, 10], [3, 10], [2, 30]]


def test_csv_without_label_column_uses_first(tmp_path):
    path = write(tmp_path / "data.csv", "y,a\n1,5\n0,7\n")
    got = read_all(CSVReader(path))
    assert got["label"].tolist() == [1.0, 0.0]
    assert got["x"].tolist() == [[0.0], [1.0]]


def test_csv_bad_rows(tmp_path):
    path = write(tmp_path / "data.csv", "label,a,b\n1,2,3\n0,2\n1,x,3\n")
    with pytest.raises(DataError) as err:
        list(CSVReader(path))
    assert str(err.value) == f"{path}:3: expected 3 fields, got 2"
    reader = CSVReader(path, skip_bad_rows=True)
    assert read_all(reader)["label"].tolist() == [1.0]
    assert reader.skipped_rows == 2
    assert reader.bad_rows[1] == f"{path}:4: column 'a' value 'x' is not a number"
