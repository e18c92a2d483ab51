"""``ebb tune --stack``: the search run by a deployed stack's Tune state machine
(docs/AWS.md, "Tuning on AWS"), in *trial packs*, as a local ``ebb tune`` runs it. The machine loops

    Ask -> Map over the packs (up to ``fleets``): a nested execution of the training state
           machine each, which trains the search's jobs back to back -> Tell

until Ask has nothing to start, then Conclude. Inside a pack's execution, each job's end
goes to NextJob (``next`` here): the job's outcome is told to the search and the search
asked for the pack's next job, which the same execution validates and trains; none yet
while another pack trains (a promotion may come of it), and the execution waits and asks
again; none at all, and it ends. The search (``Search``, the same as a local ``ebb tune``'s)
lives at ``tunes/<id>/state.json`` between the steps; each step loads it, does its part and
stores it again only over the version it read (S3's ``If-Match``): the fleets' decisions,
made at the same time, are taken one after another (a step that lost the race runs again).

What a pack pays once (its execution's invocations and transitions, the search's decisions
between its jobs: ``cost.meter.pack_cost``) is recorded in the state and shared out by the
trials' seconds in it, as a local pack's (``ebb.tune.runner``); the jobs are metered as the
pack's (``packed``), and Conclude adds each trial's share to its report (``cost.pack_usd``).

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
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ebb.aws.config import AwsConfig
from ebb.aws.jobs import normalise_for_aws
from ebb.ports import deployment as names
from ebb.ports.keys import REPORT_KEY
from ebb.ports.objects import ObjectStore
from ebb.spec import JobSpec, SpecError, parse_spec
from ebb.stores import open_object_store
from ebb.stores.s3 import S3ObjectStore
from ebb.tune.runner import BEST_FILES, pack_totals, pack_usd, price_pack, reshare, tune_result, with_pack_share
from ebb.tune.scheduler import Job, Outcome, Search
from ebb.tune.space import TuneSpec, start_point
from ebb.tune.trial import TRIAL_SPEC, close, last_rung_passes, outcome

STATE_FILE = names.TUNE_STATE_FILE
RESULT_FILE = "tune.json"
BEST = "best"
# A tune's id is its execution's name, at most this long: a trial's job id and its
# executions' names (``<id>-tNNN-rK``) stay within Step Functions' 80 characters.
MAX_TUNE_ID = 64
# Events a job adds to its pack's execution beyond Validate's count (JOB_EVENTS): the pack's
# InPack?, NextJob (task), Job? and NextInput states.
PACK_JOB_EVENTS = 12
# States each job of a pack passes beside its rounds' (priced as the pack's: the job's own meter
# prices none): Validate, Prepare?, Paused or Finalize, InPack?, NextJob, Job?, NextInput.
PACK_JOB_STATES = 7
# Events a pack's wait for a job adds to its execution (Job?, WaitForJob, NextJob; names.PACK_POLL_S each).
POLL_EVENTS = 8
# A decision that lost the race for the state to another fleet's is taken again, at most so often.
DECIDE_ATTEMPTS = 20


class TuneInputError(ValueError):
    """The search or its base job cannot run (one line naming the field)."""


@dataclass
class TrialJob:
    """One execution of the training state machine, as the Map starts it."""

    trial: int
    rung: int
    name: str  # the execution's name
    input: dict[str, Any]  # the job spec with its control fields (ebb.ports.deployment.CONTROL_FIELDS)


@dataclass
class PackStart:
    """One trial pack's execution of the training state machine, as the Map starts it: its
    first job's input, with the ``pack`` control field."""

    pack: int
    name: str  # the execution's name
    input: dict[str, Any]


def trial_job_id(tune_id: str, trial: int) -> str:
    return f"{tune_id}-t{trial:03d}"


def pack_name(tune_id: str, pack: int) -> str:
    return f"{tune_id}-p{pack:03d}"


