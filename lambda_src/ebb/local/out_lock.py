"""One job per output folder: an exclusive lock object in ``OUT`` (docs/RELIABILITY.md).

The lock is ``OUT/lock.json``, created only if absent — ``O_EXCL`` semantics on a folder (a
hard link, which fails if the name exists), a conditional PUT (``If-None-Match: *``) on
S3 — and holds its owner's pid, host and process start time. It is taken before anything
is written to ``OUT`` and removed when the job ends, however it ends (a ``kill -9`` leaves
it: the next job finds its owner dead and says how to continue).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import Any

from ebb.ports.keys import LOCK_KEY
from ebb.ports.objects import ObjectStore


class OutLocked(RuntimeError):
    """``OUT`` belongs to another job (live, dead or not checkable); the message says what to do."""


def _start_ticks(pid: int) -> int | None:
    """The process's start time since boot (clock ticks), which tells a pid reused by
    another process from the one that took the lock; None where /proc cannot say."""
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
        return int(stat.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(owner: dict[str, Any]) -> bool | None:
    """Whether the lock's owner still runs: True, False, or None when it ran on another host."""
    if owner.get("host") != socket.gethostname():
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    ticks = _start_ticks(pid)
    return ticks is None or owner.get("start_ticks") in (None, ticks)


class OutLock:
    """The lock on ``out`` (a store; ``location`` names it in messages), held from
    :meth:`acquire` to :meth:`release`."""

    def __init__(self, out: ObjectStore, location: str):
        self.out, self.location = out, location
        self.token = uuid.uuid4().hex
        self.held = False

    def _body(self) -> bytes:
        pid = os.getpid()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        owner = {"pid": pid, "host": socket.gethostname(), "start_ticks": _start_ticks(pid), "since": started}
        return json.dumps({**owner, "token": self.token}).encode()

    def _owner(self) -> dict[str, Any]:
        try:
            owner = json.loads(self.out.get(LOCK_KEY))
        except KeyError:
            return {}
        except ValueError:
            return {"unreadable": True}
        return owner if isinstance(owner, dict) else {"unreadable": True}

    def acquire(self, *, resume: bool = False) -> None:
        """Take the lock, or raise :class:`OutLocked` in one line. With ``resume`` a dead
        owner's lock (same host) is taken over; without, a dead owner is named and
        ``--resume`` offered."""
        for _ in range(3):  # the owner may release between our attempt and our read
            if self.out.put_new(LOCK_KEY, self._body()):
                self.held = True
                return
            owner = self._owner()
            if not owner:
                continue
            alive = _alive(owner)
            who = f"pid {owner.get('pid')} on host {owner.get('host')}, since {owner.get('since')}"
            where = f"{self.location.rstrip('/')}/{LOCK_KEY}"
            if owner.get("unreadable"):
                raise OutLocked(f"out: {where} is unreadable; if no job uses {self.location}, delete it")
            if alive:
                raise OutLocked(
                    f"out: {self.location} is in use by another job ({who}); wait for it to end, "
                    "or choose another --out"
                )
            if alive is None:
                raise OutLocked(
                    f"out: {self.location} is locked by a job on another host ({who}), which cannot be "
                    f"checked from here; if it no longer runs, delete {where} and run "
                    f"`ebb train --resume {self.location}`"
                )
            if not resume:
                raise OutLocked(
                    f"out: {self.location} belongs to a job that is no longer running ({who}); "
                    f"continue it with `ebb train --resume {self.location}`, or delete {where} to start over"
                )
            # A dead owner's lock, and we resume its job: remove it and race for it again
            # (another resumer may win; the loop then finds it alive).
            self.out.delete(LOCK_KEY)
        raise OutLocked(f"out: {self.location}: could not take {LOCK_KEY} (it keeps changing hands)")

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        if not self.held:
            return
        self.held = False
        if self._owner().get("token") == self.token:
            self.out.delete(LOCK_KEY)
