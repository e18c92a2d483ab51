"""Local implementations: a folder as the object store."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ebb.ports.objects import check_key


class FolderObjectStore:
    """Object store over a local folder; keys are relative paths with ``/``."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise KeyError(f"no object {key!r} in {self.root}") from None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a reader never sees a half-written object.
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)  # a full disk, Ctrl-C: no partial file is left behind
            if isinstance(exc, OSError):
                raise _named(exc, path) from None
            raise

    def put_new(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole under a private name, then hard-linked: link(2) fails if the name
        # exists, so of two writers one wins, and a reader never sees a half-written object.
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        try:
            tmp.write_bytes(data)
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise _named(exc, path) from None
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def locate(self, key: str) -> str:
        return str(self.root / key)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.exists():
            return []
        keys = (p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())
        return sorted(k for k in keys if k.startswith(prefix) and ".tmp" not in k)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Folders exist only for the keys under them: drop the ones left empty.
        for parent in path.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:  # not empty (or already gone)
                break

    def put_file(self, key: str, path: str | os.PathLike) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        _copy_then_rename(Path(path), target)

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        source = self._path(key)
        if not source.is_file():
            raise KeyError(f"no object {key!r} in {self.root}")
        _copy_then_rename(source, Path(path))


def _named(exc: OSError, path: Path) -> OSError:
    """``exc`` as an error naming the object it was writing (a bare ENOSPC names nothing)."""
    return type(exc)(exc.errno, f"cannot write {path}: {exc.strerror or exc}")


def _copy_then_rename(source: Path, target: Path) -> None:
    """Copy so that ``target`` appears only complete; no partial file is left on error."""
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            raise _named(exc, target) from None
        raise
