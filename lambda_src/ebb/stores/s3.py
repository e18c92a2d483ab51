"""The object store on S3: the same contract as :class:`~ebb.stores.local.FolderObjectStore`.

Keys are relative to ``prefix`` inside ``bucket``. The client is boto3's, so its usual
configuration applies (credentials chain, region, ``AWS_ENDPOINT_URL`` /
``AWS_ENDPOINT_URL_S3`` for an emulator such as ``moto_server``); only retries, timeouts
and the connection pool are set here. A missing key is a ``KeyError``; every other failure
(no such bucket, access denied, no credentials, endpoint unreachable) is an
:class:`S3StoreError` naming the ``s3://`` URL and the operation.
"""

from __future__ import annotations

import io
import os

from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.utils import S3_RETRYABLE_DOWNLOAD_ERRORS

from ebb.ports.objects import check_key

from . import aws_clients

# Objects of at least MULTIPART_THRESHOLD bytes go up as a multipart upload of
# MULTIPART_PART_SIZE parts, TRANSFER_CONCURRENCY at a time (and files are fetched as that
# many ranged GETs). Parts are S3's minimum 5 MiB or more, and 16 MiB x 10,000 parts allows
# 160 GB objects; minibatch parts (~100 KB) stay single PUTs, checkpoints and big raw
# inputs go in parallel parts that are retried one by one.
MULTIPART_THRESHOLD = 16 << 20
MULTIPART_PART_SIZE = 16 << 20
TRANSFER_CONCURRENCY = 8


def s3_client():
    """A boto3 S3 client with Ebb's retry and timeout settings (``ebb.stores.aws_clients``)
    and a connection pool for TRANSFER_CONCURRENCY parallel parts."""
    return aws_clients.client("s3", pool=2 * TRANSFER_CONCURRENCY)


# The client's retries end with the response headers; a body cut off mid-stream is
# fetched again this many times in all (s3transfer does the same for files).
BODY_ATTEMPTS = 3

# "No such key" as each call reports it (HEAD has no body, so only the status code).
_MISSING_KEY = {"NoSuchKey", "404", "NotFound"}


class S3StoreError(OSError):
    """An S3 call failed for another reason than a missing key; the message names the URL."""


def transfer_config() -> TransferConfig:
    """Multipart settings from the module constants (read at each call, so tests may lower them)."""
    return TransferConfig(
        multipart_threshold=MULTIPART_THRESHOLD,
        multipart_chunksize=MULTIPART_PART_SIZE,
        max_concurrency=TRANSFER_CONCURRENCY,
    )


