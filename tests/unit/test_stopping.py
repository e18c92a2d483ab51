"""The stop rules, the supervisor's typed state and what a user sees of them."""

from __future__ import annotations

import json
import math

import pytest

from ebb.engine.state import Best, StopState, SupervisorState
from ebb.engine.stopping import improved, settling, steps_to_target, stop_reason, take_val, watch
from ebb.local.progress import WIDTH, progress_line
from ebb.spec import load_spec


def test_better_is_one_rule_lower_by_min_delta():
    assert improved(0.9, None, 1e-4)
    assert improved(0.98, 1.0, 0.01) and not improved(0.995, 1.0, 0.01)
    assert not improved(math.nan, math.inf, 0.0)  # a diverged scoring is never the best


def test_early_stopping_counts_scorings_without_a_better_one():
    spec = load_spec(overrides={"data": "d", "stop.patience_evals": 2})
    stop = StopState()
    for step, value in enumerate([0.9, 0.8, 0.80001, 0.81]):
        take_val(stop, spec, value, step, epoch=float(step))
    assert stop.best == Best(value=0.8, step=1, epoch=1.0, since=2)
    assert (
        stop_reason(stop, spec, loss=0.5, epoch_next=1.0, epoch_limit=100.0, elapsed=1.0, cost_usd=0.0, step=4)
        == "early_stopped"
    )


def test_the_steps_to_the_target_come_from_the_last_three_scorings_on_a_line():
    spec = load_spec(overrides={"data": "d", "workers": 8, "stop.target_val": 0.58})
    state = SupervisorState.initial(spec)
    state.history = [{"step": k} for k in range(70)]
    for k, value in ((19, 0.70), (39, 0.66), (59, 0.64), (64, None)):
        if value is not None:
            state.history[k]["test"] = value  # no validation split: the test split stands in
    # The last three: 0.70, 0.66, 0.64 at 19, 39, 59: slope −0.0015 a step; 0.06 to go from
    # step 59 is 40 steps, 6 of them gone by step 65.
    assert steps_to_target(state, spec, 65) == pytest.approx(0.06 / 0.0015 - 6)
    state.history[69]["test"] = 0.57  # past the target: nothing left
    assert steps_to_target(state, spec, 69) == 0.0
    # No target, too few scorings, or no descent: no estimate.
    assert steps_to_target(state, load_spec(overrides={"data": "d", "workers": 8}), 65) is None
    assert steps_to_target(state, spec, 45) is None
    for k, value in ((19, 0.60), (39, 0.62), (59, 0.64)):
        state.history[k]["test"] = value
    assert steps_to_target(state, spec, 65) is None


def test_a_scoring_while_the_fleet_resettles_after_a_scale_event_is_not_held_against_the_job():
    spec = load_spec(overrides={"data": "d", "workers": 8, "stop.patience_evals": 2})
    state = SupervisorState.initial(spec)
    state.history = [{"step": k} for k in range(40)]
    for k in (9, 19, 29):
        state.history[k]["val"] = 0.8
    state.scale_events = [{"step": 20, "applied_at": 21, "action": "evict", "worker": 7}]
    # The scoring at 29 is the first since the eviction took effect at 21; the one at 39 is not.
    assert [settling(state, k, "val") for k in (19, 29, 39)] == [False, True, False]
    stop = StopState(best=Best(value=0.8, step=9, since=1))
    take_val(stop, spec, 0.81, 29, epoch=None, settling=True)
    assert stop.best.since == 1  # patience unchanged: a bump while re-settling
    take_val(stop, spec, 0.81, 39, epoch=None)
    assert stop.best.since == 2


def test_the_bar_watches_early_stopping_and_a_backstop_once_it_is_further_along():
    spec = load_spec(overrides={"data": "d", "stop.max_epochs": 10})
    stop = StopState(best=Best(value=0.8, step=3, since=1))
    early = watch(stop, spec, scoring_val=True, epoch=2.0, epoch_limit=10, elapsed=1.0, cost_usd=0.0)
    assert (early.rule, early.done, early.total) == ("early_stopping", 1, 5)
    late = watch(stop, spec, scoring_val=True, epoch=9.0, epoch_limit=10, elapsed=1.0, cost_usd=0.0)
    assert (late.rule, late.done, late.total) == ("max_epochs", 9.0, 10)
    plain = watch(
        StopState(),
        load_spec(overrides={"data": "d"}),
        scoring_val=False,
        epoch=3.0,
        epoch_limit=30,
        elapsed=1.0,
        cost_usd=0.0,
    )
    assert plain.rule == "max_epochs"


def test_the_supervisors_state_round_trips_as_json_nan_included():
    state = SupervisorState.initial(load_spec(overrides={"data": "d", "workers": 3}))
    state.history.append({"step": 0, "loss": math.nan})
    state.recent_loss[2] = 0.5
    state.stop.best = Best(value=0.7, step=0)
    raw = json.loads(state.model_dump_json())
    restored = SupervisorState.initial(load_spec(overrides={"data": "d"}))
    restored.load_state_dict(raw)
    assert restored.members == [0, 1, 2] and restored.recent_loss == {2: 0.5} and restored.stop.best.value == 0.7
    assert math.isnan(restored.history[0]["loss"]) and restored.held.step == 0


def test_the_progress_line_fits_80_columns_and_keeps_what_matters():
    record = {
        "step": 123456,
        "epoch": 1234.5,
        "loss": 0.81234,
        "active": 256,
        "cost_usd": 1234.5678,
        "time": 360_000.0,
        "best_val": 0.829,
        "watch": {"rule": "early_stopping", "done": 10, "total": 10},
    }
    line = progress_line(record, loss_name="logloss", clock="fleet", val=0.8312)
    assert len(line) <= WIDTH
    assert "val 0.8312" in line and "best 0.8290" in line and "patience 10/10" in line and "fleet 100:00:00" in line
    short = progress_line(
        {**record, "step": 3, "epoch": 0.3, "active": 4, "cost_usd": 0.01, "time": 83.0},
        loss_name="rmse",
        clock="host",
        val=0.8312,
    )
    assert short.startswith("ep 0.3 val 0.8312 best 0.8290") and short.endswith("4w $0.0100 host 1:23")
