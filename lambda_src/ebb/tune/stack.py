"""``ebb tune --stack``: the search run by a deployed stack's Tune state machine
(docs/AWS.md, "Tuning on AWS"). The machine loops

    Ask -> Map over the jobs: a nested execution of the training state machine each -> Tell

until Ask has nothing to start, then Conclude. The search (``Search``, the same as a local
``ebb tune``'s) lives at ``tunes/<id>/state.json`` between the steps; each step here loads
it, does its part and stores it again.

A trial is one job id (``<tune id>-tNNN``): every execution of the trial uses its spec,
outputs (``jobs/<job id>/``) and checkpoints (``checkpoints/<job id>/``). A new trial's
first execution trains to its first rung and pauses there (``pause_after_steps``); a
promotion is an execution of the same job with ``resume: true``, which carries on from the
checkpoints, so no rung is trained twice. A Map waits for all its executions: each pass is
a rung of successive halving at once (ASHA's promotions, taken a pass at a time).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from typing import Any

from ebb.aws.config import AwsConfig
from ebb.aws.jobs import normalise_for_aws
from ebb.ports import deployment as names
from ebb.ports.keys import REPORT_KEY
from ebb.ports.objects import ObjectStore
from ebb.spec import JobSpec, SpecError, parse_spec
from ebb.stores import open_object_store
from ebb.tune.runner import BEST_FILES, tune_result
from ebb.tune.scheduler import Job, Outcome, Search
from ebb.tune.space import TuneSpec, start_point
from ebb.tune.trial import TRIAL_SPEC, last_rung_passes, outcome

STATE_FILE = "state.json"
RESULT_FILE = "tune.json"
BEST = "best"
# A tune's id is its execution's name, at most this long: a trial's job id and its
# executions' names (``<id>-tNNN-rK``) stay within Step Functions' 80 characters.
MAX_TUNE_ID = 64


class TuneInputError(ValueError):
    """The search or its base job cannot run (one line naming the field)."""


@dataclass
class TrialJob:
    """One execution of the training state machine, as the Map starts it."""

    trial: int
    rung: int
    name: str  # the execution's name
    input: dict[str, Any]  # the job spec with its control fields (ebb.ports.deployment.CONTROL_FIELDS)


def trial_job_id(tune_id: str, trial: int) -> str:
    return f"{tune_id}-t{trial:03d}"


class StackTune:
    """One search on a stack, loaded from (and saved to) ``tunes/<id>/state.json``."""

    def __init__(self, config: AwsConfig, tune_id: str, tspec: TuneSpec, base: dict[str, Any], search: Search):
        self.config, self.tune_id, self.tspec, self.base, self.search = config, tune_id, tspec, base, search
        self.started_at = time.time()
        self._trial_specs: dict[int, tuple[JobSpec, int, int]] = {}
        self._parts: dict[str, int] = {}  # a dataset's training parts, read once per step

    # -- state ---------------------------------------------------------------------
    @staticmethod
    def store(config: AwsConfig, tune_id: str) -> ObjectStore:
        return open_object_store(f"s3://{config.bucket}/{names.tune_prefix(tune_id)}")

    @classmethod
    def load(cls, config: AwsConfig, tune_id: str, submitted: dict[str, Any] | None = None) -> StackTune:
        """The search in ``tunes/<tune_id>/``; the first time, a new one from the execution's
        input (``submitted``: ``{"tune": the tune section, "job": the base job spec}``),
        checked before anything runs."""
        store = cls.store(config, tune_id)
        try:
            saved = json.loads(store.get(STATE_FILE))
        except KeyError:
            return cls._new(config, tune_id, submitted or {})
        tspec = TuneSpec.model_validate(saved["tune"])
        run = cls(config, tune_id, tspec, saved["base"], Search(tspec, saved["search"]))
        run.started_at = saved["started_at"]
        return run

    @classmethod
    def _new(cls, config: AwsConfig, tune_id: str, submitted: dict[str, Any]) -> StackTune:
        if len(tune_id) > MAX_TUNE_ID:
            raise TuneInputError(f"execution name: {tune_id} is longer than {MAX_TUNE_ID} characters")
        try:
            tspec = TuneSpec.model_validate(submitted.get("tune") or {})
        except ValueError as exc:
            raise TuneInputError(f"tune: {exc}") from None
        if not tspec.space:
            raise TuneInputError("tune.space: nothing to search")
        base = submitted.get("job")
        if not isinstance(base, dict):
            raise TuneInputError("job: the base job spec (a mapping of fields) is missing")
        try:
            spec = parse_spec(base, "job")  # the base job must be valid before any trial starts
        except SpecError as exc:
            raise TuneInputError(str(exc)) from None
        from ebb.ports.manifest import load_manifest

        spec = normalise_for_aws(spec, config, trial_job_id(tune_id, 0))
        manifest = load_manifest(open_object_store(spec.data), spec.data)
        return cls(config, tune_id, tspec, base, Search(tspec, start=start_point(tspec, spec, manifest)))

    def save(self) -> None:
        state = {
            "tune": self.tspec.model_dump(mode="json"),
            "base": self.base,
            "search": self.search.state_dict(),
            "started_at": self.started_at,
        }
        self.store(self.config, self.tune_id).put(STATE_FILE, json.dumps(state, indent=1).encode())

    # -- trials --------------------------------------------------------------------
    def trial_spec(self, trial: int) -> tuple[JobSpec, int, int]:
        """Trial ``trial``'s job spec as it runs here, its epoch in steps (at one worker's pace:
        the rungs' unit, and its rounds' length, so that rounds end on rungs) and the dataset's
        training parts."""
        if trial not in self._trial_specs:
            from ebb.engine.cadence import one_worker_epoch
            from ebb.ports.manifest import load_manifest

            doc = copy.deepcopy(self.base)
            for dotted, value in self.search.trials[trial].params.items():
                node = doc
                *parents, leaf = dotted.split(".")
                for part in parents:
                    if not isinstance(node.get(part), dict):
                        node[part] = {}
                    node = node[part]
                node[leaf] = value
            job_id = trial_job_id(self.tune_id, trial)
            doc["name"] = f"{str(doc.get('name') or self.tune_id)[:56]}-t{trial:03d}"
            doc.pop("out", None)  # a trial's outputs are its job's: jobs/<job id>/
            spec = normalise_for_aws(parse_spec(doc, f"trial {trial}"), self.config, job_id)
            if spec.data not in self._parts:
                self._parts[spec.data] = len(load_manifest(open_object_store(spec.data), spec.data).train.parts)
            parts = self._parts[spec.data]
            unit = one_worker_epoch(spec, parts)
            stop = spec.stop.model_copy(
                update={"max_epochs": last_rung_passes(self.tspec.rungs()[-1], unit, spec, parts)}
            )
            spec = spec.model_copy(update={"stop": stop, "round_steps": unit})
            self._trial_specs[trial] = (spec, unit, parts)
        return self._trial_specs[trial]

    def execution(self, job: Job) -> TrialJob:
        """The training execution that trains ``job``: to its rung's steps, from the start or
        (a promotion) from the trial's checkpoints."""
        spec, unit, _ = self.trial_spec(job.trial)
        spec = spec.model_copy(update={"stop": spec.stop.model_copy(update={"budget_usd": job.budget_usd})})
        job_id = trial_job_id(self.tune_id, job.trial)
        doc = spec.model_dump(mode="json", exclude_none=True)
        doc.update(
            {
                names.JOB_ID_FIELD: job_id,
                names.RESUME_FIELD: job.from_epochs > 0,
                names.PAUSE_FIELD: job.to_epochs * unit,
            }
        )
        return TrialJob(job.trial, job.rung, f"{job_id}-r{job.rung}", doc)

    def checkpoints(self, trial: int) -> ObjectStore:
        job_id = trial_job_id(self.tune_id, trial)
        return open_object_store(f"s3://{self.config.bucket}/{names.checkpoints_prefix(job_id)}")

    def outputs(self, trial: int) -> ObjectStore:
        return open_object_store(f"s3://{self.config.bucket}/{names.job_prefix(trial_job_id(self.tune_id, trial))}")

    # -- the steps -----------------------------------------------------------------
    def ask(self) -> list[TrialJob]:
        """Every job the search would start now: a pass's trials, all at once (the Map caps
        how many run together)."""
        jobs = []
        while (job := self.search.next_job()) is not None:
            jobs.append(self.execution(job))
        self.save()
        return jobs

    def tell(self, results: list[dict[str, Any]]) -> None:
        """Fold each execution's end into the search: ``{"trial", "ok", "error"?}``; a trial's
        state is read from its checkpoints, as a local search reads it."""
        for r in results:
            trial = int(r["trial"])
            launched = next(x for x in reversed(self.search.launches) if x["trial"] == trial)
            job = Job(**launched)
            spec, unit, _ = self.trial_spec(trial)
            got = outcome(spec, unit, self.checkpoints(trial))
            error = None
            if not r.get("ok"):
                got["status"] = "failed"
                error = _execution_error(r.get("error") or {})
            self.search.job_done(job, Outcome(**got, error=error))
        self.save()

    def conclude(self) -> dict[str, Any]:
        """``tunes/<id>/tune.json`` (the leaderboard, as a local search's) and ``best/`` (the
        best trial's report, model, plot and spec). Trials stopped between rungs keep their
        checkpoints and have no report (locally they get one, scored on the test split)."""
        bucket = f"s3://{self.config.bucket}"
        reports = {}
        for t in self.search.trials:
            try:
                reports[t.id] = json.loads(self.outputs(t.id).get(REPORT_KEY))
            except KeyError:
                reports[t.id] = {"status": "pruned"} if t.status == "paused" else {}
        result = tune_result(
            self.search,
            time.time() - self.started_at,
            reports,
            lambda trial: f"{bucket}/{names.job_prefix(trial_job_id(self.tune_id, trial))}",
        )
        store = self.store(self.config, self.tune_id)
        best = self.search.best()
        if best is not None:
            spec, _, _ = self.trial_spec(best.id)
            source = self.outputs(best.id)
            for name in BEST_FILES:
                if name == TRIAL_SPEC:
                    store.put(f"{BEST}/{name}", spec.model_dump_json(indent=2).encode())
                elif source.exists(name):
                    store.put(f"{BEST}/{name}", source.get(name))
        store.put(RESULT_FILE, json.dumps(result, indent=2).encode())
        return result

    def summary(self) -> dict[str, Any]:
        """What the dashboard's Tuning row shows: trials started and finished, the best validation."""
        best = self.search.best()
        return {
            "trials_started": len(self.search.trials),
            "trials_finished": sum(1 for t in self.search.trials if t.done),
            "best_val": best.best if best is not None else None,
        }


