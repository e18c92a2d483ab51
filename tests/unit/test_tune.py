"""ebb tune's search, without training: the space, the rungs, ASHA's promotions, the $
budget and resuming, driven by a made-up objective (a formula of the settings and the
epochs with a price per epoch) in place of the engine."""

from __future__ import annotations

import math

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from ebb.spec import SpecError
from ebb.tune.scheduler import Job, Outcome, Search
from ebb.tune.space import QUICK, TuneSpec, parse_param, split_job_file, tune_spec

USD_PER_EPOCH = 0.001


def planted(params: dict, epochs: float) -> float:
    """A validation curve: falls with epochs towards a floor that is lowest for rank 20 and
    lr near 0.02 (rank 20 is clearly better than any other rank at any lr)."""
    floor = 1.0 + (0.0 if params["hyper.rank"] == 20 else 0.3) + 0.05 * math.log10(params["hyper.lr"] / 0.02) ** 2
    return floor + 0.5 / (1.0 + epochs)


class FakeTrials:
    """Trains jobs 'instantly': each epoch costs USD_PER_EPOCH, and like the engine's
    stop.budget_usd a job stops before an epoch that would pass its budget."""

    def __init__(self):
        self.trained: dict[int, float] = {}  # trial -> epochs trained, summed over its jobs

    def run(self, search: Search, job: Job) -> Outcome:
        t = search.trials[job.trial]
        assert job.from_epochs == t.epochs, "a promoted trial resumes where it paused"
        epochs, status = job.to_epochs - job.from_epochs, "paused" if job.rung < search.top else "max_epochs"
        if job.budget_usd is not None:
            affordable = math.floor((job.budget_usd - t.cost_usd) / USD_PER_EPOCH + 1e-9)
            if affordable < epochs:
                epochs, status = affordable, "budget"
        self.trained[t.id] = self.trained.get(t.id, 0.0) + epochs
        done = job.from_epochs + epochs
        curve = [[e, planted(t.params, e)] for e in range(1, int(done) + 1)]
        return Outcome(
            epochs=done,
            best_val=min((v for _, v in curve), default=None),
            cost_usd=t.cost_usd + epochs * USD_PER_EPOCH,
            wall_seconds=done,
            status=status,
            curve=curve,
        )


def drive(search: Search, trials: FakeTrials, stop_after: int | None = None) -> int:
    """Run the search job by job (one at a time); stop after ``stop_after`` jobs if given."""
    n = 0
    while (job := search.next_job()) is not None:
        search.job_done(job, trials.run(search, job))
        n += 1
        if stop_after is not None and n == stop_after:
            break
    return n


SPACE = {"hyper.lr": {"log_uniform": [0.002, 0.2]}, "hyper.rank": {"choice": [5, 10, 20, 40]}}


def _spec(**fields) -> TuneSpec:
    return TuneSpec.model_validate({"trials": 12, "eta": 3, "min_epochs": 1, "max_epochs": 9, "space": SPACE, **fields})


def test_rungs_are_min_epochs_times_eta_to_the_k_ending_at_max_epochs():
    assert _spec().rungs() == [1, 3, 9]
    assert _spec(min_epochs=2, max_epochs=10).rungs() == [2, 6, 10]
    assert _spec(scheduler="none").rungs() == [9]


def test_a_space_reaches_any_hyper_or_sync_field_and_refuses_others():
    field, param = parse_param("hyper.lr=log_uniform:0.001,0.1")
    assert field == "hyper.lr" and param.distribution() == FloatDistribution(0.001, 0.1, log=True)
    assert parse_param("hyper.rank=uniform:8,32")[1].distribution() == IntDistribution(8, 32)
    assert parse_param("sync.mode=choice:bsp,isp")[1].distribution() == CategoricalDistribution(["bsp", "isp"])
    with pytest.raises(SpecError, match="not a hyper.. or sync.. field"):
        parse_param("stop.patience_evals=uniform:1,5")
    with pytest.raises(SpecError, match="above 0"):
        parse_param("hyper.l2=log_uniform:0,1")
    with pytest.raises(SpecError, match="hyper.optimizer"):
        parse_param("hyper.optimizer=choice:sgd_momentum,lbfgs")
    with pytest.raises(SpecError, match="write FIELD=KIND"):
        parse_param("hyper.lr=between:1,2")


