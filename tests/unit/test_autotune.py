"""Scale-in auto-tuner: curve fits, knee detection, the tuner on simulated runs, policies."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ebb.autotune import (
    AutoTunePolicy,
    KneeDetector,
    LocalCurve,
    NoScaling,
    ReferenceCurve,
    ScaleDecision,
    ScaleInTuner,
    SchedulePolicy,
    StepSeen,
    find_knee,
    fit_local,
    fit_reference,
    make_policy,
    pick_eviction,
)

# ---------------------------------------------------------------------------- curves


@pytest.mark.parametrize(
    "theta",
    [(0.05, 0.8, 1.2, 0.5), (0.002, 1.0, 0.5, 0.3), (0.3, 0.5, 2.0, 0.1), (0.01, 1.5, 1.0, 0.6)],
)
def test_fit_reference_recovers_theta(theta):
    steps = np.arange(0, 400)  # includes t = 0, where t^θ1 needs care
    for recency in (0.0, 2.0):  # weighting recent points changes nothing on an exact curve
        fitted = fit_reference(steps, ReferenceCurve(theta)(steps), recency=recency)
        np.testing.assert_allclose(fitted.theta, theta, rtol=0.05)


@pytest.mark.parametrize(
    "theta",
    [(1e-5, 0.01, 1.5, 0.5), (2e-6, 0.004, 1.0, 0.58), (1e-4, 0.0, 2.0, 0.2), (0.0, 0.02, 1.2, 0.8)],
)
def test_fit_local_recovers_theta(theta):
    # ℓ_p is fitted after the knee, far from the origin.
    steps = np.arange(300, 600)
    fitted = fit_local(steps, LocalCurve(theta)(steps))
    np.testing.assert_allclose(fitted.theta, theta, rtol=0.05, atol=1e-9)


def test_noisy_fits_predict_within_1_5_percent():
    # With noise θ is not identifiable to 5%, but the curve is: check its predictions,
    # including 100 steps beyond the data (MLLess Fig. 3c reports < 1.5 %).
    rng = np.random.default_rng(7)
    for theta in [(0.05, 0.8, 1.2, 0.5), (0.002, 1.0, 0.5, 0.3)]:
        true = ReferenceCurve(theta)
        steps = np.arange(0, 300)
        fitted = fit_reference(steps, true(steps) * (1 + rng.normal(0, 0.005, steps.size)))
        ahead = np.arange(0, 400)
        assert np.max(np.abs(fitted(ahead) - true(ahead)) / true(ahead)) < 0.015
    true = LocalCurve((2e-6, 0.004, 1.0, 0.58))
    steps = np.arange(300, 600)
    fitted = fit_local(steps, true(steps) * (1 + rng.normal(0, 0.005, steps.size)))
    ahead = np.arange(300, 700)
    assert np.max(np.abs(fitted(ahead) - true(ahead)) / true(ahead)) < 0.015


def test_curves_are_callable_non_negative_and_serialisable():
    curve = ReferenceCurve((0.05, 0.8, 0.0, 0.5))  # θ2 = 0: singular at t = 0
    assert isinstance(curve(10), float)
    assert curve(np.arange(3)).shape == (3,)
    assert math.isfinite(curve(0))  # the denominator is clipped, not divided by zero
    assert all(v >= 0 for v in fit_reference(np.arange(50), 1 / (0.1 * np.arange(50) + 1) + 0.2).theta)
    local = LocalCurve((1e-5, 0.01, 1.5, 0.5))
    assert LocalCurve.from_dict(json.loads(json.dumps(local.to_dict()))) == local


def test_fit_rejects_unusable_data():
    with pytest.raises(ValueError, match="at least 5"):
        fit_reference([1, 2, 3], [3.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="positive"):
        fit_local(np.arange(10), np.linspace(1.0, -1.0, 10))


# ------------------------------------------------------------------------------ knee

KNEE_TOLERANCE = 0.1

CURVES = {
    "exp tau=50": lambda t: np.exp(-t / 50) + 0.3,
    "exp tau=200": lambda t: 2 * np.exp(-t / 200) + 0.5,
    "1/(at+b)+c": lambda t: 1 / (0.05 * t + 1) + 0.5,
    "1/(a t^0.8+b)+c": lambda t: 1 / (0.02 * t**0.8 + 1) + 0.2,
}


def analytic_bend(curve, tolerance=KNEE_TOLERANCE, from_step=0):
    """First step where |L'(t)| <= tolerance × the steepest |L'| seen since from_step."""
    t = np.arange(0, 5000.0)
    slope = np.abs(np.diff(curve(t)))
    steepest = np.maximum.accumulate(np.where(t[:-1] >= from_step, slope, 0.0))
    flat = (slope <= tolerance * steepest) & (t[:-1] >= from_step)
    return int(np.argmax(flat)) + 1


@pytest.mark.parametrize("name", sorted(CURVES))
def test_knee_found_after_the_bend_and_close_to_it(name):
    curve = CURVES[name]
    losses = curve(np.arange(0, 3000.0))
    knee = find_knee(losses, tolerance=KNEE_TOLERANCE)
    assert knee is not None
    # Never before the bend (relative to the true steepest slope, at t = 0)...
    assert knee >= analytic_bend(curve)
    # ...and within the smoothing lag (2 EWMAs, median, patience; up to ~50 steps on
    # slow curves) of the bend the detector can see: its steepest slope is measured
    # after a 20-step warm-up.
    visible_bend = analytic_bend(curve, from_step=19)
    assert visible_bend <= knee <= visible_bend + 60


@pytest.mark.parametrize("name", sorted(CURVES))
def test_knee_robust_to_noise_and_outliers(name):
    curve = CURVES[name]
    clean = curve(np.arange(0, 3000.0))
    clean_knee = find_knee(clean, tolerance=KNEE_TOLERANCE)
    bend = analytic_bend(curve)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        noisy = clean + rng.normal(0, 0.002, clean.size)
        noisy_knee = find_knee(noisy, tolerance=KNEE_TOLERANCE)
        assert noisy_knee is not None and noisy_knee >= bend
        spiky = clean.copy()
        spikes = rng.random(clean.size) < 0.01
        spikes[0] = True  # even a spike on the very first step
        spiky[spikes] *= 3
        assert abs(find_knee(spiky, tolerance=KNEE_TOLERANCE) - clean_knee) <= 5


def test_no_knee_while_still_steep_or_never_dropping():
    steps = np.arange(0, 100.0)
    assert find_knee(1 / (0.01 * steps + 1)) is None  # still steep at the end
    flat = 0.7 + np.random.default_rng(0).normal(0, 0.001, 500)
    assert find_knee(flat) is None  # nothing to call a knee: the loss never fell
    assert find_knee([]) is None


def plateau_then_descent(t):
    """PMF's shape at MovieLens-10M scale: a quick 10% drop, a plateau to step 120, the real descent."""
    early = 1.0 + 0.11 * np.exp(-t / 10)
    late = 0.45 / (1 + np.exp(-(t - 170) / 25))  # the factors grow out of their small start
    return early - late


