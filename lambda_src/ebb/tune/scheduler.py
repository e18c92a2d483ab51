"""The search itself, whatever runs the trials: which trial trains next and how far
(asynchronous successive halving, ASHA), what Optuna samples, and the $ budget.

A *job* here is one stretch of one trial's training: a new trial from epoch 0 to the first
rung, or a promoted one from its rung to the next (it resumes from its checkpoint). The
runner asks ``next_job()``, trains, and hands the outcome back with ``job_done()``. The
state is plain JSON (``state_dict``), so a search killed at any point carries on where
its last finished job left it.

Epochs are counted at one worker's pace (as ``hyper.lr_decay`` and the scorings are), so
rungs mean the same at any fleet size. A trial's score at a rung is the best validation
scoring it has made so far: the model the job would write.

The ladder is fixed (``min_epochs`` × eta^k up to ``max_epochs``) or, with ``ladder: base``
(``--quick``'s), sized from the base trial's own run: the base trial (trial 0, the job's
own settings) trains first, alone, to its early stopping, as ``ebb train`` would; its
epochs set the rungs (``TuneSpec.base_rungs``), so each model and dataset is judged at its
own scale (a sparse LR run that stops at 8 epochs, a PMF run that stops at 33), with more
rungs when the trials are many (two below the top at 27 trials). The base trial then stands
at the top, holding one of the best 1/eta places of every rung.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ebb.tune.space import TuneSpec, inside

SAMPLER_WARMUP = 3  # tpe: QMC for this many trials (at least eta) before TPE takes over


@dataclass
class Trial:
    id: int
    params: dict[str, Any]
    epochs: float = 0.0  # trained so far (one worker's pace)
    rung: int = -1  # the last rung completed
    scores: dict[int, float] = field(default_factory=dict)  # rung -> best validation by then
    curve: list[list[float]] = field(default_factory=list)  # [epoch, validation] scorings
    cost_usd: float = 0.0
    wall_seconds: float = 0.0
    running: bool = False
    done: bool = False  # nothing more to train: the top rung, early stopping, the budget, a failure
    status: str = "sampled"  # the job's last status (max_epochs, early_stopped, paused, failed, ...)
    error: str | None = None

    @property
    def best(self) -> float:
        return min(self.scores.values(), default=math.inf)


@dataclass(frozen=True)
class Job:
    trial: int
    rung: int  # the rung it trains to
    from_epochs: float
    to_epochs: int
    budget_usd: float | None  # the trial's cost at which the engine stops it (its stop.budget_usd)
    reserved_usd: float = 0.0  # what this job is expected to spend, held back from the others


@dataclass
class Outcome:
    """What a job reports back: the trial's state after it."""

    epochs: float
    best_val: float | None
    cost_usd: float  # the trial's, cumulative
    wall_seconds: float  # the trial's, cumulative
    status: str  # paused (reached the rung) | the engine's stop reason | failed
    curve: list[list[float]] = field(default_factory=list)
    error: str | None = None