def test_quick_space_per_model_and_flags_over_the_job_files_section():
    quick = tune_spec(None, "pmf", {}, [], quick=True)
    assert set(quick.space) == {"hyper.lr", "hyper.l2", "hyper.optimizer", "hyper.rank", "hyper.init_std"}
    assert set(tune_spec(None, "sparse_lr", {}, [], quick=True).space) == {"hyper.lr", "hyper.l2", "hyper.lr_decay"}
    section = {"trials": 4, "space": {"hyper.l2": {"uniform": [0.0, 0.2]}}}
    spec = tune_spec(section, "pmf", {"trials": 7, "budget_usd": None}, ["hyper.lr=log_uniform:0.01,0.1"], quick=False)
    assert spec.trials == 7 and set(spec.space) == {"hyper.l2", "hyper.lr"}
    merged = tune_spec(section, "pmf", {}, [], quick=True)  # the file's space adds to --quick's
    assert set(merged.space) == set(QUICK["pmf"]["space"]) | {"hyper.l2"} and merged.trials == 4
    with pytest.raises(SpecError, match="nothing to search"):
        tune_spec(None, "pmf", {}, [], quick=False)
    with pytest.raises(SpecError, match="tune.max_epochs"):
        tune_spec({"max_epochs": 0}, "pmf", {}, [], quick=True)


