"""`ebb predict` and `ebb.load_model` on models trained here: the round trip to the report's
test metric, a fresh process without torch, local workers, unknown ids, bad rows, top-K
against planted preferences, and the logistic formats (Criteo with min-max scaling, CSV)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ebb.cli import main
from ebb.data.readers import DataError
from ebb.predict import load_model
from ebb.predict.run import predict_file, recommend_users

ROOT = Path(__file__).resolve().parents[2]
USERS, ITEMS, RANK, PER_USER = 300, 240, 3, 45


def _write(path: Path, rows) -> None:
    path.write_text("".join("\t".join(str(x) for x in r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A rank-3 ratings model with Zipf item popularity (so popularity is a real baseline),
    its training file and a test file of known users and items, trained to a run."""
    tmp = tmp_path_factory.mktemp("planted")
    rng = np.random.default_rng(7)
    U = rng.normal(0, 1, (USERS, RANK))
    V = rng.normal(0, 1, (ITEMS, RANK))
    pop = 1 / np.arange(1, ITEMS + 1) ** 0.7
    pop /= pop.sum()
    rows = []
    for u in range(USERS):
        for i in rng.choice(ITEMS, PER_USER, replace=False, p=pop):
            rows.append((u + 1, i + 11, round(3.5 + U[u] @ V[i] + rng.normal(0, 0.3), 4), 0))
    rng.shuffle(rows)
    cut = int(len(rows) * 0.9)
    train = rows[:cut]
    known_u, known_i = {r[0] for r in train}, {r[1] for r in train}
    test = [r for r in rows[cut:] if r[0] in known_u and r[1] in known_i]
    _write(tmp / "train.tsv", train)
    _write(tmp / "test.tsv", test)
    data, run = tmp / "data", tmp / "run"
    assert main(["prepare", "--format", "movielens", "--input", str(tmp / "train.tsv"),
                 "--test-input", str(tmp / "test.tsv"), "--out", str(data)]) == 0  # fmt: skip
    assert main(["train", "--model", "pmf", "--data", str(data), "--out", str(run), "--workers", "1",
                 "--set", f"hyper.rank={RANK}", "--set", "hyper.l2=0.02", "--set", "hyper.lr=0.1",
                 "--set", "hyper.init_std=0.5", "--set", "stop.max_epochs=100"]) == 0  # fmt: skip
    return {"tmp": tmp, "run": run, "U": U, "V": V, "train": train, "test": test}


def test_the_run_leaves_a_model_artifact(planted):
    meta = json.loads((planted["run"] / "model.json").read_text())
    report = json.loads((planted["run"] / "report.json").read_text())
    assert meta["model"] == "pmf" and meta["replica"] == report["model"]
    assert meta["dims"] == {"users": USERS, "items": len({r[1] for r in planted["train"]}), "rank": RANK}
    assert meta["job"]["test_metrics"] == report["test_metrics"]
    assert {"model.json", "id_map.npz", "seen.npz"} <= set(report["files"].values())


