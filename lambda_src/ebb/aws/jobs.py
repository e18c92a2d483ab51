"""A job's places on AWS, resolved from its id: the data-access layer of the handlers.

Object keys (docs/AWS.md; ``ebb.ports.deployment``): the normalised spec at ``jobs/<id>/spec.json``,
outputs and ``progress.json`` under the spec's ``out`` (default ``s3://<bucket>/jobs/<id>``),
the abort marker at ``jobs/<id>/abort.json``, checkpoints under ``checkpoints/<id>/``,
channel overflow under ``scratch/<id>/``. Imports stay light here: the zip functions
(validate, on_failure) have no numpy or torch.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property

from pydantic import ValidationError

from ebb.aws.config import AwsConfig
from ebb.aws.contract import JobControl, PackRef
from ebb.engine import checkpoint
from ebb.ports import deployment as names
from ebb.ports.keys import PROGRESS_KEY
from ebb.ports.objects import ObjectStore
from ebb.spec import JobSpec
from ebb.stores import open_object_store

# The datasets this function instance holds warm (``Job.keep_warm``).
_WARMED: set[str] = set()

# How often a running supervisor looks for the abort marker (one S3 request each time).
ABORT_POLL_S = 3.0


class JobStopped(RuntimeError):
    """The job's abort marker is set: a state failed, or the execution was stopped."""


@dataclass
class Job:
    config: AwsConfig
    job_id: str
    spec: JobSpec

    @classmethod
    def load(cls, config: AwsConfig, job_id: str, key: str) -> Job:
        raw = cls.bucket_store(config).get(key)
        return cls(config, job_id, JobSpec.model_validate_json(raw))

    @staticmethod
    def bucket_store(config: AwsConfig) -> ObjectStore:
        return open_object_store(f"s3://{config.bucket}")

    @cached_property
    def data(self) -> ObjectStore:
        return open_object_store(self.spec.data)

    @cached_property
    def out(self) -> ObjectStore:
        return open_object_store(self.spec.out_location)

    @cached_property
    def bucket(self) -> ObjectStore:
        return self.bucket_store(self.config)

    @cached_property
    def checkpoints(self) -> ObjectStore:
        return open_object_store(f"s3://{self.config.bucket}/{names.checkpoints_prefix(self.job_id)}")

    @cached_property
    def scratch(self) -> ObjectStore:
        return open_object_store(f"s3://{self.config.bucket}/{names.scratch_prefix(self.job_id)}")

    @cached_property
    def cache(self):
        """The job's stores on the deployment's cache (TLS, AUTH token from Secrets Manager)."""
        from ebb.stores.elasticache import open_cache

        return open_cache(self.redis_job, environ=self.config.env)

    def update_store(self):
        """Where the steps' updates go: the deployment's cache."""
        return self.cache.updates

    def channel(self, round_: int):
        """The signal channel of one round: Redis or SNS/SQS, as the spec says."""
        if self.spec.aws.signal_channel == "sns_sqs":
            from ebb.stores.sns_sqs import SnsSqsSignalChannel

            return SnsSqsSignalChannel.from_env(self.redis_job, round_, self.scratch, environ=self.config.env)
        return self.cache.channel(round_)

    @property
    def redis_job(self) -> str:
        """The job's namespace in the shared cache: the execution's id, unique per run."""
        return self.job_id

    def keep_warm(self) -> None:
        """Load and convert the training split once per function instance (``engine.parts.warm_up``):
        a trial pack's later jobs on this instance read no part again. Its first load is billed
        in this invocation's time (the job's); nothing is kept when it is over the part cache."""
        if self.spec.data in _WARMED:
            return
        from ebb.engine.parts import warm_up
        from ebb.models import build_model
        from ebb.ports.manifest import load_manifest

        manifest = load_manifest(self.data, self.spec.data)
        model = build_model(self.spec.model, manifest, self.spec.hyper, self.spec.seed)
        warm_up(self.data, manifest, model, self.spec.aws.part_cache_bytes())
        _WARMED.add(self.spec.data)

    def write_progress(self, progress: dict) -> None:
        self.out.put(PROGRESS_KEY, json.dumps(progress, separators=(",", ":")).encode())

    # -- the abort marker: written by OnFailure, polled by a running supervisor ----------
    def abort(self, reason: str) -> None:
        """Set the marker: every invocation of this job still running returns within seconds."""
        body = {"reason": reason, "at": time.time()}
        self.bucket.put(names.abort_key(self.job_id), json.dumps(body).encode())

    def aborted(self) -> str | None:
        """Why the job was stopped, if its abort marker is set."""
        try:
            return json.loads(self.bucket.get(names.abort_key(self.job_id))).get("reason", "stopped")
        except KeyError:
            return None

    def abort_check(self, every_s: float = ABORT_POLL_S) -> Callable[[], BaseException | None]:
        """For the supervisor's ``interrupted`` hook, asked every poll: a JobStopped once the
        marker is set, reading it at most every ``every_s``."""
        last = -every_s

        def check() -> BaseException | None:
            nonlocal last
            if time.monotonic() - last < every_s:
                return None
            last = time.monotonic()
            reason = self.aborted()
            return JobStopped(f"the job was stopped: {reason}") if reason is not None else None

        return check