def test_a_job_files_tune_section_is_split_from_the_job(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: pmf\ndata: d\ntune:\n  trials: 5\n  space:\n    hyper.lr: {log_uniform: [0.01, 0.1]}\n")
    section, rest = split_job_file(str(job))
    assert section["trials"] == 5 and "tune" not in rest and "data: d" in rest
    job.write_text("model: pmf\ndata: d\n")
    assert split_job_file(str(job)) == (None, None)


def test_asha_promotes_the_planted_best_and_trains_only_the_promoted_further():
    search, trials = Search(_spec()), FakeTrials()
    drive(search, trials)
    assert len(search.trials) == 12
    best = search.best()
    assert best is not None and best.params["hyper.rank"] == 20 and best.rung == search.top
    # The best of every rung went on; those that went on were the best 1/eta when they did
    # (ASHA never takes a promotion back, so more than 1/eta of the final field may have).
    for k in range(search.top):
        reached = [t for t in search.trials if k in t.scores]
        went_on = [t for t in reached if k + 1 in t.scores]
        assert min(reached, key=lambda t: t.scores[k]) in went_on
        assert len(went_on) < len(reached)
    top = [t for t in search.trials if search.top in t.scores]
    assert min(top, key=lambda t: t.scores[search.top]) is best
    # Successive halving: far fewer epochs than every trial trained to the end.
    assert sum(trials.trained.values()) < 12 * 9 / 2
    # Every trial's jobs are contiguous: nothing was trained twice.
    for t in search.trials:
        spans = [(x["from_epochs"], x["to_epochs"]) for x in search.launches if x["trial"] == t.id]
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert trials.trained[t.id] == t.epochs


def test_random_search_without_halving_trains_every_trial_to_the_end():
    search, trials = Search(_spec(scheduler="none", sampler="random", trials=5)), FakeTrials()
    drive(search, trials)
    assert [t.epochs for t in search.trials] == [9] * 5


@pytest.mark.parametrize("budget", [0.004, 0.02, 0.05])
def test_the_budget_is_never_passed(budget):
    search, trials = Search(_spec(budget_usd=budget)), FakeTrials()
    drive(search, trials)
    assert search.spent_usd <= budget + 1e-12
    assert search.spent_usd > 0
    if budget < 12 * USD_PER_EPOCH:  # less than one epoch for every trial: the budget, not the trials, ended it
        assert len(search.trials) < 12


class StartCosts(FakeTrials):
    """Each job also pays a start (a supervisor, Step Functions transitions) before its first
    epoch, as on AWS: the engine cannot stop a job before it has paid that."""

    START_USD = 0.004

    def run(self, search: Search, job: Job) -> Outcome:
        t = search.trials[job.trial]
        out = super().run(search, job.__class__(**{**job.__dict__, "budget_usd": None}))
        trained = out.epochs - job.from_epochs
        if job.budget_usd is not None:  # the start first, then the epochs the budget leaves
            left = job.budget_usd - t.cost_usd - self.START_USD
            affordable = max(0, math.floor(left / USD_PER_EPOCH + 1e-9))
            if affordable < trained:
                trained, out.status = affordable, "budget"
                self.trained[t.id] -= out.epochs - job.from_epochs - trained
        out.epochs = job.from_epochs + trained
        out.curve = out.curve[: int(out.epochs)]
        out.best_val = min((v for _, v in out.curve), default=None)
        out.cost_usd = t.cost_usd + self.START_USD + trained * USD_PER_EPOCH
        return out


@pytest.mark.parametrize("budget", [0.03, 0.04, 0.05, 0.06, 0.08])
def test_a_promotion_that_does_not_fit_the_budget_leaves_it_to_new_trials(budget):
    """The base trial is promoted first; when its next rung does not fit what is left, new
    trials' first rungs still may (the search does not end with the budget unspent)."""
    search = Search(_spec(budget_usd=budget), start={"hyper.lr": 0.02, "hyper.rank": 20})
    drive(search, StartCosts())
    assert search.trials[0].rung >= 1 and len(search.trials) > 1
    assert 0 < search.spent_usd <= budget + 1e-12


def test_a_search_resumed_from_its_state_carries_on_without_training_anything_twice():
    spec, trials = _spec(), FakeTrials()
    first = Search(spec)
    drive(first, trials, stop_after=7)
    running = first.next_job()  # started, then the process is killed
    assert running is not None
    state = first.state_dict()
    again = Search(spec, state)
    interrupted = again.interrupted_jobs()
    assert [j.trial for j in interrupted] == [running.trial]
    for job in interrupted:
        again.start(job)
        again.job_done(job, trials.run(again, job))
    drive(again, trials)
    assert len(again.trials) == 12
    for t in again.trials:
        assert trials.trained[t.id] == t.epochs  # each epoch trained once, across the kill
    assert again.best() is not None and again.best().params["hyper.rank"] == 20
    # The study knows the trials sampled before the kill (TPE learns from them).
    assert len(again.study.trials) == len([t for t in again.trials if 0 in t.scores])


def test_failed_and_early_stopped_trials():
    search = Search(_spec(trials=3))
    jobs = [search.next_job() for _ in range(3)]
    assert all(j is not None for j in jobs) and {j.rung for j in jobs} == {0}
    search.job_done(
        jobs[0], Outcome(epochs=1, best_val=None, cost_usd=0.0, wall_seconds=1, status="failed", error="diverged")
    )
    search.job_done(jobs[1], Outcome(epochs=1, best_val=0.9, cost_usd=0.0, wall_seconds=1, status="early_stopped"))
    search.job_done(jobs[2], Outcome(epochs=1, best_val=1.1, cost_usd=0.0, wall_seconds=1, status="paused"))
    failed, stopped, paused = search.trials
    assert failed.done and not failed.scores
    assert stopped.done and stopped.scores == {0: 0.9, 1: 0.9, 2: 0.9}  # it stands at every rung
    assert search.best() is stopped
    # Closing (no trials to come): the best of rung 0 already stands at the top, so the
    # weaker one is not trained further.
    assert search.next_job() is None and not paused.done


@pytest.mark.parametrize("sampler", ["random", "qmc", "tpe"])
def test_every_trial_gets_settings_of_its_own(sampler):
    search = Search(_spec(sampler=sampler, scheduler="none", trials=8))
    jobs = [search.next_job() for _ in range(8)]  # all sampled while none has a score (running at once)
    assert all(j is not None for j in jobs)
    lrs = [t.params["hyper.lr"] for t in search.trials]
    assert len(set(lrs)) == 8


def test_tpe_after_qmc_draws_no_earlier_point_again():
    search, trials = Search(_spec(trials=12)), FakeTrials()
    drive(search, trials)
    lrs = [t.params["hyper.lr"] for t in search.trials]
    assert len(set(lrs)) == len(lrs) == 12


def test_the_first_trial_trains_the_settings_the_search_started_from():
    """from_base: trial 0 is the base job (fields outside the space's ranges, or unset, are
    sampled); the others are sampled, and a resumed search keeps it."""
    search, trials = Search(_spec(), start={"hyper.lr": 0.03, "hyper.rank": 20}), FakeTrials()
    drive(search, trials, stop_after=4)
    assert search.trials[0].params == {"hyper.lr": 0.03, "hyper.rank": 20}
    assert len({t.params["hyper.lr"] for t in search.trials}) == len(search.trials)
    resumed = Search(_spec(), search.state_dict())
    assert resumed.first == {"hyper.lr": 0.03, "hyper.rank": 20}
    partial = Search(_spec(), start={"hyper.rank": 10})
    partial.next_job()
    assert partial.trials[0].params["hyper.rank"] == 10 and 0.002 <= partial.trials[0].params["hyper.lr"] <= 0.2


def test_the_start_point_is_the_base_job_as_it_would_train(small_ratings):
    """PMF's l2 is set by the data when the job leaves it out: the start point carries the
    value the job would train with; a value outside its range is left to the sampler."""
    from ebb.models import auto_hyper
    from ebb.ports.manifest import load_manifest
    from ebb.spec import parse_spec
    from ebb.stores.local import FolderObjectStore
    from ebb.tune.space import start_point

    data, _ = small_ratings
    manifest = load_manifest(FolderObjectStore(data), data)
    base = parse_spec({"model": "pmf", "data": data, "hyper": {"lr": 0.5}}, "job")
    space = {
        "hyper.lr": {"log_uniform": [0.005, 0.08]},
        "hyper.l2": {"log_uniform": [0.01, 0.3]},
        "hyper.optimizer": {"choice": ["sgd_momentum", "adam"]},
        "hyper.rank": {"choice": [10, 20, 40]},
    }
    point = start_point(_spec(space=space), base, manifest)
    auto_l2 = auto_hyper("pmf", manifest)["l2"]
    assert point == {"hyper.lr": 0.5, "hyper.l2": auto_l2, "hyper.optimizer": "adam", "hyper.rank": 20}
    search = Search(_spec(space=space), start=point)
    assert search.first == {"hyper.l2": auto_l2, "hyper.optimizer": "adam", "hyper.rank": 20}  # lr 0.5 is outside
    assert Search(_spec(space=space, from_base=False), start=point).first == {}


def test_relative_bounds_are_multiples_of_the_base_jobs_value(small_ratings):
    """``relative``: the space is centred on the value the base job trains with (PMF's l2
    from the data's shape), and a resumed search keeps the same bounds."""
    from ebb.models import auto_hyper
    from ebb.ports.manifest import load_manifest
    from ebb.spec import parse_spec
    from ebb.stores.local import FolderObjectStore
    from ebb.tune.space import start_point

    field, param = parse_param("hyper.l2=log_uniform:0.5x,2x")
    assert param.relative and param.log_uniform == (0.5, 2)
    assert param.distribution(0.1) == FloatDistribution(0.05, 0.2, log=True)
    assert parse_param("hyper.rank=log_uniform:0.5x,2x")[1].distribution(20) == IntDistribution(10, 40, log=True)
    with pytest.raises(SpecError, match="base job's value above 0"):
        param.distribution(None)
    with pytest.raises(SpecError, match="bounds only"):
        tune_spec({"space": {"hyper.rank": {"choice": [10, 20], "relative": True}}}, "pmf", {}, [], quick=False)

    data, _ = small_ratings
    manifest = load_manifest(FolderObjectStore(data), data)
    base = parse_spec({"model": "pmf", "data": data}, "job")
    spec = _spec(space={**SPACE, "hyper.l2": {"log_uniform": [0.5, 2.0], "relative": True}})
    point = start_point(spec, base, manifest)
    auto_l2 = auto_hyper("pmf", manifest)["l2"]
    search, trials = Search(spec, start=point), FakeTrials()
    assert search.distributions["hyper.l2"] == FloatDistribution(0.5 * auto_l2, 2 * auto_l2, log=True)
    assert search.first == {"hyper.lr": 0.03, "hyper.l2": auto_l2, "hyper.rank": 20}
    drive(search, trials, stop_after=3)
    resumed = Search(spec, search.state_dict())
    assert resumed.distributions == search.distributions and resumed.first == search.first
    assert all(0.5 * auto_l2 <= t.params["hyper.l2"] <= 2 * auto_l2 for t in search.trials)
    # A bound the field cannot take, once resolved, is refused before anything trains.
    negative = _spec(space={"hyper.l2": {"uniform": [-1.0, 2.0], "relative": True}})
    with pytest.raises(SpecError, match="hyper.l2"):
        start_point(negative, base, manifest)
    unset = _spec(space={"hyper.momentum": {"uniform": [0.5, 1.5], "relative": True}})
    with pytest.raises(SpecError, match="tune.space.hyper.momentum"):
        start_point(unset, parse_spec({"model": "sparse_lr", "data": data}, "job"), manifest)


def test_the_base_trial_is_promoted_even_when_it_starts_slowly():
    """The defaults are tuned for a whole run: at the first rung the base trial may trail
    settings that start fast and end worse. It goes on anyway (and here wins)."""

    class SlowStarter(FakeTrials):
        def run(self, search, job):
            out = super().run(search, job)
            if job.trial == 0:  # the best floor of all, but the worst score at 1 epoch
                out.curve = [[e, 0.9 + 2.0 / e**2] for e, _ in out.curve]
                out.best_val = min(v for _, v in out.curve)
            return out

    start = {"hyper.lr": 0.02, "hyper.rank": 20}
    search, trials = Search(_spec(), start=start), SlowStarter()
    drive(search, trials)
    base = search.trials[0]
    assert base.params == start and base.scores[0] == max(t.scores[0] for t in search.trials)
    assert base.rung == search.top and search.best() is base
    # Without from_base the same slow starter is dropped at the first rung.
    plain, trials = Search(_spec(from_base=False), start=start), SlowStarter()
    drive(plain, trials)
    assert plain.trials[0].rung == 0 and plain.best() is not plain.trials[0]


@pytest.mark.parametrize("model", ["pmf", "sparse_lr"])
def test_quick_is_centred_on_the_base_job_which_is_its_first_trial(model, small_ratings, small_logistic):
    """--quick's space holds the model's defaults (PMF's l2 from the data's shape), so its
    first trial trains exactly what ``ebb train`` would; lr and l2 span multiples of them."""
    from ebb.models import resolve_hyper
    from ebb.ports.manifest import load_manifest
    from ebb.spec import parse_spec
    from ebb.stores.local import FolderObjectStore
    from ebb.tune.space import start_point

    data = (small_ratings if model == "pmf" else small_logistic)[0]
    manifest = load_manifest(FolderObjectStore(data), data)
    base = parse_spec({"model": model, "data": data}, "job")
    spec = tune_spec(None, model, {}, [], quick=True)
    search = Search(spec, start=start_point(spec, base, manifest))
    hyper = resolve_hyper(model, manifest, base.hyper)
    assert search.first == {f: getattr(hyper, f.split(".")[1]) for f in spec.space}  # every field: the default
    lr, l2 = search.distributions["hyper.lr"], search.distributions["hyper.l2"]
    assert (lr.low, lr.high) == pytest.approx((0.25 * hyper.lr, 1.5 * hyper.lr))
    assert l2.high == pytest.approx((1.25 if model == "pmf" else 2.0) * hyper.l2)
    # The rungs wait for the base trial's own run (ladder "base"), to early stopping at most 100
    # epochs; sparse LR's validation ranks trials earlier; PMF's rungs rank each optimizer apart.
    share, within = (0.3, ["hyper.optimizer"]) if model == "pmf" else (0.2, [])
    assert (spec.ladder, spec.base_share, spec.max_epochs, spec.compare_within) == ("base", share, 100, within)
    assert search.rungs == [100]


class EarlyStopping(FakeTrials):
    """Every trial's training ends by itself (early stopping) after ``STOP`` epochs."""

    STOP = 10

    def run(self, search, job):
        t = search.trials[job.trial]
        capped = Job(job.trial, job.rung, job.from_epochs, min(job.to_epochs, self.STOP), job.budget_usd)
        out = super().run(search, capped)
        if capped.to_epochs < job.to_epochs:
            out.status = "early_stopped"
        assert t.epochs == job.from_epochs
        return out


def test_a_ladder_sized_from_the_base_trials_own_run():
    """ladder "base": the base trial trains first, alone, to its end (10 epochs here); the
    rungs are then base_share of that and the backstop; the base trial stands at the top
    (its score at the first rung read off its curve) and holds one of the 1/eta places, so
    only eta-1 of every eta others that reach the first rung stop there."""
    spec = _spec(trials=9, ladder="base", base_share=0.4, min_epochs=1, max_epochs=100)
    start = {"hyper.lr": 0.02, "hyper.rank": 20}
    search, trials = Search(spec, start=start), EarlyStopping()
    first = search.next_job()
    assert first is not None and (first.trial, first.to_epochs) == (0, 100) and search.next_job() is None
    search.job_done(first, trials.run(search, first))
    base = search.trials[0]
    assert search.rungs == [4, 100] and base.done and base.rung == search.top
    assert base.scores == {0: pytest.approx(planted(start, 4)), 1: pytest.approx(planted(start, 10))}
    drive(search, trials)
    assert len(search.trials) == 9 and search.best().params["hyper.rank"] == 20
    went_on = [t for t in search.trials[1:] if 1 in t.scores]
    assert 1 <= len(went_on) <= 9 // 3 - 1  # the base trial held the third place
    assert sum(trials.trained.values()) == 10 + 8 * 4 + sum(10 - 4 for _ in went_on)
    # The sized ladder is part of the state: a resumed search keeps it.
    again = Search(spec, search.state_dict())
    assert again.rungs == [4, 100] and again.ladder == "sized"
    # Without a base trial (from_base off) the ladder is the fixed one.
    assert Search(spec.model_copy(update={"from_base": False}), start=start).rungs == spec.rungs()


def test_a_sized_ladder_has_more_rungs_when_the_trials_are_many():
    """With eta^3 trials (27 at eta 3) successive halving can thin them once more: a rung at
    base_share of the base trial's epochs and one 1/eta below it; eta^4 (81): three. Up to
    eta^2 (9, --quick) one rung, as before. Driven to the end, 26 others train to the first
    rung, about a third of them on to the second, about a third of those to the end."""
    spec = _spec(trials=27, eta=3, ladder="base", base_share=0.6, min_epochs=1, max_epochs=100)
    assert [spec.model_copy(update={"trials": n}).base_rung_count() for n in (3, 9, 26, 27, 81)] == [1, 1, 1, 2, 3]
    assert spec.base_rungs(15) == [3, 9, 100] and spec.model_copy(update={"trials": 9}).base_rungs(15) == [9, 100]
    search, trials = Search(spec, start={"hyper.lr": 0.02, "hyper.rank": 20}), EarlyStopping()
    drive(search, trials)
    assert search.rungs == [2, 6, 100] and len(search.trials) == 27  # the base trial stopped at 10 epochs
    second = [t for t in search.trials[1:] if 1 in t.scores and t.epochs > 2]
    top = [t for t in search.trials[1:] if t.epochs > 6]
    # (asynchronous: a trial goes on when it is in the best third of those in so far, so a few more)
    assert 26 // 3 - 1 <= len(second) <= 26 // 2 and 1 <= len(top) <= len(second) // 2
    assert sum(trials.trained.values()) == 10 + 26 * 2 + 4 * len(second) + 4 * len(top)


def test_compare_within_ranks_a_slower_optimizers_trials_among_themselves():
    """Short-horizon bias: an optimizer that converges more slowly per epoch to a lower floor
    looks worst at an early rung and plain ASHA prunes it; ranked within its own group it
    holds places of its own, and its best trial wins. The field must be a choice field."""

    def curve(params: dict, epochs: float) -> float:
        slow = params["hyper.optimizer"] == "sgd_momentum"
        floor = (0.9 if slow else 1.0) + 0.05 * math.log10(params["hyper.lr"] / 0.02) ** 2
        return floor + (1.0 if slow else 0.5) / (1.0 + epochs)  # slower at epochs 1 and 3, ahead at 9

    space = {"hyper.lr": {"log_uniform": [0.002, 0.2]}, "hyper.optimizer": {"choice": ["adam", "sgd_momentum"]}}

    def searched(**fields) -> Search:
        spec = TuneSpec.model_validate({"trials": 18, "min_epochs": 1, "max_epochs": 9, "space": space, **fields})
        search = Search(spec)
        while (job := search.next_job()) is not None:
            t = search.trials[job.trial]
            points = [[e, curve(t.params, e)] for e in range(1, job.to_epochs + 1)]
            status = "paused" if job.rung < search.top else "max_epochs"
            search.job_done(job, Outcome(job.to_epochs, points[-1][1], 0.0, 0.0, status, points))
        return search

    plain, grouped = searched(), searched(compare_within=["hyper.optimizer"])
    assert any(t.params["hyper.optimizer"] == "sgd_momentum" for t in plain.trials)  # the draws hold both
    assert plain.best().params["hyper.optimizer"] == "adam"
    assert grouped.best().params["hyper.optimizer"] == "sgd_momentum"
    # Still successive halving: each group's best third go on, not every trial.
    assert sum(1 in t.scores for t in plain.trials) <= sum(1 in t.scores for t in grouped.trials) <= 18 // 2
    with pytest.raises(ValueError, match="compare_within: hyper.lr is not a choice field"):
        TuneSpec.model_validate({"space": space, "compare_within": ["hyper.lr"]})


def test_every_trial_starts_before_any_is_promoted_unless_a_budget_binds():
    """Without a budget a place at a rung is weighed against every first-rung result (the
    first jobs are each trial's first rung); with one, promotions go first, so the money
    reaches the promising trials before new ones spend it."""
    search = Search(_spec())
    drive(search, FakeTrials())
    first = [x["rung"] for x in search.launches[:12]]
    assert first == [0] * 12 and any(x["rung"] > 0 for x in search.launches[12:])
    budgeted = Search(_spec(budget_usd=1.0))
    drive(budgeted, FakeTrials())
    starts = [i for i, x in enumerate(budgeted.launches) if x["rung"] == 0]
    assert any(x["rung"] > 0 for x in budgeted.launches[: starts[-1]])  # a promotion before the last start