class Search:
    """ASHA over ``spec.rungs()`` (or a ladder sized from the base trial) with Optuna sampling
    new trials and a total $ budget."""

    def __init__(self, spec: TuneSpec, state: dict[str, Any] | None = None, start: dict[str, Any] | None = None):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.spec, self.rungs = spec, spec.rungs()
        self.trials: list[Trial] = []
        self.launches: list[dict[str, Any]] = []  # every job started: trial, rung, from and to epochs
        # The base job's values of the searched fields (space.start_point): relative bounds
        # multiply them, and (from_base) the first trial trains those inside the space.
        self.base = dict((state or {}).get("base") or (state or {}).get("first") or start or {})
        self.distributions = spec.distributions(self.base)
        self.first = inside(self.distributions, self.base) if spec.from_base else {}
        # ladder "base" (with a base trial, under ASHA): "waiting" while the base trial trains,
        # alone, to its end (one rung: its job's); then "sized" from its run (``_size``).
        by_base = spec.ladder == "base" and bool(self.first) and spec.scheduler == "asha"
        self.ladder = "waiting" if by_base else "fixed"
        if by_base:
            self.rungs = [spec.max_epochs]
        self.study = optuna.create_study(direction="minimize")
        self._asked: dict[int, Any] = {}  # trial id -> its live Optuna trial (sampled in this process)
        self._running: dict[int, Job] = {}
        self._by_kind: dict[str, Any] | None = None  # the samplers, made once the state is loaded
        if state:
            self._load(state)

    # -- sampling ------------------------------------------------------------------
    def _samplers(self) -> dict[str, Any]:
        """One instance of each sampler for the whole search, so each draws on from where it
        was (a fresh instance per trial would draw the same point again). Seeded with the
        trials so far, so a resumed search draws new points too."""
        import warnings

        from optuna.exceptions import ExperimentalWarning
        from optuna.samplers import QMCSampler, RandomSampler, TPESampler

        # Each sampler's own stream (one seed for all would draw TPE's first random point
        # where QMC's first was), moved on by the trials so far for a resumed search.
        seed = 3 * (self.spec.seed + len(self.trials))
        warmup = max(SAMPLER_WARMUP, self.spec.eta)
        with warnings.catch_warnings():  # both stable in use since Optuna 3; the flag is a formality
            warnings.simplefilter("ignore", ExperimentalWarning)
            return {
                "random": RandomSampler(seed=seed),
                # scramble: a seeded, shifted Sobol sequence (its place is kept in the study);
                # categorical fields are drawn by its independent sampler, by design.
                "qmc": QMCSampler(
                    seed=self.spec.seed,
                    scramble=True,
                    independent_sampler=RandomSampler(seed=seed + 1),
                    warn_independent_sampling=False,
                ),
                # TPE models from the QMC trials on (its default waits for 10 random ones).
                "tpe": TPESampler(seed=seed + 2, multivariate=True, n_startup_trials=warmup),
            }

    def _sampler(self, told: int):
        if self._by_kind is None:
            self._by_kind = self._samplers()
        kind = self.spec.sampler
        if kind == "tpe" and told < max(SAMPLER_WARMUP, self.spec.eta):
            kind = "qmc"
        return self._by_kind[kind]

    def _sample(self) -> dict[str, Any]:
        told = sum(1 for t in self.trials if 0 in t.scores)
        self.study.sampler = self._sampler(told)
        if not self.trials and self.first:  # the fields it leaves out are sampled
            self.study.enqueue_trial(self.first)
        trial = self.study.ask(self.distributions)
        params = dict(trial.params)
        self._asked[len(self.trials)] = trial
        return params

    def _tell(self, t: Trial, value: float | None) -> None:
        import optuna

        state = optuna.trial.TrialState.COMPLETE if value is not None and math.isfinite(value) else None
        live = self._asked.pop(t.id, None)
        if live is not None:
            if state is None:
                self.study.tell(live, state=optuna.trial.TrialState.FAIL)
            else:
                self.study.tell(live, value)
        elif state is not None:  # sampled before a resume: known to the study from its parameters
            self.study.add_trial(
                optuna.trial.create_trial(params=t.params, distributions=self.distributions, value=value)
            )

    # -- the schedule --------------------------------------------------------------
    @property
    def top(self) -> int:
        return len(self.rungs) - 1

    def _size(self, base: Trial, best: float) -> None:
        """The ladder from the base trial's own run (``TuneSpec.base_rungs``), and the base trial's
        score at each rung: its validation by then (from its curve: what another trial is
        compared with there), at the top its best. It is done: it stands at the top."""
        self.rungs, self.ladder = self.spec.base_rungs(base.epochs), "sized"
        for k, r in enumerate(self.rungs[:-1]):
            seen = [v for e, v in base.curve if e <= r + 1e-9]
            base.scores[k] = min(seen) if seen else best
        base.scores[self.top] = best
        base.rung, base.done = self.top, True

    def _promotable(self, closing: bool) -> tuple[Trial, int] | None:
        """ASHA: from the highest rung down, a trial in the best 1/eta of those that reached the
        rung, not yet promoted. ``closing`` (no new trials to come, none running): at least the
        best one of each rung goes on, so the last rung is always reached. The base trial
        (``from_base``) always goes on: it is what the search must beat, and a first rung too
        short to judge it (the defaults are tuned for a whole run) must not drop it. On a ladder
        sized from it, it has trained to its end first and holds one of the best 1/eta places
        of every rung (only eta-1 of eta go on past a rung, as in any successive halving)."""
        for k in range(self.top - 1, -1, -1):
            reached = self._ranked(k)
            keep = len(reached) // self.spec.eta
            if closing:
                keep = max(1, keep)
            going = reached[:keep] + [t for t in reached[keep:] if self._is_base(t)]
            if self.ladder == "sized" and self.trials[0] in reached:
                others = [t for t in reached if t.id != 0]
                going = others[: max(1 if closing else 0, keep - 1)]
            for t in going:
                if t.rung == k and not t.running and not t.done:
                    return t, k + 1
        return None

    def _ranked(self, k: int) -> list[Trial]:
        """The trials that reached rung ``k``, best first: by score, or (``compare_within``) by
        their place in their own group (the same values of those fields), then by score. A
        slower optimizer's trials then hold places by their own ranking, not behind every trial
        of a faster one at the same early epoch."""
        reached = sorted((t for t in self.trials if k in t.scores), key=lambda t: (t.scores[k], t.id))
        fields = self.spec.compare_within
        if not fields:
            return reached
        groups: dict[tuple, list[Trial]] = {}
        for t in reached:
            groups.setdefault(tuple(repr(t.params.get(f)) for f in fields), []).append(t)
        place = {t.id: i / len(g) for g in groups.values() for i, t in enumerate(g)}
        return sorted(reached, key=lambda t: (place[t.id], t.scores[k], t.id))

    def _is_base(self, t: Trial) -> bool:
        return t.id == 0 and bool(self.first) and t.params == {**t.params, **self.first}

    def next_job(self) -> Job | None:
        """The next job to start (None: wait for a running one, or the search is over:
        ``finished()`` says which)."""
        running = any(t.running for t in self.trials)
        more = len(self.trials) < self.spec.trials
        if self.ladder == "waiting" and self.trials:
            return None  # the base trial is training: the rungs are not known yet (its job: rung 0, the top)
        found = self._promotable(closing=not more and not running)
        promotion = [found] if found is not None else []
        new = [(None, 0)] if more else []
        # Without a $ budget, every trial starts before any is promoted: a place at a rung is
        # then weighed against all the first-rung results, not the first few in (promoting as
        # trials came in gave the last rung's places to early trials, and on ml-latest-small
        # cost random search's best trial its place); no slot waits, as a promotion takes a
        # free one once none is left to start. With a budget, a promotion first, so the money
        # reaches the promising trials before it runs out; when it does not fit, a new trial's
        # first rung may.
        options = promotion + new if self.spec.budget_usd is not None else new + promotion
        for t, rung in options:
            from_epochs = t.epochs if t is not None else 0.0
            to_epochs = self.rungs[rung]
            allowance = self._allowance(t, to_epochs - from_epochs)
            if allowance is None or allowance > 0:
                break
        else:
            return None
        per = self._per_epoch(t)
        if t is None:
            t = Trial(id=len(self.trials), params=self._sample())
            self.trials.append(t)
        reserve = per * (to_epochs - from_epochs) if per is not None else (allowance or 0.0)
        budget = None if allowance is None else t.cost_usd + allowance
        job = Job(t.id, rung, from_epochs, to_epochs, budget, reserve)
        self.start(job)
        return job

    def start(self, job: Job) -> None:
        """Mark ``job`` running (``next_job`` does; a resumed search does for its interrupted jobs)."""
        self.trials[job.trial].running = True
        self._running[job.trial] = job
        self.launches.append(asdict(job))

    def job_done(self, job: Job, outcome: Outcome) -> None:
        t = self.trials[job.trial]
        t.running = False
        self._running.pop(job.trial, None)
        t.epochs, t.cost_usd, t.wall_seconds = outcome.epochs, outcome.cost_usd, outcome.wall_seconds
        t.status, t.error = outcome.status, outcome.error
        t.curve = [list(p) for p in outcome.curve]
        first = 0 not in t.scores
        if self.ladder == "waiting" and job.trial == 0:
            if outcome.status == "failed" or outcome.best_val is None:
                t.done = True
                self.rungs, self.ladder = self.spec.rungs(), "fixed"  # nothing to size from: the fixed ladder
                self._tell(t, None)
                return
            self._size(t, outcome.best_val)
            self._tell(t, t.scores[0])
            return
        if outcome.status == "failed" or outcome.best_val is None:
            t.done = True
            if first:
                self._tell(t, None)
            return
        if outcome.status == "paused" or outcome.status == "max_epochs":
            t.rung = job.rung
            t.scores[job.rung] = outcome.best_val
            t.done = job.rung == self.top or outcome.status == "max_epochs"
        elif outcome.status in ("early_stopped", "converged"):
            # Training ended by itself: more epochs would not change its best, so it stands at
            # every rung above (it competes there, and is never trained again).
            for k in range(job.rung, self.top + 1):
                t.scores[k] = outcome.best_val
            t.rung, t.done = self.top, True
        else:  # budget, max_time: cut short of the rung, so not comparable there
            t.done = True
            if first:
                t.scores[job.rung] = outcome.best_val  # (the sampler still learns from it)
        if first and 0 in t.scores:
            self._tell(t, t.scores[0])

    # -- the budget ----------------------------------------------------------------
    @property
    def spent_usd(self) -> float:
        return sum(t.cost_usd for t in self.trials)

    def _per_epoch(self, t: Trial | None) -> float | None:
        """The cost of an epoch: this trial's own so far, else the dearest trial's."""
        if t is not None and t.epochs > 0:
            return t.cost_usd / t.epochs
        seen = [u.cost_usd / u.epochs for u in self.trials if u.epochs > 0]
        return max(seen) if seen else None

    def _reserved(self) -> float:
        """What the running jobs are expected to spend still."""
        return sum(j.reserved_usd for j in self._running.values())

    def _allowance(self, t: Trial | None, epochs: float) -> float | None:
        """What a job of ``epochs`` more epochs may spend (None: no budget), or 0 when it must
        not start. Before any job has finished, the cost of an epoch is unknown: one job runs
        alone and the engine stops it at the budget."""
        budget = self.spec.budget_usd
        if budget is None:
            return None
        free = budget - self.spent_usd - self._reserved()
        per = self._per_epoch(t)
        if per is None:
            return free if not any(u.running for u in self.trials) else 0.0
        return free if per * epochs <= free else 0.0

    # -- results -------------------------------------------------------------------
    def leaderboard(self) -> list[Trial]:
        """Trials, best first: the furthest rung reached, then the score there."""

        def key(t: Trial) -> tuple[int, float, int]:
            if not t.scores:
                return (1, math.inf, t.id)
            k = max(t.scores)
            return (-k, t.scores[k], t.id)

        return sorted(self.trials, key=key)

    def best(self) -> Trial | None:
        board = [t for t in self.leaderboard() if t.scores]
        return board[0] if board else None

    def state_dict(self) -> dict[str, Any]:
        return {
            "trials": [{**asdict(t), "scores": {str(k): v for k, v in t.scores.items()}} for t in self.trials],
            "launches": self.launches,
            "base": self.base,
            "first": self.first,
            "rungs": self.rungs,
            "ladder": self.ladder,
            # The QMC sampler's place in its sequence (a resumed search draws new points, not the same again).
            "sampler_attrs": self.study._storage.get_study_system_attrs(self.study._study_id),
        }

    def _load(self, state: dict[str, Any]) -> None:
        for raw in state["trials"]:
            t = Trial(**{**raw, "scores": {int(k): v for k, v in raw["scores"].items()}})
            self.trials.append(t)
            if 0 in t.scores and math.isfinite(t.scores[0]):
                self._tell(t, t.scores[0])
        self.launches = list(state.get("launches", []))
        if "ladder" in state:  # (a ladder sized from the base trial, or waiting for it)
            self.rungs, self.ladder = list(state["rungs"]), state["ladder"]
        if "first" in state:  # as sampled then (a search saved before "base" was kept)
            self.first = dict(state["first"])
        for key, value in state.get("sampler_attrs", {}).items():
            # (Optuna has no public setter for a study's system attributes since 3.1.)
            self.study._storage.set_study_system_attr(self.study._study_id, key, value)

    def interrupted_jobs(self) -> list[Job]:
        """Jobs that were running when the search stopped, to start again (each resumes from its
        trial's last complete round, so only the unfinished part of a rung is trained again)."""
        jobs = []
        for t in self.trials:
            if t.running:
                last = next(x for x in reversed(self.launches) if x["trial"] == t.id)
                t.running = False
                jobs.append(Job(**last))
        return jobs