@contextlib.contextmanager
def heartbeat_while(beat: Callable[[], None], every_s: float = 1.0) -> Iterator[None]:
    """Call ``beat`` now and every ``every_s`` until the block ends: the workers of a round
    hear from the supervisor while it does something long before its loop (a preflight)."""
    stopped = threading.Event()

    def run() -> None:
        while not stopped.is_set():
            try:
                beat()
            except Exception:  # the block meets the same store and says what is wrong
                pass
            stopped.wait(every_s)

    thread = threading.Thread(target=run, name="ebb-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join(timeout=5)


class JobSpecError(ValueError):
    """The execution's job spec cannot run on this deployment (the message names the field)."""


def split_control(raw: dict) -> tuple[dict, JobControl]:
    """An execution's input -> (the job spec's fields, its ``JobControl``): the fields of
    ``ebb.ports.deployment.CONTROL_FIELDS`` steer the execution and are not the spec's."""
    spec = {k: v for k, v in raw.items() if k not in names.CONTROL_FIELDS}
    try:
        control = JobControl.model_validate({k: raw[k] for k in names.CONTROL_FIELDS if k in raw})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise JobSpecError(f"execution input: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    return spec, control


def job_of_execution(name: str | None, execution_input: str, packs: ObjectStore | None = None) -> str | None:
    """The job an execution ran: the ``job_id`` its input names (a trial's executions share
    one), else the execution's name (as Validate decides). A trial pack's execution runs many
    jobs, its input naming the first: the one it was training is in its search's state
    (``packs``: the bucket; ``tunes/<id>/state.json``'s ``packs[k].job.job_id``)."""
    try:
        raw = json.loads(execution_input)
    except ValueError:
        return name
    given = raw.get(names.JOB_ID_FIELD) if isinstance(raw, dict) else None
    pack = raw.get(names.PACK_FIELD) if isinstance(raw, dict) else None
    if packs is not None and isinstance(pack, dict):
        given = _pack_job(packs, pack) or given
    try:
        return JobControl.model_validate({names.JOB_ID_FIELD: given}).job_id or name
    except ValidationError:  # not a job id Validate would have taken: it ran as the execution
        return name


def _pack_job(packs: ObjectStore, pack: dict) -> str | None:
    """The job a trial pack is training now, as its search's state says (None: between jobs, or unknown)."""
    try:
        ref = PackRef.model_validate(pack)
        state = json.loads(packs.get(names.tune_state_key(ref.tune_id)))
        return state["packs"][ref.pack]["job"]["job_id"]
    except (ValidationError, KeyError, IndexError, TypeError, ValueError):
        return None


def resume_point(config: AwsConfig, job_id: str, workers: int) -> tuple[int, list[int]]:
    """Where a resumed job's rounds start: after its checkpoints' last complete round, with
    that round's workers; from the start (round 0, every worker) when it completed none, as
    a local ``--resume`` does. A finished job is refused: there is nothing left to train."""
    store = open_object_store(f"s3://{config.bucket}/{names.checkpoints_prefix(job_id)}")
    done = checkpoint.latest(store)
    if done is None:
        return 0, list(range(workers))
    if done["finished"]:
        raise JobSpecError(f"resume: job {job_id} has finished (its checkpoints' last round is its last)")
    return done["round"] + 1, list(done["workers"])


def normalise_for_aws(spec: JobSpec, config: AwsConfig, job_id: str) -> JobSpec:
    """The spec as it runs here: bucket-relative locations made s3:// URLs, outputs under
    ``jobs/<id>``, and what the deployment cannot do refused with the field's name: every
    location must be in the stack's bucket, ``out`` under ``jobs/`` (where the functions
    may write outputs) and a dataset to prepare under ``datasets/``."""
    bucket = f"s3://{config.bucket}"

    def absolute(location: str) -> str:
        return location if location.startswith("s3://") else f"{bucket}/{location.lstrip('/')}"

    def readable(field: str, location: str) -> str:
        url = absolute(location)
        if not url.startswith(f"{bucket}/"):
            raise JobSpecError(
                f"{field}: {location} is outside this stack's bucket; the functions may read only "
                f"{bucket}/ (a local folder given to `ebb submit` is uploaded there)"
            )
        return url

    if spec.out:
        out = absolute(spec.out)
        if not out.startswith(f"{bucket}/{names.JOBS}") or out.rstrip("/") == f"{bucket}/{names.JOBS.rstrip('/')}":
            raise JobSpecError(
                f"out: {spec.out} is outside what this stack may write; a job's outputs go under "
                f"{bucket}/{names.JOBS} (e.g. out: {names.JOBS}my-run), or leave out unset for "
                f"{names.JOBS}<execution>"
            )

    if spec.redis_urls:
        raise JobSpecError("redis_urls: a deployed job uses the stack's cache; remove the field")
    if spec.workers > config.max_workers:
        raise JobSpecError(
            f"workers: {spec.workers} is more than this deployment's {config.max_workers} (CDK context ebb:maxWorkers)"
        )
    grows = max([spec.workers] + [e.workers for e in spec.scaling.schedule])
    if spec.scaling.policy == "schedule" and grows > spec.workers:
        raise JobSpecError(
            f"scaling.schedule: {grows} workers is more than the {spec.workers} the job starts with; "
            "on AWS a schedule may only remove workers (start with the most you need)"
        )
    update: dict = {
        "data": readable("data", spec.data),
        "out": absolute(spec.out) if spec.out else f"{bucket}/{names.job_prefix(job_id)}",
    }
    if spec.prepare is not None:
        if not update["data"].startswith(f"{bucket}/{names.DATASETS}"):
            raise JobSpecError(
                f"data: with a prepare section, data must be under {names.DATASETS} in the bucket "
                f"(the Prepare function writes only there), got {spec.data}"
            )
        prepare = spec.prepare.model_copy(
            update={
                "input": readable("prepare.input", spec.prepare.input),
                "test_input": readable("prepare.test_input", spec.prepare.test_input)
                if spec.prepare.test_input
                else None,
            }
        )
        update["prepare"] = prepare
    return spec.model_copy(update=update)
