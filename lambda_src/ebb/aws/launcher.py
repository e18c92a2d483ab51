"""Workers on Lambda: Step Functions' Map starts every worker of a round, so a launch by
the supervisor is only bookkeeping. Adding workers mid-round (a schedule that scales out)
would need the supervisor to invoke the worker function; Validate refuses such specs."""

from __future__ import annotations

from ebb.engine.errors import EngineError
from ebb.ports.launcher import WorkerStart


class MapLauncher:
    def launch(self, start: WorkerStart) -> None:
        if start.donor_blob is not None:
            raise EngineError(
                f"worker {start.worker} would join mid-round, which the deployed state machine "
                "cannot start (scaling.schedule may only remove workers on AWS)"
            )

    def exited(self) -> dict[int, str]:
        return {}  # a worker whose invocation fails fails the round's Map; silence shows in its heartbeats

    def stop(self, worker: int) -> None:
        return None  # a lost worker's invocation sees it was given up on and returns
