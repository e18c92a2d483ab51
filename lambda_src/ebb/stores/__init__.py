"""Storage back ends behind the engine's interfaces: local ones here, AWS ones beside them.

A *location* is a folder path or an ``s3://bucket/prefix`` URL (``ebb.ports.objects.is_s3``);
:func:`open_object_store` turns one into an :class:`~ebb.ports.objects.ObjectStore`. boto3 is imported only when an
S3 location is opened, so local runs never pay for it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from ebb.ports.objects import S3_SCHEME, ObjectStore, is_s3
from ebb.stores.local import FolderObjectStore

# S3's rules for new buckets: 3-63 lowercase letters, digits, dots and hyphens.
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``; a ``ValueError`` naming ``url`` if malformed."""
    if not is_s3(url):
        raise ValueError(f"not an S3 URL: {url!r} (expected s3://bucket/prefix)")
    bucket, _, path = url[len(S3_SCHEME) :].partition("/")
    if not _BUCKET_NAME.fullmatch(bucket):
        raise ValueError(
            f"malformed S3 URL {url!r}: expected s3://bucket/prefix with a bucket name of 3-63 "
            "lowercase letters, digits, dots and hyphens"
        )
    path = path.rstrip("/")
    if path and any(part in ("", ".", "..") for part in path.split("/")):
        raise ValueError(f"malformed S3 URL {url!r}: empty, '.' or '..' path segment")
    return bucket, path


def open_object_store(location: str | os.PathLike) -> ObjectStore:
    """An :class:`~ebb.stores.s3.S3ObjectStore` for ``s3://bucket/prefix``, else a folder store."""
    if is_s3(location):
        bucket, prefix = parse_s3_url(location)
        from ebb.stores.s3 import S3ObjectStore

        return S3ObjectStore(bucket, prefix)
    return FolderObjectStore(location)


def join_location(base: str | os.PathLike, *parts: str) -> str:
    """``base`` extended by ``parts``: ``s3://b/x`` + ``y`` -> ``s3://b/x/y``; paths as ``os.path.join``."""
    if is_s3(base):
        parse_s3_url(base)
        tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
        return f"{base.rstrip('/')}/{tail}" if tail else base
    return os.path.join(base, *parts)


@contextmanager
def local_copy(location: str | os.PathLike) -> Iterator[Path]:
    """A local path holding the file at ``location``: the path itself, or for ``s3://bucket/key``
    a temporary copy (streamed, same file name) deleted on exit, also on error.
    A missing S3 object is a ``KeyError``."""
    if not is_s3(location):
        yield Path(location)
        return
    bucket, key = parse_s3_url(location)
    if not key:
        raise ValueError(f"{location!r} names a bucket, not an object (expected s3://bucket/key)")
    from ebb.stores.s3 import S3ObjectStore

    folder = tempfile.mkdtemp(prefix="ebb-fetch-")
    try:
        # The file name is kept: readers may go by it (MovieLens .csv / .dat / u.data).
        path = Path(folder, PurePosixPath(key).name)
        S3ObjectStore(bucket).get_file(key, path)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)
