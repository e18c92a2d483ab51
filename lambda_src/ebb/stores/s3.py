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
import threading

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ConnectTimeoutError, ReadTimeoutError
from s3transfer.utils import S3_RETRYABLE_DOWNLOAD_ERRORS

from ebb.ports.objects import check_key

# Objects of at least MULTIPART_THRESHOLD bytes go up as a multipart upload of
# MULTIPART_PART_SIZE parts, TRANSFER_CONCURRENCY at a time (and files are fetched as that
# many ranged GETs). Parts are S3's minimum 5 MiB or more, and 16 MiB x 10,000 parts allows
# 160 GB objects; minibatch parts (~100 KB) stay single PUTs, checkpoints and big raw
# inputs go in parallel parts that are retried one by one.
MULTIPART_THRESHOLD = 16 << 20
MULTIPART_PART_SIZE = 16 << 20
TRANSFER_CONCURRENCY = 8

# "standard" retries throttling (503 SlowDown), 5xx and connection errors with jittered
# exponential backoff; a fleet of workers reading one prefix meets SlowDown, hence more
# attempts than the default 3. An endpoint that does not answer at all is another matter:
# a connect or read timeout is tried TIMEOUT_ATTEMPTS times in all, so a silent endpoint
# fails within silent_endpoint_bound_s() (docs/RELIABILITY.md, "Bounds"). The read timeout
# is the longest pause between two reads of a socket, not a transfer's duration: a 16 MiB
# part on a slow link still meets it as long as bytes keep coming.
MAX_ATTEMPTS = 6
TIMEOUT_ATTEMPTS = 2
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 20.0
# Standard mode's backoff before attempt i+1 for an error other than throttling is at most
# 50 ms x 2**i (botocore.retries.standard.ExponentialBackoff).
_BACKOFF_BASE_S = 0.05


def silent_endpoint_bound_s() -> float:
    """Longest an S3 call waits on an endpoint that accepts connections (or not) and never
    answers: every timed-out attempt, and the backoff between them."""
    backoff = sum(_BACKOFF_BASE_S * 2**i for i in range(TIMEOUT_ATTEMPTS - 1))
    return TIMEOUT_ATTEMPTS * (CONNECT_TIMEOUT_S + READ_TIMEOUT_S) + backoff


def _stop_retrying_timeouts(caught_exception=None, attempts=0, request_dict=None, **_kwargs):
    """``needs-retry`` hook: a timed-out attempt is not tried again past TIMEOUT_ATTEMPTS
    (raising here ends the call with that timeout; returning None leaves the decision to
    the standard retry handler)."""
    if isinstance(caught_exception, (ConnectTimeoutError, ReadTimeoutError)):
        context = request_dict.setdefault("context", {}) if request_dict is not None else {}
        context["ebb_timeouts"] = context.get("ebb_timeouts", 0) + 1
        if context["ebb_timeouts"] >= TIMEOUT_ATTEMPTS:
            raise caught_exception
    return None


# The client's retries end with the response headers; a body cut off mid-stream is
# fetched again this many times in all (s3transfer does the same for files).
BODY_ATTEMPTS = 3

# "No such key" as each call reports it (HEAD has no body, so only the status code).
_MISSING_KEY = {"NoSuchKey", "404", "NotFound"}


class S3StoreError(OSError):
    """An S3 call failed for another reason than a missing key; the message names the URL."""


_session: boto3.session.Session | None = None
_session_lock = threading.Lock()


def s3_client():
    """A boto3 S3 client with Ebb's retry, timeout and pool settings.

    Clients come from one boto3 session per process, which parses the service model once
    (a fresh session costs ~100 ms per client); sessions are not thread-safe, hence the
    lock. The session resolves credentials once; endpoint and region are read per client.
    """
    global _session
    config = Config(
        retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        max_pool_connections=2 * TRANSFER_CONCURRENCY,
    )
    with _session_lock:
        if _session is None:
            _session = boto3.session.Session()
        client = _session.client("s3", config=config)
    client.meta.events.register_first("needs-retry.s3", _stop_retrying_timeouts)
    return client


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
                return response["Body"].read()
            except S3_RETRYABLE_DOWNLOAD_ERRORS as exc:
                if attempt == BODY_ATTEMPTS - 1:
                    raise self._error("GetObject", key, exc) from exc
        raise AssertionError("unreachable")

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
        full = self._key(key)
        try:
            self.client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if self._code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                return False
            raise self._error("PutObject", key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("PutObject", key, exc) from exc
        return True

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