class S3ObjectStore:
    """Object store over ``s3://bucket/prefix``; keys are relative to the prefix."""

    def __init__(self, bucket: str, prefix: str = "", client=None):
        if not bucket or "/" in bucket:
            raise ValueError(f"invalid S3 bucket name {bucket!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            check_key(self.prefix)
        self.client = client if client is not None else s3_client()
        self._bucket_seen = False

    def url(self, key: str = "") -> str:
        """``s3://bucket/prefix/key`` (the store's own URL for an empty key)."""
        return f"s3://{self.bucket}/{self._full(key)}" if key else f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def locate(self, key: str) -> str:
        return self.url(key)

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _key(self, key: str) -> str:
        return self._full(check_key(key))

    def _error(self, operation: str, key: str, exc: Exception) -> S3StoreError:
        if isinstance(exc, S3UploadFailedError) and isinstance(exc.__context__, ClientError):
            exc = exc.__context__  # upload_file wraps the ClientError that says why
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = error.get("Code") or "?"
            if code in ("404", "NoSuchBucket"):
                reason = f"no such bucket {self.bucket!r}" if code == "NoSuchBucket" else "not found"
            elif code in ("403", "AccessDenied"):
                reason = "access denied (check the credentials and the bucket policy)"
            else:
                reason = f"{code}: {error.get('Message') or exc}"
        else:
            reason = str(exc)
        return S3StoreError(f"{self.url(key)}: {operation} failed: {reason}")

    def _missing(self, exc: ClientError, key: str) -> KeyError:
        """The KeyError for a missing key, once the bucket itself is known to exist: a HEAD on a
        missing bucket is a bare 404 too, and that must not read as a missing key."""
        if not self._bucket_seen:
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except (ClientError, BotoCoreError) as bucket_exc:
                if isinstance(bucket_exc, ClientError) and self._code(bucket_exc) == "404":
                    raise S3StoreError(f"{self.url(key)}: no such bucket {self.bucket!r}") from exc
                raise self._error("HeadBucket", key, bucket_exc) from exc
            self._bucket_seen = True
        return KeyError(f"no object {self.url(key)}")

    @staticmethod
    def _code(exc: ClientError) -> str:
        return exc.response.get("Error", {}).get("Code", "")

    def get(self, key: str) -> bytes:
        return self.get_tagged(key)[0]

    def put(self, key: str, data: bytes) -> None:
        full = self._key(key)
        try:
            if len(data) < MULTIPART_THRESHOLD:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=data)
            else:
                self.client.upload_fileobj(io.BytesIO(data), self.bucket, full, Config=transfer_config())
        except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
            raise self._error("PutObject", key, exc) from exc

    def put_new(self, key: str, data: bytes) -> bool:
        """A conditional PUT (``If-None-Match: *``): S3 refuses it with 412 when the key
        exists, and with 409 when a concurrent conditional PUT of the key is in flight."""
        return self._put_on_condition(key, data, IfNoneMatch="*")

    def _put_on_condition(self, key: str, data: bytes, **condition: str) -> bool:
        """A PUT with S3's ``condition`` (IfNoneMatch or IfMatch); False when it does not hold."""
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition)
        except ClientError as exc:
            if self._code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                return False
            raise self._error("PutObject", key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("PutObject", key, exc) from exc
        return True

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        """The object and its ETag, for a later ``put_if_match`` (optimistic concurrency)."""
        full = self._key(key)
        for attempt in range(BODY_ATTEMPTS):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=full)
            except ClientError as exc:
                if self._code(exc) in _MISSING_KEY:
                    raise self._missing(exc, key) from None
                raise self._error("GetObject", key, exc) from exc
            except BotoCoreError as exc:
                raise self._error("GetObject", key, exc) from exc
            try:
                return response["Body"].read(), response["ETag"]
            except S3_RETRYABLE_DOWNLOAD_ERRORS as exc:
                if attempt == BODY_ATTEMPTS - 1:
                    raise self._error("GetObject", key, exc) from exc
        raise AssertionError("unreachable")

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> bool:
        """A conditional PUT: only over the version whose ETag is ``etag`` (``If-Match``), or,
        with None, only where there is none yet (``If-None-Match: *``). False when another
        writer got there first (412, or 409 for a concurrent conditional PUT)."""
        if etag is None:
            return self.put_new(key, data)
        return self._put_on_condition(key, data, IfMatch=etag)

    def exists(self, key: str) -> bool:
        full = self._key(key)
        try:
            self.client.head_object(Bucket=self.bucket, Key=full)
            return True
        except ClientError as exc:
            if self._code(exc) in _MISSING_KEY:
                self._missing(exc, key)
                return False
            raise self._error("HeadObject", key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("HeadObject", key, exc) from exc

    def list(self, prefix: str = "") -> list[str]:
        # The store's prefix ends at a "/", so "ds" never lists "ds2/...".
        base = f"{self.prefix}/" if self.prefix else ""
        keys = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
            for page in pages:
                keys.extend(obj["Key"][len(base) :] for obj in page.get("Contents", ()))
        except (ClientError, BotoCoreError) as exc:
            raise self._error("ListObjectsV2", prefix, exc) from exc
        return sorted(keys)

    def delete(self, key: str) -> None:
        full = self._key(key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=full)  # a missing key is a success
        except (ClientError, BotoCoreError) as exc:
            raise self._error("DeleteObject", key, exc) from exc

    def put_file(self, key: str, path: str | os.PathLike) -> None:
        full = self._key(key)
        try:
            self.client.upload_file(os.fspath(path), self.bucket, full, Config=transfer_config())
        except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
            raise self._error("upload", key, exc) from exc

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        full = self._key(key)
        try:
            # s3transfer writes to a temporary name beside the target and renames at the end.
            self.client.download_file(self.bucket, full, os.fspath(path), Config=transfer_config())
        except ClientError as exc:
            if self._code(exc) in _MISSING_KEY:
                raise self._missing(exc, key) from None
            raise self._error("download", key, exc) from exc
        except (BotoCoreError, *S3_RETRYABLE_DOWNLOAD_ERRORS) as exc:
            raise self._error("download", key, exc) from exc
