"""Run one Lambda handler the way the Lambda runtime would, in this (fresh) process.

    python tests/lambda_invoke.py MODULE TIMEOUT_S < event.json

Prints the handler's JSON result on the last line of stdout, or exits 1 after printing
the error payload Lambda would return (``errorType``, ``errorMessage``, ``stackTrace``).
``run_forked`` does the same in a process forked from tests.helpers.lambdas' fork server.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import traceback
import uuid


class LambdaContext:
    """The attributes of the Lambda runtime's context object that handlers (and powertools) read."""

    def __init__(self, function_name: str, timeout_s: float, memory_mb: int = 1769):
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory_mb
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "test"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def main() -> int:
    module_name, timeout_s = sys.argv[1], float(sys.argv[2])
    event = json.load(sys.stdin)
    try:
        module = __import__(module_name, fromlist=["handler"])
        result = module.handler(event, LambdaContext(module_name.rsplit(".", 1)[-1], timeout_s))
    except Exception as exc:  # what Lambda returns for an unhandled exception
        payload = {
            "errorType": type(exc).__name__,
            "errorMessage": str(exc),
            "stackTrace": traceback.format_exception(exc),
        }
        print("\nLAMBDA-ERROR " + json.dumps(payload), flush=True)
        return 1
    print("\nLAMBDA-RESULT " + json.dumps(result), flush=True)
    return 0


def run_forked(module_name: str, timeout_s: float, event: str, env: dict[str, str], log_path: str) -> None:
    """``main`` in a process just forked from the fork server: the function's environment in
    place of the server's, the event on stdin, stdout and stderr into ``log_path``."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [__file__, module_name, str(timeout_s)]
    sys.stdin = io.StringIO(event)
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the runtime's process ends: no interpreter shutdown, no atexit


if __name__ == "__main__":
    sys.exit(main())
