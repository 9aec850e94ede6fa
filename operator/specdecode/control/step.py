"""The control loop's transition: ``step(settings, state, observed, now) -> (decision, state)``.

Pure. The shell converts status to `ControlState` (`state.from_status`: the choice, the
memory and the canary experiments), calls `step`, and writes the new state back
(`state.to_status`, through `evaluation.apply_decision`); the benchmark does the same, so
the headline figures run the production glue.
"""

from __future__ import annotations

import math
from dataclasses import replace

from specdecode import constants
from specdecode.control.canary import run as run_experiments, serving_settings
from specdecode.control import disruption, schedules
from specdecode.control.decision import Decision
from specdecode.control.estimates import PolicyObservations
from specdecode.control.memory import history_entry, recent_low_alpha, recent_peak, stored
from specdecode.control.rules import decide
from specdecode.control.settings import PolicySettings
from specdecode.control.state import Cause, ControlState
from specdecode.control.metrics import Observation


def step(
    settings: PolicySettings, state: ControlState, observed: PolicyObservations, now: float,
    canary: Observation | None = None,
) -> tuple[Decision, ControlState]:
    """The decision on ``observed`` and the state after it (`advance`): the rules decide,
    per-batch-size K schedules are considered (`schedules.consider`), then canary experiments
    have their say (`canary.run`: a predicted move may start an experiment instead; a running
    one is measured on ``canary``, the canary's observation, against ``observed``, and may be
    promoted, aborted or cancelled). A schedule adopted or replaced is such a predicted move:
    it runs on the canary first, and a promotion puts it in effect. Last, `disruption.gate`
    turns a rollout the replicas left serving could not carry into a recommendation
    (spec.autotune.allowOutages false)."""
    decision = decide(serving_settings(settings, state), state, observed, state.history, now)
    decision, update = schedules.consider(settings, state, observed, decision, now)
    decision, measured = run_experiments(settings, state, decision, observed, canary, now)
    decision = disruption.gate(settings, observed, decision, state.config)
    window = observed.window if observed.available else None
    after = advance(measured, decision, window, settings.min_drafts, now,
                    settings.tuning.past_capacity_margin if settings.tuning.planner else None)
    return decision, schedules.advance(after, state, decision, update)


def _peak_fields(state: ControlState, window: Observation, now: float) -> dict:
    """The recent peak load after this evaluation's long window (`memory.recent_peak`)."""
    previous = None
    if state.recent_peak_rate is not None:
        previous = (state.recent_peak_rate, state.recent_peak_at if state.recent_peak_at is not None else now)
    peak = recent_peak(previous, state.observed_at, window, now)
    if peak is None:
        return {}
    return {"recent_peak_rate": stored(peak[0]), "recent_peak_at": float(math.floor(peak[1]))}


def advance(
    state: ControlState, decision: Decision, window: Observation | None, min_drafts: float, now: float,
    history_margin: float | None = None,
) -> ControlState:
    """The state after ``decision``: the acceptance memory updated from the long window
    (``window``; kept through outages), the load history in planner mode (what arrives:
    `Observation.restart_load` with ``history_margin``; None: not kept), the decision in history (a change, or new advice in
    Recommend mode), and the new choice when the operator acts on it."""
    new = state
    if window is not None:
        spec = window.speculation
        new = replace(
            new,
            load_history=(state.load_history if history_margin is None
                          else state.load_history.record(window.restart_load(history_margin), now)),
            recent_low_alpha=stored(recent_low_alpha(
                state.recent_low_alpha, state.observed_at, window, min_drafts, now
            )),
            **_peak_fields(state, window, now),
            observed_at=now,
            # A window without drafts (idle, or the first after an outage) measures nothing:
            # the acceptance last measured on this config stays the memory that the draft paid.
            last_alpha=stored(spec.alpha) if spec is not None and spec.alpha is not None else state.last_alpha,
        )
    # The collapse guard's evidence: kept while every evaluation shows it, dropped by one that
    # does not (a dip ends it) and by a change of config below.
    since = (state.below_floor_since if state.below_floor_since is not None else now) if decision.below_floor else None
    new = replace(new, below_floor_since=since)
    advice = (decision.action, decision.enabled, decision.k if decision.enabled else None,
              decision.schedule.label if decision.enabled and decision.schedule is not None else None)
    entry = history_entry(decision, now, state)
    if entry is not None and (decision.applied or advice != state.advice):
        new = replace(new, history=(new.history + (entry,))[-constants.MAX_DECISION_HISTORY:])
    if decision.applied and decision.changes:
        new = replace(
            new,
            enabled=decision.enabled,
            k=decision.k if decision.enabled else None,
            since=now,
            live_since=None,
            cause=Cause.POLICY,
            config_hash=None,
            last_alpha=None,
            below_floor_since=None,
        )
    return replace(new, advice=advice)
