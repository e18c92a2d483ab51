"""The object store: datasets, checkpoints, models and reports (a folder, or S3).

A *location* is a folder path or an ``s3://bucket/prefix`` URL; ``ebb.stores`` opens one.
"""

from __future__ import annotations

import os
from typing import Protocol

S3_SCHEME = "s3://"


def is_s3(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is an ``s3://`` URL (rather than a local path)."""
    return isinstance(location, str) and location.startswith(S3_SCHEME)


def check_key(key: str) -> str:
    """``key`` if it is a valid object key: ``/``-separated segments, none empty, ``.`` or ``..``."""
    if not isinstance(key, str) or any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid object key {key!r}: expected segments like 'train/part-000000'")
    return key


class ObjectStore(Protocol):
    """A flat key -> bytes namespace.

    Keys are checked by :func:`check_key` (a bad one is a ``ValueError``); ``get`` and
    ``get_file`` of a missing key raise ``KeyError``; ``delete`` of a missing key is a no-op;
    ``list`` returns the sorted keys starting with ``prefix`` (a plain string prefix).
    """

    def get(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes) -> None: ...

    def put_new(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` only if no object is there (atomically: of two
        writers, one wins); returns whether this call created it."""
        ...

    def exists(self, key: str) -> bool: ...

    def locate(self, key: str) -> str:
        """Where ``key`` is, for messages: a path, or an ``s3://`` URL."""
        ...

    def list(self, prefix: str = "") -> list[str]: ...

    def delete(self, key: str) -> None: ...

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Store the file at ``path`` under ``key``, streamed (never whole in memory)."""
        ...

    def get_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Write the object ``key`` to ``path``, streamed; ``path`` appears only when complete."""
        ...