def max_concurrency(workers: int, account: dict[str, Any]) -> int:
    """How many trials of ``workers`` workers may run at once: each runs its workers and its
    supervisor together, from the account's unreserved concurrency (``GetAccountSettings``)."""
    return max(1, account["AccountLimit"]["UnreservedConcurrentExecutions"] // (workers + 1))


def _execution_error(error: dict[str, Any]) -> str:
    """One line from a failed nested execution's Catch: its error and cause (the execution's)."""
    cause = error.get("Cause") or ""
    try:
        described = json.loads(cause)
    except ValueError:
        described = None
    if isinstance(described, dict):
        found = {k.lower(): v for k, v in described.items()}
        cause = f"{found.get('error') or ''}: {found.get('cause') or ''}".strip(": ")
    return f"{error.get('Error') or 'failed'}: {cause}".rstrip(": ")


# -- the user's side: `ebb tune --stack NAME` ------------------------------------------------
def submit_tune(deployment, spec: JobSpec, tspec: TuneSpec, progress=print) -> dict:
    """Start the search as an execution of the stack's Tune state machine (its input: the
    search and the base job, a local dataset uploaded first); returns its ARN, name, console link."""
    from ebb.deployed import DeploymentError

    machine = deployment.outputs.get(names.TUNE_STATE_MACHINE_OUTPUT)
    if machine is None:
        raise DeploymentError(
            f"stack {deployment.stack} has no {names.TUNE_STATE_MACHINE_OUTPUT} output: deploy it again "
            "(`npx cdk deploy`) to add the Tune state machine"
        )
    if spec.out:
        raise DeploymentError("out: a trial's outputs go under jobs/<tune>-tNNN, the search's under tunes/: drop out")
    search = {"tune": tspec.model_dump(mode="json"), "job": deployment.job_input(spec, progress)}
    # The name's stem leaves room for the stamp and a trial's suffix (MAX_TUNE_ID).
    return deployment.start(machine, spec.name[: MAX_TUNE_ID - 21], {"search": search})


def watch_tune(deployment, execution_arn: str, emit=print, every_s: float = 10.0) -> tuple[str, dict | None]:
    """Print the search's progress (trials started and finished, the best validation) until its
    execution ends; returns its status and, when it succeeded, tune.json."""
    from ebb.deployed import DONE, _session

    sfn = _session().client("stepfunctions")
    tune_id = execution_arn.rsplit(":", 1)[-1]
    store = open_object_store(f"s3://{deployment.bucket}/{names.tune_prefix(tune_id)}")
    last = None
    while True:
        desc = sfn.describe_execution(executionArn=execution_arn)
        status = desc["status"]
        line = f"{status.lower():9s}"
        try:
            saved = json.loads(store.get(STATE_FILE))
        except KeyError:
            saved = None
        if saved is not None:
            trials = saved["search"]["trials"]
            done = sum(1 for t in trials if t["done"] or (t["status"] == "paused" and not t["running"]))
            running = sum(1 for t in trials if t["running"])
            scores = [min(t["scores"].values()) for t in trials if t["scores"]]
            line += f"  {len(trials)} trials: {running} training, {done} between rungs or done"
            line += f"  best val {min(scores):.4f}" if scores else ""
        if line != last:
            emit(f"[{time.strftime('%H:%M:%S')}] {line}")
            last = line
        if status in DONE:
            if status != "SUCCEEDED":
                emit(f"{desc.get('error', '')}: {desc.get('cause', '')}".strip(": "))
                return status, None
            return status, json.loads(store.get(RESULT_FILE))
        time.sleep(every_s)