def test_an_early_plateau_is_not_the_knee():
    rng = np.random.default_rng(0)
    losses = plateau_then_descent(np.arange(0, 2000.0)) + rng.normal(0, 0.003, 2000)
    # A 1% drop lets the plateau pass for the knee: what the tuner did at ML-10M shape.
    assert find_knee(losses, min_drop=0.01) < 120
    # The default asks for 5%: the knee comes after the real descent has levelled off.
    knee = find_knee(losses)
    assert knee is not None and knee > 200 and losses[knee] < 0.65


def test_knee_detector_state_round_trip():
    losses = CURVES["1/(at+b)+c"](np.arange(0, 400.0))
    expected = find_knee(losses)
    detector = KneeDetector()
    for loss in losses[:60]:
        detector.update(loss)
    restored = KneeDetector()
    restored.load_state_dict(json.loads(json.dumps(detector.state_dict())))
    found = None
    for loss in losses[60:]:
        found = restored.update(loss)
    assert found == expected


# ----------------------------------------------------------------------------- tuner


def simulate(
    tuner: ScaleInTuner,
    *,
    workers=8,
    steps=1500,
    gamma=0.1,
    base_s=0.1,
    comm_s=0.02,
    floor=0.5,
    noise=0.0,
    checkpoint_every=None,
    seed=0,
):
    """Closed-loop run: loss = 1/(0.02·u + 1) + floor, u = Σ (p/P)^γ (progress per step).

    γ near 0: extra workers add little per step; γ = 1: progress linear in workers.
    Step time = base_s + comm_s·p (communication grows with the fleet). Every eviction
    decision takes effect before the next step. Returns (decisions, tuner).
    """
    rng = np.random.default_rng(seed)
    full, p, progress, elapsed = workers, workers, 0.0, 0.0
    decisions = []
    for step in range(steps):
        progress += (p / full) ** gamma
        elapsed += base_s + comm_s * p
        loss = 1 / (0.02 * progress + 1) + floor + rng.normal(0, noise)
        tuner.observe(step, elapsed, loss, p)
        if checkpoint_every and step % checkpoint_every == 0:
            tuner = ScaleInTuner.from_state_dict(json.loads(json.dumps(tuner.state_dict())))
        reason = tuner.decide(elapsed, p)
        if reason is not None:
            decisions.append((step, elapsed, p, reason))
            p -= 1
    return decisions, tuner


