"""One contract for every ObjectStore (a folder; S3 through moto), plus the S3 store's own
failure modes and the location helpers in ``ebb.stores``."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import boto3
import pytest
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID, set_initial_no_auth_action_count

from ebb.ports.objects import is_s3
from ebb.stores import join_location, local_copy, open_object_store, parse_s3_url
from ebb.stores import s3 as s3_module
from ebb.stores.local import FolderObjectStore
from ebb.stores.s3 import S3ObjectStore, S3StoreError, s3_client
from tests.helpers.aws import REGION


@dataclass
class Harness:
    """A store under test, how to open a sibling store (same bucket/folder, other prefix),
    how to fill it in bulk, and what its error messages call a key."""

    store: object
    sibling: Callable[[str], object]
    fill: Callable[[object, list[str]], None]
    location: Callable[[str], str]
    kind: str


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch):
    """In-process tests must reach moto only, whatever the developer's shell holds."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)


@pytest.fixture(params=["folder", "s3"])
def harness(request, tmp_path):
    if request.param == "folder":

        def put_all(store, keys):
            for key in keys:
                store.put(key, key.encode())

        yield Harness(
            FolderObjectStore(tmp_path / "ds"),
            lambda prefix: FolderObjectStore(tmp_path / prefix),
            put_all,
            lambda key: key,
            "folder",
        )
        return
    with mock_aws():
        client = s3_client()
        client.create_bucket(Bucket="ebb-contract")

        def put_all(store, keys):
            # Straight into moto's backend: 1,000 API puts take ~3 s in-process, and what
            # is under test is the listing (two pages), not the puts.
            from moto.s3.models import s3_backends

            backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
            for key in keys:
                backend.put_object(store.bucket, store._key(key), key.encode())

        yield Harness(
            S3ObjectStore("ebb-contract", "ds", client=client),
            lambda prefix: S3ObjectStore("ebb-contract", prefix, client=client),
            put_all,
            lambda key: f"s3://ebb-contract/ds/{key}",
            "s3",
        )


BINARY = bytes(range(256)) * 64 + b"\x00\r\n\xff"


def test_put_get_round_trips_binary_and_empty_payloads(harness):
    store = harness.store
    store.put("blob", BINARY)
    store.put("empty", b"")
    assert store.get("blob") == BINARY
    assert store.get("empty") == b""
    store.put("blob", b"second")
    assert store.get("blob") == b"second"


def test_missing_key_is_a_keyerror_naming_its_location(harness):
    with pytest.raises(KeyError) as info:
        harness.store.get("train/part-000009")
    assert "train/part-000009" in info.value.args[0]
    if harness.kind == "s3":
        assert "s3://ebb-contract/ds/train/part-000009" in info.value.args[0]
    assert harness.store.exists("train/part-000009") is False


def test_put_new_creates_only_what_is_absent_and_one_of_two_writers_wins(harness):
    """The lock on OUT (issue 24): O_EXCL semantics on a folder, If-None-Match: * on S3."""
    store = harness.store
    assert store.put_new("lock.json", b"first") is True
    assert store.put_new("lock.json", b"second") is False
    assert store.get("lock.json") == b"first"
    assert store.list() == ["lock.json"]  # no temporary file left beside it
    store.delete("lock.json")
    assert store.put_new("lock.json", b"third") is True and store.get("lock.json") == b"third"


def test_exists_and_delete(harness):
    store = harness.store
    store.put("a/b", b"1")
    assert store.exists("a/b")
    assert not store.exists("a")  # a "folder" is not an object
    store.delete("a/b")
    assert not store.exists("a/b")
    assert store.list() == []
    with pytest.raises(KeyError):
        store.get("a/b")
    store.delete("a/b")  # deleting what is not there is fine
    store.delete("never/was")


def test_list_is_sorted_nested_and_filtered_by_a_plain_prefix(harness):
    store = harness.store
    for key in ["z", "train/part-000001", "ab", "train/part-000000", "a/b/c", "a/b2", "test/part-000000"]:
        store.put(key, key.encode())
    assert store.list() == ["a/b/c", "a/b2", "ab", "test/part-000000", "train/part-000000", "train/part-000001", "z"]
    assert store.list("train/") == ["train/part-000000", "train/part-000001"]
    assert store.list("a/") == ["a/b/c", "a/b2"]
    assert store.list("a") == ["a/b/c", "a/b2", "ab"]
    assert store.list("nothing") == []
    assert store.get("a/b/c") == b"a/b/c"