class StackTune:
    """One search on a stack, loaded from (and saved to) ``tunes/<id>/state.json``."""

    def __init__(self, config: AwsConfig, tune_id: str, tspec: TuneSpec, base: dict[str, Any], search: Search):
        self.config, self.tune_id, self.tspec, self.base, self.search = config, tune_id, tspec, base, search
        self.started_at = time.time()
        self.fleets = 1  # trial packs at once (``ebb tune --stack --fleets``)
        self.packs: list[dict[str, Any]] = []  # every pack: what it paid once, its jobs, each trial's share
        self._etag: str | None = None  # the state's version this was loaded from (None: new)
        self._trial_specs: dict[int, tuple[JobSpec, int, int]] = {}
        self._parts: dict[str, int] = {}  # a dataset's training parts, read once per step

    # -- state ---------------------------------------------------------------------
    @staticmethod
    def store(config: AwsConfig, tune_id: str) -> S3ObjectStore:
        """The search's folder in the bucket (S3: its state is written with conditional PUTs)."""
        store = open_object_store(f"s3://{config.bucket}/{names.tune_prefix(tune_id)}")
        assert isinstance(store, S3ObjectStore)
        return store

    @classmethod
    def load(cls, config: AwsConfig, tune_id: str, submitted: dict[str, Any] | None = None) -> StackTune:
        """The search in ``tunes/<tune_id>/``; the first time, a new one from the execution's
        input (``submitted``: ``{"tune": the tune section, "job": the base job spec}``),
        checked before anything runs."""
        store = cls.store(config, tune_id)
        try:
            raw, etag = store.get_tagged(STATE_FILE)
        except KeyError:
            return cls._new(config, tune_id, submitted or {})
        saved = json.loads(raw)
        tspec = TuneSpec.model_validate(saved["tune"])
        run = cls(config, tune_id, tspec, saved["base"], Search(tspec, saved["search"]))
        run.started_at = saved["started_at"]
        run.fleets, run.packs, run._etag = saved.get("fleets", 1), saved.get("packs", []), etag
        return run

    @classmethod
    def step(
        cls, config: AwsConfig, tune_id: str, act: Callable[[StackTune], Any], submitted: dict[str, Any] | None = None
    ) -> tuple[StackTune, Any]:
        """``act`` on the search, stored only over the version it was loaded from: another
        fleet's decision stored meanwhile, and ``act`` runs again on the newer state."""
        for attempt in range(DECIDE_ATTEMPTS):
            run = cls.load(config, tune_id, submitted)
            done = act(run)
            if run.save():
                return run, done
            time.sleep(random.uniform(0.05, 0.3) * (1 + attempt))
        raise RuntimeError(f"tune {tune_id}: its state changed under {DECIDE_ATTEMPTS} attempts to store a decision")

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
        fleets = submitted.get("fleets", 1)
        if not isinstance(fleets, int) or isinstance(fleets, bool) or fleets < 1:
            raise TuneInputError(f"fleets: {fleets!r} is not a number of trial packs at once (1 or more)")
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
        run = cls(config, tune_id, tspec, base, Search(tspec, start=start_point(tspec, spec, manifest)))
        run.fleets = fleets
        return run

    def save(self) -> bool:
        """Store the state over the version loaded (False: another step stored one meanwhile)."""
        state = {
            "tune": self.tspec.model_dump(mode="json"),
            "base": self.base,
            "search": self.search.state_dict(),
            "started_at": self.started_at,
            "fleets": self.fleets,
            "packs": self.packs,
        }
        return self.store(self.config, self.tune_id).put_if_match(
            STATE_FILE, json.dumps(state, indent=1).encode(), self._etag
        )

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
        budget = job.budget_usd
        if budget is not None:  # the engine meters the job alone: less its trial's pack share
            budget -= pack_usd(self.packs, job.trial)
        spec = spec.model_copy(update={"stop": spec.stop.model_copy(update={"budget_usd": budget})})
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
    def ask(self, account: dict[str, Any]) -> list[PackStart]:
        """A pack for each fleet the search has a job for now (at most ``fleets``, and what
        the account's unreserved concurrency holds of fleets of P workers and a supervisor):
        each pack's execution starts with that job."""
        fleets = min(self.fleets, max_concurrency(self._workers(), account))
        starts = []
        for slot in range(fleets):
            job = self.search.next_job()
            if job is None:
                break
            record = self._open_pack(slot, job)
            starts.append(PackStart(record["pack"], pack_name(self.tune_id, record["pack"]), self._start(record, job)))
        return starts

    def next(self, pack: int, job_id: str | None = None) -> dict[str, Any]:
        """A pack's job (``job_id``) has ended well (its execution reached NextJob): tell the
        search, and ask it for the pack's next job. ``{"input": its execution input}``; or
        ``{"wait": True}``: none now, but another pack's job is training and may end in one (a
        promotion): the execution waits (a Wait state, no function billed) and asks again
        with the same ``job_id`` (a poll: told already); or ``{"done": True}``: the pack ends
        (the search is over for it, or another job might overflow the execution's history)."""
        started = time.monotonic()
        record = self.packs[pack]
        running = record["job"]
        polled = running is None and job_id is not None and record.get("told") == job_id
        if not polled and (running is None or (job_id is not None and running["job_id"] != job_id)):
            # (a repeated NextJob must not fold the pack's next job in as ended)
            raise TuneInputError(f"pack {pack}: job {job_id} is not the job it runs ({running and running['job_id']})")
        if not polled:
            self._job_ended(record, ok=True)
            record["told"] = running["job_id"]
        longest = max(self.search.rungs[-1], self.tspec.max_epochs)  # (a ladder sized from the base trial too)
        room = record["events"] + self._job_events(longest) + POLL_EVENTS <= names.HISTORY_LIMIT
        job = self.search.next_job() if room else None
        if not polled:  # a decision after a job, which the fleet waited for (the local pack's model)
            record["decisions"] += 1
            record["decide_seconds"] = round(record["decide_seconds"] + time.monotonic() - started, 4)
        if job is None and room and any(p["open"] and p["job"] is not None for p in self.packs):
            record["polls"] = record.get("polls", 0) + 1  # (its transitions priced with the pack's)
            record["events"] += POLL_EVENTS
            self._reprice(record)
            return {"wait": True}
        if job is None:
            self._close_pack(record)
            return {"done": True}
        return {"input": self._start(record, job)}

    def tell(self, results: list[dict[str, Any]]) -> None:
        """The packs' executions have ended (``{"pack", "ok", "error"?}`` each): a failed one's
        job, if the search still waits for it, is a failed trial, with its error."""
        for r in results:
            record = self.packs[int(r["pack"])]
            if record["job"] is not None:
                self._job_ended(record, ok=bool(r.get("ok")), error=_execution_error(r.get("error") or {}))
            if record["open"]:
                self._close_pack(record)

    # -- packs -----------------------------------------------------------------------
    def _workers(self) -> int:
        return parse_spec(copy.deepcopy(self.base), "job").workers

    def _priced(self) -> JobSpec:
        """The job spec a pack is priced with: the deployed functions' (as Validate prices a job)."""
        from ebb.aws.deployment import Deployment

        return Deployment.from_env(self.config.env).priced(self.trial_spec(0)[0])

    def _job_events(self, epochs: float) -> int:
        """At most how many events a job of ``epochs`` epochs adds to its pack's execution: a
        round per epoch (round_steps: one worker's epoch), its restarts, its states."""
        spec = self.trial_spec(0)[0]
        rounds = math.ceil(epochs) + spec.faults.max_restarts
        per_round = names.ROUND_EVENTS + names.EVENTS_PER_INLINE_WORKER * spec.workers
        return names.JOB_EVENTS + PACK_JOB_EVENTS + rounds * per_round

    def _open_pack(self, slot: int, first: Job) -> dict[str, Any]:
        """A pack's record: on a stack it pays no start of its own (its first job's workers
        start cold and load the data, in their own time; the pack's later jobs find them warm)."""
        record: dict[str, Any] = {
            "pack": len(self.packs),
            "slot": slot,
            "workers": self._workers(),
            "execution": pack_name(self.tune_id, len(self.packs)),
            "jobs": [],
            "open": True,
            "job": None,
            "cold_start_s": 0.0,
            "start_seconds": 0.0,
            "loads": 0,
            "decisions": 0,
            "decide_seconds": 0.0,
            "first_trial": first.trial,
            "events": 0,
        }
        price_pack(record, self._priced())
        record["shares"] = {str(first.trial): record["usd"]}
        self.search.trials[first.trial].cost_usd += record["usd"]
        self.packs.append(record)
        return record

    def _start(self, record: dict[str, Any], job: Job) -> dict[str, Any]:
        """``job`` in ``record``'s pack: its execution input (the ``pack`` control field on)."""
        latest = _latest_round(self.checkpoints(job.trial))
        job_id = trial_job_id(self.tune_id, job.trial)  # (OnFailure reads it: a stopped pack's job)
        record["job"] = {"trial": job.trial, "rung": job.rung, "rounds_before": latest, "job_id": job_id}
        record["events"] += self._job_events(job.to_epochs - job.from_epochs)
        doc = self.execution(job).input
        doc[names.PACK_FIELD] = {"tune_id": self.tune_id, "pack": record["pack"]}
        return doc

    def _job_ended(self, record: dict[str, Any], ok: bool, error: str | None = None) -> None:
        """Fold the pack's job into the search (its state read from its checkpoints, as a local
        search reads it) and into the pack (its seconds, which share the pack's cost)."""
        running = record["job"]
        record["job"] = None
        trial = int(running["trial"])
        launched = next(x for x in reversed(self.search.launches) if x["trial"] == trial)
        job = Job(**launched)
        spec, unit, _ = self.trial_spec(trial)
        store = self.checkpoints(trial)
        got = outcome(spec, unit, store)
        t = self.search.trials[trial]
        seconds = max(0.0, got["wall_seconds"] - t.wall_seconds)
        rounds = max(0, _latest_round(store) - running["rounds_before"])
        record["jobs"].append({"trial": trial, "rung": job.rung, "seconds": round(seconds, 4), "rounds": rounds})
        self._reprice(record)
        got["cost_usd"] += pack_usd(self.packs, trial)
        if not ok:
            got["status"] = "failed"
        self.search.job_done(job, Outcome(**got, error=None if ok else error))

    def _close_pack(self, record: dict[str, Any]) -> None:
        record["open"] = False
        self._reprice(record)

    def _reprice(self, record: dict[str, Any]) -> None:
        """What the pack pays once, priced again: a wave of invocations per round its jobs ran
        (on a stack every round is one), and shared out by its trials' seconds."""
        record["waves"] = max(1, sum(j["rounds"] for j in record["jobs"]))
        record["transitions"] = PACK_JOB_STATES * len(record["jobs"]) + 3 * record.get("polls", 0)
        price_pack(record, self._priced())
        reshare(record, self.search.trials)

    def conclude(self) -> dict[str, Any]:
        """``tunes/<id>/tune.json`` (the leaderboard, as a local search's) and ``best/`` (the
        best trial's report, model, plot and spec). A trial stopped between rungs keeps its
        checkpoints and gets its report alone (status ``pruned``, scored on the test split), as
        a local pack's does; every report gets its trial's share of the packs."""
        from ebb.cost.meter import packed

        bucket = f"s3://{self.config.bucket}"
        reports = {}
        for t in self.search.trials:
            if t.rung >= 0 and t.status == "paused" and not self.outputs(t.id).exists(REPORT_KEY):
                # Stopped between rungs: its report alone (scored on the test split), as a local pack's.
                with packed():
                    close(self.trial_spec(t.id)[0], "pruned", outputs=False, store=self.checkpoints(t.id))
            try:
                reports[t.id] = json.loads(self.outputs(t.id).get(REPORT_KEY))
            except KeyError:
                reports[t.id] = {}
                continue
            if self.packs and with_pack_share(reports[t.id], pack_usd(self.packs, t.id)):  # as a local pack's
                self.outputs(t.id).put(REPORT_KEY, json.dumps(reports[t.id], indent=2).encode())
        result = tune_result(
            self.search,
            time.time() - self.started_at,
            reports,
            lambda trial: f"{bucket}/{names.job_prefix(trial_job_id(self.tune_id, trial))}",
        )
        pack_totals(result, self.packs, reports)
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


def _latest_round(store: ObjectStore) -> int:
    """How many rounds a trial's checkpoints hold (0 before its first)."""
    from ebb.engine import checkpoint

    done = checkpoint.latest(store)
    return 0 if done is None else done["round"] + 1


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
def submit_tune(deployment, spec: JobSpec, tspec: TuneSpec, progress=print, fleets: int = 1) -> dict:
    """Start the search as an execution of the stack's Tune state machine (its input: the
    search, the base job, a local dataset uploaded first, and ``fleets``: trial packs at once);
    returns its ARN, name, console link."""
    from ebb.deployed import DeploymentError

    machine = deployment.outputs.get(names.TUNE_STATE_MACHINE_OUTPUT)
    if machine is None:
        raise DeploymentError(
            f"stack {deployment.stack} has no {names.TUNE_STATE_MACHINE_OUTPUT} output: deploy it again "
            "(`npx cdk deploy`) to add the Tune state machine"
        )
    if spec.out:
        raise DeploymentError("out: a trial's outputs go under jobs/<tune>-tNNN, the search's under tunes/: drop out")
    search = {"tune": tspec.model_dump(mode="json"), "job": deployment.job_input(spec, progress), "fleets": fleets}
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