@pytest.fixture(scope="module")
def cheap_workers_run():
    """More workers barely help (γ = 0.1) and cost communication time: MLLess's rule alone
    (the throughput guard off, since the minibatches per second do fall with each eviction)."""
    return simulate(ScaleInTuner(min_workers=4, throughput_tolerance=1.0), noise=0.002)


def test_tuner_evicts_after_knee_when_workers_add_little(cheap_workers_run):
    decisions, tuner = cheap_workers_run
    assert tuner.knee_step is not None
    first_step, first_elapsed, _, first_reason = decisions[0]
    # The first eviction is the knee's, never before it, and the knee is past the bend.
    assert first_reason.startswith(f"knee at step {tuner.knee_step}")
    assert first_step >= tuner.knee_step >= analytic_bend(lambda t: 1 / (0.02 * t + 1))
    # Then one more worker per interval while s_Δ < S, down to min_workers and no further.
    assert [p for _, _, p, _ in decisions] == [8, 7, 6, 5]
    gaps = np.diff([elapsed for _, elapsed, _, _ in decisions])
    assert np.all(gaps >= tuner.interval_s)
    for _, _, _, reason in decisions[1:]:
        s_delta = float(reason.split("s_delta=")[1].split()[0])
        assert s_delta < tuner.tolerance


def test_tuner_keeps_workers_when_removal_hurts():
    # Progress linear in workers, no communication saving, low loss floor: after the
    # knee eviction the 7-worker fleet visibly falls behind the reference curve.
    decisions, tuner = simulate(ScaleInTuner(min_workers=2), gamma=1.0, comm_s=0.0, base_s=0.2, floor=0.05)
    assert len(decisions) == 1 and decisions[0][3].startswith("knee at step")
    assert tuner.last_s_delta is not None and tuner.last_s_delta >= tuner.tolerance


def test_tuner_never_evicts_at_or_below_min_workers():
    decisions, tuner = simulate(ScaleInTuner(min_workers=8), steps=400)
    assert decisions == []
    assert tuner.knee_step is not None  # the knee was seen; it just had no one to evict
    assert tuner.decide(1e9, 3) is None