def test_stores_with_different_prefixes_do_not_see_each_other(harness):
    mine, other = harness.store, harness.sibling("ds2")  # "ds" is a string prefix of "ds2"
    mine.put("manifest.json", b"mine")
    other.put("manifest.json", b"other")
    other.put("train/part-000000", b"x")
    assert mine.list() == ["manifest.json"]
    assert other.list() == ["manifest.json", "train/part-000000"]
    assert mine.get("manifest.json") == b"mine"
    assert not mine.exists("train/part-000000")
    mine.delete("manifest.json")
    assert other.get("manifest.json") == b"other"


def test_listing_more_than_a_thousand_keys(harness):
    keys = [f"train/part-{i:06d}" for i in range(1234)]
    harness.fill(harness.store, keys[::-1])
    harness.store.put("manifest.json", b"{}")
    assert harness.store.list("train/") == keys
    assert len(harness.store.list()) == 1235


def test_malformed_keys_are_rejected(harness, tmp_path):
    store = harness.store
    calls = (
        store.get,
        store.exists,
        store.delete,
        lambda k: store.put(k, b""),
        lambda k: store.put_file(k, __file__),
        lambda k: store.get_file(k, tmp_path / "x"),
    )
    for key in ["", "/abs", "a/../b", "..", "a//b", "a/", "./a"]:
        for call in calls:
            with pytest.raises(ValueError, match="invalid object key"):
                call(key)


def test_put_file_get_file_stream_and_leave_nothing_on_a_missing_key(harness, tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(BINARY * 3)
    harness.store.put_file("raw/source.bin", source)
    assert harness.store.get("raw/source.bin") == BINARY * 3
    target = tmp_path / "copy.bin"
    harness.store.get_file("raw/source.bin", target)
    assert target.read_bytes() == BINARY * 3
    with pytest.raises(KeyError, match="raw/missing.bin"):
        harness.store.get_file("raw/missing.bin", tmp_path / "missing.bin")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("missing")) == []