def test_predict_on_the_test_file_reproduces_the_report_exactly(planted, capsys):
    report = json.loads((planted["run"] / "report.json").read_text())
    out = planted["tmp"] / "pred.csv"
    assert main(["predict", "--model", str(planted["run"]), "--input", str(planted["tmp"] / "test.tsv"),
                 "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert f'"rmse": {report["test_metrics"]["rmse"]}' in printed and "rows/s" in printed
    lines = out.read_text().splitlines()
    assert lines[0] == "user,item,rating,prediction" and len(lines) == len(planted["test"]) + 1
    # The input's rows, in order.
    assert [tuple(map(int, ln.split(",")[:2])) for ln in lines[1:]] == [(r[0], r[1]) for r in planted["test"]]


def test_with_cold_k_predict_still_reproduces_the_report_exactly(planted, capsys):
    """A model trained with ``cold_k`` scores its rarely seen users and items from the biases;
    the artifact carries the training counts, so ``ebb predict`` applies the same rule."""
    run, data = planted["tmp"] / "run-cold", planted["tmp"] / "data"
    assert main(["train", "--model", "pmf", "--data", str(data), "--out", str(run), "--workers", "1",
                 "--set", f"hyper.rank={RANK}", "--set", "hyper.lr=0.1", "--set", "hyper.cold_k=30",
                 "--set", "stop.max_epochs=10"]) == 0  # fmt: skip
    capsys.readouterr()
    model = load_model(run)
    assert model.cold_k == 30 and model._cold_item is not None and 0 < model._cold_item.sum() < len(model._cold_item)
    report = json.loads((run / "report.json").read_text())
    assert main(["predict", "--model", str(run), "--input", str(planted["tmp"] / "test.tsv"),
                 "--out", str(planted["tmp"] / "pred-cold.csv")]) == 0  # fmt: skip
    assert f'"rmse": {report["test_metrics"]["rmse"]}' in capsys.readouterr().out


def test_load_model_in_a_fresh_process_without_torch_gives_the_same_numbers(planted):
    pairs = [(r[0], r[1]) for r in planted["test"]]
    here = load_model(planted["run"]).predict(np.array(pairs))
    script = (
        "import json, sys, numpy as np, ebb\n"
        f"m = ebb.load_model({str(planted['run'])!r})\n"
        f"p = m.predict(np.array({pairs!r}))\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'pred': p.tolist()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    got = json.loads(done.stdout)
    assert got["torch"] is False
    assert np.array_equal(np.array(got["pred"], dtype=np.float32), here)


def test_workers_split_the_input_and_give_the_same_output(planted):
    one, three = planted["tmp"] / "one.csv", planted["tmp"] / "three.csv"
    a = predict_file(str(planted["run"]), planted["tmp"] / "test.tsv", one)
    b = predict_file(str(planted["run"]), planted["tmp"] / "test.tsv", three, workers=3)
    assert one.read_bytes() == three.read_bytes()
    assert a["metrics"] == b["metrics"] and a["rows"] == b["rows"] == len(planted["test"])


def test_unknown_users_and_items_get_the_bias_only_prediction_and_are_counted(planted):
    m = load_model(planted["run"])
    user, item = planted["train"][0][:2]
    u, i = m.users.encode(np.array([user]))[0], m.items.encode(np.array([item]))[0]
    pred = m.predict(np.array([[user, item], [10**9, item], [user, 10**9], [10**9, 10**9]]))
    lo, hi = m.rating_range
    expect = np.float32(m.item[i, RANK]) + np.float32(m.mean), np.float32(m.user[u, RANK]) + np.float32(m.mean)
    assert pred[1] == np.clip(expect[0], lo, hi) and pred[2] == np.clip(expect[1], lo, hi)
    assert pred[3] == np.float32(m.mean)
    assert m.unknown == {"users": 2, "items": 2}


def test_bad_rows_stop_with_file_and_line_or_are_skipped(planted):
    rows = (planted["tmp"] / "test.tsv").read_text().splitlines()
    rows[30] = "12\tnot-an-item\t3.0\t0"
    bad = planted["tmp"] / "bad.tsv"
    bad.write_text("\n".join(rows) + "\n")
    for workers in (1, 2):  # the line is the file's, whichever piece held it
        with pytest.raises(DataError, match=f"{bad}:31: item id 'not-an-item'"):
            predict_file(str(planted["run"]), bad, planted["tmp"] / "x.csv", workers=workers)
    got = predict_file(str(planted["run"]), bad, planted["tmp"] / "x.csv", skip_bad_rows=True, workers=2)
    assert got["skipped_rows"] == 1 and got["rows"] == len(rows) - 1
    assert got["bad_row_examples"][0].startswith(f"{bad}:31:")


def _recall(recommended: dict[int, list[int]], truth: dict[int, set[int]]) -> float:
    return float(np.mean([len(set(recommended[u]) & truth[u]) / len(truth[u]) for u in truth]))


def test_top_k_finds_the_planted_favourites_and_never_recommends_seen_items(planted, capsys):
    out = planted["tmp"] / "top.csv"
    assert main(["predict", "--model", str(planted["run"]), "--recommend", "10", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "user,item,score,rank"
    recs: dict[int, list[int]] = {}
    for line in lines[1:]:
        u, i, _, rank = line.split(",")
        recs.setdefault(int(u), []).append(int(i))
        assert int(rank) == len(recs[int(u)])
    seen: dict[int, set[int]] = {}
    for u, i, *_ in planted["train"]:
        seen.setdefault(u, set()).add(i)
    assert all(not (set(items) & seen[u]) for u, items in recs.items())  # never a seen item
    assert all(len(items) == 10 for items in recs.values()) and len(recs) == USERS
    # The planted top 10 of each user's unseen (trained) items, and the popularity baseline.
    catalogue = sorted({i for _, i, *_ in planted["train"]})
    count = {i: 0 for i in catalogue}
    for _, i, *_ in planted["train"]:
        count[i] += 1
    truth, popular = {}, {}
    U, V = planted["U"], planted["V"]
    for u in recs:
        unseen = [i for i in catalogue if i not in seen[u]]
        true = U[u - 1] @ V[np.array(unseen) - 11].T
        truth[u] = {unseen[k] for k in np.argsort(-true)[:10]}
        popular[u] = sorted(unseen, key=lambda i: -count[i])[:10]
    model_recall, popularity_recall = _recall(recs, truth), _recall(popular, truth)
    print(f"recall@10: model {model_recall:.3f}, popularity {popularity_recall:.3f}")
    assert model_recall > 0.5 and model_recall > 3 * popularity_recall


def test_recommend_for_a_users_file_and_in_workers_is_the_same(planted):
    users = planted["tmp"] / "users.txt"
    users.write_text("user\n3\n1\n999999\n")
    one = recommend_users(str(planted["run"]), np.array([3, 1, 999999]), 5, planted["tmp"] / "r1.csv")
    assert one["unknown"]["users"] == 1 and one["rows"] == 15
    assert main(["predict", "--model", str(planted["run"]), "--recommend", "5", "--users", str(users),
                 "--out", str(planted["tmp"] / "r2.csv"), "--workers", "2"]) == 0  # fmt: skip
    assert (planted["tmp"] / "r1.csv").read_bytes() == (planted["tmp"] / "r2.csv").read_bytes()


def _criteo_rows(rng, n: int) -> list[str]:
    rows = []
    for _ in range(n):
        ints = rng.integers(0, 50, 13)
        cats = [f"{rng.integers(0, 30):08x}" for _ in range(26)]
        label = int(ints[0] + (cats[0] < "00000010") * 20 + rng.normal(0, 10) > 35)
        fields = [str(label)] + [("" if rng.random() < 0.1 else str(v)) for v in ints] + cats
        rows.append("\t".join(fields))
    return rows


@pytest.mark.parametrize("fmt", ["criteo", "csv"])
def test_logistic_models_score_their_training_format_with_the_reports_metrics(tmp_path, fmt):
    rng = np.random.default_rng(3)
    if fmt == "criteo":
        raw = tmp_path / "day.tsv"
        raw.write_text("\n".join(_criteo_rows(rng, 3000)) + "\n")
        test = tmp_path / "test.tsv"
        test.write_text("\n".join(_criteo_rows(rng, 400)) + "\n")
        extra, model = ["--num-features", "2000", "--numeric-scaling", "minmax"], "sparse_lr"
    else:
        x = rng.normal(0, 1, (3400, 4))
        y = (x @ [1.5, -1, 0.5, 0] + rng.normal(0, 0.5, 3400) > 0).astype(int)
        lines = ["label,a,b,c,d"] + [f"{y[k]}," + ",".join(f"{v:.5f}" for v in x[k]) for k in range(3400)]
        raw, test = tmp_path / "train.csv", tmp_path / "test.csv"
        raw.write_text("\n".join(lines[:3001]) + "\n")
        test.write_text("\n".join(lines[:1] + lines[3001:]) + "\n")
        extra, model = [], "lr"
    data, run = tmp_path / "data", tmp_path / "run"
    assert main(["prepare", "--format", fmt, "--input", str(raw), "--test-input", str(test), "--out", str(data),
                 *extra]) == 0  # fmt: skip
    assert main(["train", "--model", model, "--data", str(data), "--out", str(run), "--workers", "1",
                 "--set", "stop.max_epochs=3"]) == 0  # fmt: skip
    report = json.loads((run / "report.json").read_text())
    got = predict_file(str(run), test, tmp_path / "p.csv", with_labels=True, workers=2)
    assert got["metrics"] == report["test_metrics"]
    assert (tmp_path / "p.csv").read_text().startswith("label,probability\n")
    m = load_model(run)
    lines = test.read_text().splitlines(keepends=True)
    direct = m.predict_lines(lines if fmt == "criteo" else lines[:5])
    written = np.array([ln.split(",")[1] for ln in (tmp_path / "p.csv").read_text().splitlines()[1:5]], np.float32)
    assert np.array_equal(direct[:4], written)


def test_libsvm_rows_with_features_the_model_never_had_are_scored_without_them_and_counted(tmp_path):
    from ebb.data.synth import synth_logistic

    synth_logistic(tmp_path / "rows.svm", rows=2000, features=200, nnz=8, seed=4)
    data, run = tmp_path / "data", tmp_path / "run"
    assert main(["prepare", "--format", "libsvm", "--input", str(tmp_path / "rows.svm"), "--out", str(data)]) == 0
    assert main(["train", "--model", "sparse_lr", "--data", str(data), "--out", str(run), "--workers", "1",
                 "--set", "stop.max_epochs=2"]) == 0  # fmt: skip
    m = load_model(run)
    rows = (tmp_path / "rows.svm").read_text().splitlines(keepends=True)[:3]
    base = m.predict_lines(rows)
    extra = [r.rstrip("\n") + f" {m.num_features + 5}:1.0\n" for r in rows]
    assert np.array_equal(m.predict_lines(extra), base) and m.unknown == {"features": 3}


def test_model_input_and_output_on_s3(planted, moto_env, moto_s3):
    from tests.helpers.aws import unique_bucket

    bucket = unique_bucket()
    moto_s3.create_bucket(Bucket=bucket)
    for key in ("model.json", "model.npz", "id_map.npz", "seen.npz"):
        moto_s3.put_object(Bucket=bucket, Key=f"runs/x/{key}", Body=(planted["run"] / key).read_bytes())
    moto_s3.put_object(Bucket=bucket, Key="in/test.tsv", Body=(planted["tmp"] / "test.tsv").read_bytes())
    done = subprocess.run(
        [sys.executable, "-m", "ebb.cli", "predict", "--model", f"s3://{bucket}/runs/x", "--input",
         f"s3://{bucket}/in/test.tsv", "--out", f"s3://{bucket}/out/p.csv"],  # fmt: skip
        env=moto_env, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    predict_file(str(planted["run"]), planted["tmp"] / "test.tsv", planted["tmp"] / "s3-local.csv")
    got = moto_s3.get_object(Bucket=bucket, Key="out/p.csv")["Body"].read()
    assert got == (planted["tmp"] / "s3-local.csv").read_bytes()


def test_pairs_without_ratings_are_scored_and_no_metric_is_made_up(planted):
    pairs = planted["tmp"] / "pairs.csv"
    pairs.write_text("".join(f"{r[0]},{r[1]}\n" for r in planted["test"][:50]))
    got = predict_file(str(planted["run"]), pairs, planted["tmp"] / "pairs-out.csv", workers=2)
    lines = (planted["tmp"] / "pairs-out.csv").read_text().splitlines()
    assert got["rows"] == 50 and got["metrics"] == {} and lines[1].split(",")[2] == ""
    expect = load_model(planted["run"]).predict(np.array([r[:2] for r in planted["test"][:50]]))
    assert np.array_equal(np.array([ln.split(",")[3] for ln in lines[1:]], np.float32), expect)