def test_tuner_state_round_trip_keeps_decisions_identical(cheap_workers_run):
    expected, _ = cheap_workers_run
    resumed, _ = simulate(ScaleInTuner(min_workers=4, throughput_tolerance=1.0), noise=0.002, checkpoint_every=97)
    assert resumed == expected


def test_throughput_guard_stops_where_the_fleet_would_lose_minibatches_per_second(cheap_workers_run):
    # The same run with the guard: step time 0.1 + 0.02·p s, so minibatches per second
    # are 8/0.26 = 30.8 at 8 workers, 29.2 at 7 (0.95 of it) and 27.3 at 6 (0.89): the
    # guard lets the knee's eviction stand and refuses the one to 6.
    decisions, tuner = simulate(ScaleInTuner(min_workers=4, throughput_tolerance=0.1), noise=0.002)
    assert [p for _, _, p, _ in decisions] == [8]
    refused = [d for d in tuner.decisions if not d["evict"]]
    assert refused and refused[0]["s_delta"] < tuner.tolerance  # s_Δ alone would have evicted
    assert refused[0]["throughput"] == pytest.approx((6 / 0.22) / (8 / 0.26), abs=0.01)
    assert tuner.step_time[8][1] > 100 and tuner.step_time[8][0] / tuner.step_time[8][1] == pytest.approx(0.26)
    # Its decisions survive a checkpoint like the rest of the tuner's state.
    resumed, _ = simulate(ScaleInTuner(min_workers=4, throughput_tolerance=0.1), noise=0.002, checkpoint_every=97)
    assert resumed == decisions


def test_throughput_guard_evicts_the_workers_a_fleet_has_past_its_throughput_peak():
    # Communication grows with the square of the fleet (every worker reads every peer's
    # updates through one cache node): 24 workers step in 0.02 + 0.0005·p² s, so the
    # fleet moves the most minibatches a second near p = 6 and as many at 12 as at 24.
    # The guard lets the tuner go down while the projected throughput stays within 10%.
    full = 24

    def step_s(p):
        return 0.02 + 0.0005 * p * p

    tuner = ScaleInTuner(min_workers=2, interval_s=2.0, horizon_s=1.0, throughput_tolerance=0.1)
    p, progress, elapsed, sizes = full, 0.0, 0.0, []
    for step in range(1000):  # the fleet settles by step 300
        progress += p / full  # progress follows the minibatches processed
        elapsed += step_s(p)
        tuner.observe(step, elapsed, 1 / (0.02 * progress + 1) + 0.5, p)
        if tuner.decide(elapsed, p) is not None:
            p -= 1
        sizes.append(p)
    throughput = {q: q / step_s(q) for q in range(2, full + 1)}
    assert min(sizes) < 16  # it went well below the initial fleet ...
    assert throughput[min(sizes)] >= 0.9 * throughput[full] - 1e-9  # ... and never below 90% of its throughput
    assert all(d["throughput"] is not None for d in tuner.decisions[1:])


def test_tuner_validates_parameters():
    with pytest.raises(ValueError, match="horizon_s"):
        ScaleInTuner(interval_s=10, horizon_s=20)
    with pytest.raises(ValueError, match="tolerance"):
        ScaleInTuner(tolerance=1.5)
    with pytest.raises(ValueError, match="throughput_tolerance"):
        ScaleInTuner(throughput_tolerance=-0.1)


# -------------------------------------------------------------------------- policies


