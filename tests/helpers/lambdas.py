"""Invoke Lambda handlers as the Lambda service would: each in its own process, with a
context, its event as JSON in and its result as JSON out; and drive a job through them
the way the state machine does (docs/AWS.md).

Each invocation is a new process forked from a fork server that has imported the
third-party libraries the handlers import (torch, numpy, scipy, boto3, redis, pydantic):
none of them keeps state or reads the environment at import, so the child is what a cold
start would be (the handler's own modules, which read their environment, are imported in
the child, with the function's environment in place) without paying 2-3 s of imports per
invocation, which was most of the AWS rehearsals' time.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed

from tests.helpers.lambda_invoke import run_forked

HANDLERS = "ebb.aws.handlers."
TUNE_HANDLER = "ebb.tune.handler"  # the one handler above the AWS layer (stacks/compute.py)
# What the fork server imports once: libraries only, never an `ebb` module.
PRELOAD = [
    "numpy",
    "torch",
    "scipy.optimize",
    "scipy.signal",
    "scipy.stats",
    "boto3",
    "botocore.session",
    "redis",
    "pydantic",
]
_FORKS = multiprocessing.get_context("forkserver")
_FORKS.set_forkserver_preload(PRELOAD)
_LOGS = tempfile.mkdtemp(prefix="ebb-lambda-logs-")


def handler_module(name: str) -> str:
    """A handler's module from its short name (``worker``) or its module (``ebb.tune.handler``)."""
    return name if name.startswith("ebb.") else HANDLERS + name


class LambdaError(RuntimeError):
    """A handler raised: ``error_type`` and ``message`` as Lambda reports them."""

    def __init__(self, payload: dict, output: str):
        super().__init__(f"{payload['errorType']}: {payload['errorMessage']}")
        self.error_type, self.message, self.payload, self.output = (
            payload["errorType"],
            payload["errorMessage"],
            payload,
            output,
        )


class HandlerProcess:
    """An invocation's process, with the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, process: multiprocessing.process.BaseProcess):
        self._process = process
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return None if self._process.is_alive() else self._process.exitcode

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        self._process.join(timeout)
        if self._process.is_alive():
            raise subprocess.TimeoutExpired(f"handler process {self.pid}", timeout or 0)
        return self._process.exitcode


class Invocation:
    """A handler running in its own process; ``result()`` waits for its JSON result."""

    def __init__(self, name: str, event: dict, env: dict[str, str], timeout_s: float = 150.0):
        self.name, self.event = name, event
        fd, self._log = tempfile.mkstemp(dir=_LOGS, suffix=".log")
        os.close(fd)
        process = _FORKS.Process(
            target=run_forked, args=(handler_module(name), timeout_s, json.dumps(event), dict(env), self._log)
        )
        process.start()
        self.proc = HandlerProcess(process)
        self.timeout_s = timeout_s
        self.output = ""

    def result(self) -> dict:
        self.proc.wait(timeout=self.timeout_s + 30)
        if os.path.exists(self._log):
            with open(self._log) as f:
                self.output = f.read()
            os.unlink(self._log)
        last = self.output.rstrip().rsplit("\n", 1)[-1]
        if last.startswith("LAMBDA-RESULT "):
            return json.loads(last[len("LAMBDA-RESULT ") :])
        if last.startswith("LAMBDA-ERROR "):
            raise LambdaError(json.loads(last[len("LAMBDA-ERROR ") :]), self.output)
        raise RuntimeError(f"{self.name} died (exit {self.proc.returncode}):\n{self.output[-3000:]}")


def invoke(name: str, event: dict, env: dict[str, str], timeout_s: float = 150.0) -> dict:
    return Invocation(name, event, env, timeout_s).result()


def _parallel(calls: list[Invocation]) -> dict:
    """Wait for every branch; the first that fails fails them all (as a Parallel state does:
    the other branches are stopped). Returns the first call's result."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(c.result) for c in calls]
        try:
            for f in as_completed(futures):
                f.result()
        except BaseException:
            for c in calls:
                if c.proc.poll() is None:
                    c.proc.kill()
            raise
    return futures[0].result()


def run_job(spec: dict, execution: str, env: dict[str, str], timeout_s: float = 150.0) -> tuple[dict, list[dict]]:
    """Validate → Prepare? → rounds of Parallel(supervisor ‖ workers) → Finalize, each handler
    in its own process; returns (finalize's result, the rounds' supervisor results)."""
    state = invoke("validate", {"spec": spec, "execution": execution}, env, timeout_s)
    ref = {"job_id": state["job_id"], "spec_key": state["spec_key"]}
    if state["prepare"]:
        invoke("prepare", ref, env, timeout_s)
    rounds, round_, workers = [], state["round"], state["workers"]
    while True:
        calls = [Invocation("supervisor", {**ref, "round": round_}, env, timeout_s)]
        calls += [Invocation("worker", {**ref, "round": round_, "worker": w}, env, timeout_s) for w in workers]
        outcome = _parallel(calls)
        rounds.append({**outcome, "invocations": calls})
        if outcome["status"] == "finished":
            break
        round_, workers = outcome["round"], outcome["workers"]
    return invoke("finalize", ref, env, timeout_s), rounds