def test_large_objects_round_trip_as_multipart_uploads(harness, tmp_path, monkeypatch):
    # Lowered from 16 MiB so that 12 MiB goes up in three 5 MiB (S3's minimum) parts.
    monkeypatch.setattr(s3_module, "MULTIPART_THRESHOLD", 8 << 20)
    monkeypatch.setattr(s3_module, "MULTIPART_PART_SIZE", 5 << 20)
    payload = os.urandom(12 << 20)
    harness.store.put("checkpoints/big", payload)
    assert harness.store.get("checkpoints/big") == payload
    (tmp_path / "big.bin").write_bytes(payload)
    harness.store.put_file("raw/big.bin", tmp_path / "big.bin")
    harness.store.get_file("raw/big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == payload
    if harness.kind == "s3":
        store = harness.store
        for key in ("checkpoints/big", "raw/big.bin"):
            etag = store.client.head_object(Bucket=store.bucket, Key=store._key(key))["ETag"]
            assert etag.strip('"').endswith("-3"), etag  # a multipart ETag counts its parts


# ------------------------------------------------------------------ S3 failure modes


@mock_aws
def test_a_missing_bucket_is_an_error_naming_it_not_a_missing_key(tmp_path):
    store = S3ObjectStore("no-such-bucket", "ds", client=s3_client())
    calls = {
        "get": lambda: store.get("k"),
        "put": lambda: store.put("k", b"1"),
        "exists": lambda: store.exists("k"),
        "list": lambda: store.list(),
        "delete": lambda: store.delete("k"),
        "get_file": lambda: store.get_file("k", tmp_path / "k"),
        "put_file": lambda: store.put_file("k", __file__),
    }
    for name, call in calls.items():
        with pytest.raises(S3StoreError, match="s3://no-such-bucket/ds") as info:
            call()
        assert "no such bucket 'no-such-bucket'" in str(info.value), name
        assert isinstance(info.value, OSError)


@mock_aws
def test_a_head_404_on_a_missing_bucket_is_not_read_as_a_missing_key():
    """Real S3 answers HEAD on a missing bucket with a bare 404, exactly as for a missing key
    (moto says NoSuchBucket): the store must look at the bucket before saying "no key"."""
    from botocore.exceptions import ClientError

    def bare_404(**_):
        raise ClientError({"Error": {"Code": "404", "Message": "Not Found"}}, "HeadObject")

    client = s3_client()
    client.meta.events.register("before-call.s3.HeadObject", bare_404)
    with pytest.raises(S3StoreError, match="s3://no-such-bucket/k: no such bucket"):
        S3ObjectStore("no-such-bucket", client=client).exists("k")
    client.create_bucket(Bucket="there")
    assert S3ObjectStore("there", client=client).exists("k") is False


@set_initial_no_auth_action_count(3)  # create the bucket, a user and its key; then IAM applies
@mock_aws
def test_access_denied_names_the_object():
    s3_client().create_bucket(Bucket="private")
    iam = boto3.session.Session().client("iam", region_name=REGION)
    iam.create_user(UserName="nobody")
    key = iam.create_access_key(UserName="nobody")["AccessKey"]  # no policy: everything is denied
    client = boto3.session.Session().client(
        "s3", region_name=REGION, aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"]
    )
    store = S3ObjectStore("private", "ds", client=client)
    for call in (
        lambda: store.get("manifest.json"),
        lambda: store.exists("manifest.json"),
        lambda: store.put("manifest.json", b"{}"),
    ):
        with pytest.raises(S3StoreError, match=r"s3://private/ds/manifest.json: \w+ failed: access denied"):
            call()


# ------------------------------------------------------------------ locations


def test_open_object_store_picks_by_scheme(tmp_path):
    folder = open_object_store(str(tmp_path / "ds"))
    assert isinstance(folder, FolderObjectStore) and folder.root == tmp_path / "ds"
    assert isinstance(open_object_store(tmp_path), FolderObjectStore)
    with mock_aws():
        store = open_object_store("s3://my-bucket/datasets/ml/")
        assert isinstance(store, S3ObjectStore)
        assert (store.bucket, store.prefix) == ("my-bucket", "datasets/ml")
        assert store.url("manifest.json") == "s3://my-bucket/datasets/ml/manifest.json"
        assert open_object_store("s3://my-bucket").prefix == ""


@pytest.mark.parametrize(
    "url", ["s3://", "s3:///x", "s3://a", "s3://My_Bucket/x", "s3://bucket//x", "s3://bucket/a/../b"]
)
def test_malformed_s3_urls_are_value_errors_naming_them(url):
    with pytest.raises(ValueError) as info:
        open_object_store(url)
    assert repr(url) in str(info.value)


def test_parse_is_s3_and_join_location():
    assert parse_s3_url("s3://bucket") == ("bucket", "")
    assert parse_s3_url("s3://bucket/a/b/") == ("bucket", "a/b")
    assert is_s3("s3://bucket/x") and not is_s3("data/x") and not is_s3("/s3://x")
    assert join_location("s3://bucket", "jobs", "j1/", "report.json") == "s3://bucket/jobs/j1/report.json"
    assert join_location("s3://bucket/runs/", "j1") == "s3://bucket/runs/j1"
    assert join_location("runs", "j1", "report.json") == os.path.join("runs", "j1", "report.json")
    with pytest.raises(ValueError, match="s3:///x"):
        join_location("s3:///x", "y")


@mock_aws
def test_local_copy_fetches_to_a_temporary_file_deleted_afterwards(tmp_path):
    s3_client().create_bucket(Bucket="raw-data")
    S3ObjectStore("raw-data").put("ml/ratings.csv", b"userId,movieId,rating,timestamp\n1,2,3.5,0\n")
    with local_copy("s3://raw-data/ml/ratings.csv") as path:
        assert path.name == "ratings.csv"
        assert path.read_bytes().startswith(b"userId")
    assert not path.exists() and not path.parent.exists()
    with pytest.raises(RuntimeError), local_copy("s3://raw-data/ml/ratings.csv") as path:
        raise RuntimeError("the parse failed")
    assert not path.parent.exists()
    with pytest.raises(KeyError, match="s3://raw-data/ml/missing.csv"), local_copy("s3://raw-data/ml/missing.csv"):
        pass
    with pytest.raises(ValueError, match="names a bucket"), local_copy("s3://raw-data/"):
        pass
    with local_copy(tmp_path / "local.csv") as path:  # a local path is used as it is
        assert path == tmp_path / "local.csv"