def test_schedule_policy_scales_at_epoch_boundaries_and_clamps():
    policy = make_policy(
        "schedule",
        schedule=[
            {"epoch": 2, "workers": 8},
            {"epoch": 0, "workers": 4},
            {"epoch": 3.5, "workers": 1},
            (5, 100),  # pairs are accepted too
        ],
        min_workers=3,
        max_workers=10,
    )
    assert isinstance(policy, SchedulePolicy)
    first = policy.decide(0, 0.0, 6, 0.0)
    assert (first.action, first.count) == ("evict", 2)  # epoch-0 entry: 6 -> 4
    assert policy.decide(10, 1.0, 4, 1.9) is None  # mid-epoch: nothing due
    join = policy.decide(20, 2.0, 4, 2.0)
    assert (join.action, join.count) == ("join", 4)  # 4 -> 8 at the epoch-2 boundary
    assert policy.decide(21, 2.1, 4, 2.2) is None  # fires once, even before it is carried out
    assert policy.decide(30, 3.0, 8, 3.6) is None  # 3.5 applies at the boundary of epoch 4
    shrink = policy.decide(40, 4.0, 8, 4.0)
    assert (shrink.action, shrink.count) == ("evict", 5)  # target 1 clamped to min 3
    grow = policy.decide(50, 5.0, 3, 5.01)
    assert (grow.action, grow.count) == ("join", 7)  # target 100 clamped to max 10
    assert policy.decide(60, 6.0, 10, 6.0) is None  # schedule exhausted


def test_schedule_policy_state_round_trip_and_validation():
    schedule = [{"epoch": 1, "workers": 2}, {"epoch": 2, "workers": 6}]
    policy = SchedulePolicy(schedule)
    assert policy.decide(5, 1.0, 4, 1.0).count == 2
    restored = SchedulePolicy(schedule)
    restored.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    assert restored.decide(6, 1.1, 2, 1.5) is None  # the epoch-1 entry is not fired again
    assert restored.decide(9, 2.0, 2, 2.0) == policy.decide(9, 2.0, 2, 2.0)
    with pytest.raises(ValueError, match="epoch"):
        SchedulePolicy([{"workers": 3}])
    with pytest.raises(ValueError, match="at least one"):
        SchedulePolicy([])
    with pytest.raises(ValueError, match="max_workers"):
        SchedulePolicy(schedule, min_workers=4, max_workers=2)


def test_make_policy_builds_each_policy_and_rejects_unknown_names():
    none = make_policy("none", min_workers=2, max_workers=8)
    assert isinstance(none, NoScaling) and none.decide(1, 1.0, 8, 0.5) is None
    assert none.state_dict() == {}
    auto = make_policy("autotune", min_workers=2, interval_s=30, horizon_s=15)
    assert isinstance(auto, AutoTunePolicy) and auto.tuner.interval_s == 30
    with pytest.raises(ValueError, match="unknown scaling policy 'fancy'"):
        make_policy("fancy")


def test_autotune_policy_wraps_the_tuner_decisions():
    policy = AutoTunePolicy(min_workers=4)
    reference = ScaleInTuner(min_workers=4)
    losses = CURVES["1/(at+b)+c"](np.arange(0, 400.0))
    decisions = []
    for step, loss in enumerate(losses):
        elapsed = 0.2 * (step + 1)
        policy.observe(StepSeen(step, elapsed, loss, 8, epoch=step / 100))
        reference.observe(step, elapsed, loss, 8)
        decision = policy.decide(step, elapsed, 8, epoch=step / 100)
        expected = reference.decide(elapsed, 8)
        assert (decision is None) == (expected is None)
        if decision is not None:
            decisions.append(decision)
            assert decision == ScaleDecision("evict", 1, expected)
    assert decisions  # the knee was reached, so at least the knee eviction happened
    assert policy.state_dict() == reference.state_dict()


def test_pick_eviction_takes_the_highest_recent_loss():
    assert pick_eviction({0: 0.61, 1: 0.72, 2: 0.65}) == 1
    assert pick_eviction({3: 0.7, 1: 0.7, 2: 0.5}) == 3  # tie -> highest worker id
    assert pick_eviction({0: 0.6, 5: float("nan"), 2: 9.0}) == 5  # a diverged replica goes first
    with pytest.raises(ValueError):
        pick_eviction({})
