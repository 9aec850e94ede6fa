"""The control step and its status conversion: status -> state -> status round trips, one K
rule for the reconcile and the policy, and a recorded sequence of evaluations that decides
the same whether the operator keeps its state in memory or restarts between every two
steps (state rebuilt from the status it wrote)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdecode import api, constants as C, timestamps
from specdecode.control import evaluation
from specdecode.control import state as cs
from specdecode.control.decision import Action, Held, Rule
from specdecode.control.estimates import PolicyObservations
from specdecode.control.memory import HistoryEntry
from specdecode.control.rules import decide
from specdecode.control.settings import PolicySettings
from specdecode.control.step import step
from specdecode.control.perfmodel import OFF, Workload

from .test_policy import NOW, both

SPEC = api.parse_spec({
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "speculation": {"method": "draft_model", "draftModel": "meta-llama/Llama-3.2-1B-Instruct",
                    "numSpeculativeTokens": 3, "minK": 1, "maxK": 6},
    "replicas": 2,
    # Moves apply at once here: canary experiments have their own restart test
    # (tests/unit/test_canary_loop.py).
    "autotune": {"slo": {"p95EndToEnd": "5s", "p95TimePerOutputToken": "20ms"}, "experiments": {"enabled": False}},
    "rollout": {"maxSurge": 1, "maxUnavailable": 0},
})
HASH = "hash"  # the config hash of test_policy.observe's observations
ROLLOUT_S = 180.0


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


# --- status <-> state ------------------------------------------------------------------------

times = st.integers(min_value=1_700_000_000, max_value=1_900_000_000)
alphas = st.one_of(st.none(), st.floats(0.0, 1.0).map(lambda a: round(a, 4)))
ks = st.integers(min_value=1, max_value=6)


@st.composite
def records(draw):
    action = draw(st.sampled_from([Action.SET_K, Action.DISABLE, Action.ENABLE, Action.FALLBACK]))
    return HistoryEntry(
        time=float(draw(times)), action=action,
        from_k=None if action is Action.ENABLE else draw(ks),
        to_k=None if action in (Action.DISABLE, Action.FALLBACK) else draw(ks),
        reason=draw(st.text(max_size=40)), applied=draw(st.booleans()),
        alpha=draw(alphas), step_scale=draw(st.one_of(st.none(), st.floats(0.2, 5.0).map(lambda s: round(s, 4)))),
        rule=draw(st.one_of(st.none(), st.sampled_from(["hedge", "tune", "reprobe", "fast-fallback"]))),
    ).to_status()


@st.composite
def statuses(draw):
    """Statuses as the operator writes them: an effective choice (live or rolling out), the
    last observations, history and advice."""
    enabled = draw(st.booleans())
    since = draw(times)
    live = draw(st.booleans())
    config_hash = draw(st.sampled_from(["h1", "h2"]))
    effective = api.EffectiveSpeculation(
        enabled=enabled, method="draft_model", k=draw(ks) if enabled else None,
        since=timestamps.rfc3339(since), reason=draw(st.text(max_size=30)),
        cause=draw(st.sampled_from(list(cs.Cause))).value, config_hash=config_hash, live=live,
        live_since=timestamps.rfc3339(since + 200) if live else None,
        spec_hash=cs.declared_speculation_hash(SPEC),
    )
    observations = None
    if draw(st.booleans()):
        observed_hash = draw(st.sampled_from(["h1", "h2"]))
        alpha = draw(alphas)
        # The acceptance memory: the window's alpha when it measured one, else the earlier
        # memory (only for the config that runs; another config's window remembers nothing).
        last_alpha = (alpha if alpha is not None else draw(alphas)) if observed_hash == config_hash else None
        observations = api.Observations(
            observed_at=timestamps.rfc3339(since + 400), config_hash=observed_hash,
            alpha=alpha, recent_low_alpha=draw(alphas), last_alpha=last_alpha,
            requests=draw(st.floats(0, 1e4).map(lambda r: round(r, 1))),
        )
    history = [api.DecisionRecord.model_validate(r) for r in
               sorted(draw(st.lists(records(), max_size=6)), key=lambda r: r["time"])]
    return api.SpecDecodeServiceStatus(speculation=effective, observations=observations, history=history,
                                       ready_replicas=draw(st.integers(0, 4)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(statuses())
def test_status_to_state_to_status_is_the_identity(status):
    state = cs.from_status(status, SPEC, _dt(NOW))
    observation = None
    if status.observations is not None:
        observation = {k: v for k, v in status.observations.to_wire().items() if k not in ("observedAt", "recentLowAlpha", "lastAlpha")}
    again = cs.to_status(state, status, SPEC, observation=observation, max_history=C.MAX_DECISION_HISTORY)
    assert again.to_wire() == status.to_wire()
    # and the state it stores is the state it was read from
    assert cs.from_status(again, SPEC, _dt(NOW)) == state


@settings(max_examples=100, deadline=None)
@given(statuses())
def test_the_state_remembers_what_the_policy_needs(status):
    state = cs.from_status(status, SPEC, _dt(NOW))
    effective, observations = status.speculation, status.observations
    assert (state.enabled, state.k, state.cause.value) == (effective.enabled, effective.k, effective.cause)
    assert state.live_since == (timestamps.epoch_seconds(effective.live_since) if effective.live_since else None)
    same_config = (observations is not None and observations.config_hash == effective.config_hash
                   and timestamps.epoch_seconds(observations.observed_at) > timestamps.epoch_seconds(effective.since))
    remembered = (observations.alpha if observations.alpha is not None else observations.last_alpha) if same_config else None
    assert state.last_alpha == remembered
    assert [e.time for e in state.history] == sorted(e.time for e in state.history)


# --- one K rule --------------------------------------------------------------------------------


def test_off_while_disabling_is_forbidden_renders_what_the_policy_enables():
    """allowDisable: false while speculation is off: the reconcile renders, and the policy's
    bounds rule enables at, the same K (the declared K within the bounds, not minK)."""
    spec = api.parse_spec({"model": {"name": "m"},
                           "speculation": {"method": "ngram", "numSpeculativeTokens": 4, "minK": 2, "maxK": 6,
                                           "allowDisable": False}})
    status = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=False, since=timestamps.rfc3339(NOW - 3600), live_since=timestamps.rfc3339(NOW - 3500),
        live=True, spec_hash=cs.declared_speculation_hash(spec)))
    rendered, cause, _ = cs.choose(spec, status)
    settings_ = PolicySettings.from_spec(spec)
    decision = decide(settings_, cs.from_status(status, spec, _dt(NOW)), PolicyObservations.of(None, None), (), NOW)
    assert cause is cs.Cause.BOUNDS and decision.rule is Rule.BOUNDS
    assert rendered.k == decision.k == 4


def test_a_k_outside_new_bounds_moves_to_the_same_k_either_way():
    spec = api.parse_spec({"model": {"name": "m"},
                           "speculation": {"method": "ngram", "numSpeculativeTokens": 3, "minK": 1, "maxK": 4}})
    status = api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=True, k=7, since=timestamps.rfc3339(NOW - 3600), live_since=timestamps.rfc3339(NOW - 3500),
        live=True, spec_hash=cs.declared_speculation_hash(spec)))
    rendered, _, _ = cs.choose(spec, status)
    decision = decide(PolicySettings.from_spec(spec), cs.from_status(status, spec, _dt(NOW)),
                      PolicyObservations.of(None, None), (), NOW)
    assert rendered.k == decision.k == 4


# --- step over a recorded sequence, with and without restarts -----------------------------------

GOOD = Workload(4, 1000, 300, 0, 0.8)
COLLAPSED = Workload(4, 1000, 300, 0, 0.1)
RECORDED = [GOOD] * 12 + [COLLAPSED] * 8 + [GOOD] * 50 + [None] * 3 + [GOOD] * 10
"""One workload per evaluation minute (None: Prometheus unreachable)."""


def _observed(workload: Workload | None, config: int) -> PolicyObservations:
    if workload is None:
        return PolicyObservations.unavailable("Prometheus is unreachable")
    return both(workload, config)


def _live_status() -> api.SpecDecodeServiceStatus:
    return api.SpecDecodeServiceStatus(ready_replicas=2, speculation=api.EffectiveSpeculation(
        enabled=True, method="draft_model", k=3, since=timestamps.rfc3339(NOW - 7200),
        live_since=timestamps.rfc3339(NOW - 7000), live=True, config_hash=HASH, cause="Declared",
        spec_hash=cs.declared_speculation_hash(SPEC)))


def _rendered(status: api.SpecDecodeServiceStatus, live_at: float | None = None) -> api.SpecDecodeServiceStatus:
    """The reconcile's part: the chosen config rendered (right after the change), then live."""
    update = {"config_hash": HASH}
    if live_at is not None:
        update.update(live=True, live_since=timestamps.rfc3339(live_at))
    return status.model_copy(update={"speculation": status.speculation.model_copy(update=update)})


def _run_in_memory() -> list[tuple]:
    """The state kept in memory from step to step (only the reconcile's part from outside)."""
    settings_ = PolicySettings.from_spec(SPEC, restart_s=ROLLOUT_S)
    state = cs.from_status(_live_status(), SPEC, _dt(NOW))
    decisions, live_at = [], None
    for minute, workload in enumerate(RECORDED):
        now = NOW + 60.0 * minute
        if live_at is not None and now >= live_at:
            state, live_at = replace(state, live_since=live_at, config_hash=HASH), None
        decision, state = step(settings_, state, _observed(workload, state.config), now)
        if decision.applied and decision.changes:
            state, live_at = replace(state, config_hash=HASH), now + ROLLOUT_S
        decisions.append((decision.action, decision.k, decision.rule, decision.hold, decision.reason, state))
    return decisions


def _run_with_restarts() -> list[tuple]:
    """An operator restarted before every evaluation: the state is rebuilt from the status
    the previous one wrote (`evaluation.evaluate`: from_status, step, to_status)."""
    settings_ = PolicySettings.from_spec(SPEC, restart_s=ROLLOUT_S)
    status, decisions, live_at = _live_status(), [], None
    for minute, workload in enumerate(RECORDED):
        now = NOW + 60.0 * minute
        if live_at is not None and now >= live_at:
            status, live_at = _rendered(status, live_at), None
        config = cs.from_status(status, SPEC, _dt(now)).config
        result = evaluation.evaluate(status, SPEC, settings_, _observed(workload, config), None, _dt(now))
        status, decision = result.status, result.decision
        restarted = cs.from_status(status, SPEC, _dt(now + 30.0))
        decisions.append((decision.action, decision.k, decision.rule, decision.hold, decision.reason,
                          replace(restarted, config_hash=HASH if result.rerender else restarted.config_hash)))
        if result.rerender:
            status, live_at = _rendered(status), now + ROLLOUT_S
    return decisions


def test_a_restart_between_every_two_steps_changes_no_decision():
    in_memory = _run_in_memory()
    # Same decisions, and after each the state read back from status is the state in memory.
    assert _run_with_restarts() == in_memory
    # The sequence exercises what the state remembers: a fall back on the collapse, holds
    # while metrics are away, and a re-probe once acceptance is back.
    rules = [rule for _, _, rule, *_ in in_memory]
    changes = [(action, k) for action, k, _, hold, *_ in in_memory if hold is None]
    assert (Action.DISABLE, None) in changes and any(a is Action.ENABLE for a, _ in changes)
    assert Rule.REPROBE in rules and Rule.METRICS in rules
    assert {hold for _, _, _, hold, *_ in in_memory} >= {Held.WARMUP, Held.METRICS, Held.SETTLED}


def test_step_is_pure():
    settings_ = PolicySettings.from_spec(SPEC, restart_s=ROLLOUT_S)
    state = cs.from_status(_live_status(), SPEC, _dt(NOW))
    observed = _observed(COLLAPSED, 3)
    first, second = step(settings_, state, observed, NOW), step(settings_, state, observed, NOW)
    assert first == second
    decision, after = first
    assert decision.changes and after.history[-1].action is decision.action
    assert (after.enabled, after.k, after.cause, after.since, after.live_since) == (
        decision.enabled, decision.k, cs.Cause.POLICY, NOW, None)
    assert after.config != OFF or after.last_alpha is None


def test_a_window_without_drafts_keeps_the_memory_that_the_draft_paid_across_a_restart():
    """The first window after a metrics outage (or an idle one) has no acceptance: the
    acceptance last measured on the running config stays, in the state and in status."""
    effective = api.EffectiveSpeculation(enabled=True, method="draft_model", k=3, since=timestamps.rfc3339(NOW - 7200),
                                         live_since=timestamps.rfc3339(NOW - 7100), live=True, config_hash="h1",
                                         spec_hash=cs.declared_speculation_hash(SPEC))
    measured = api.Observations(observed_at=timestamps.rfc3339(NOW - 60), config_hash="h1", alpha=0.8, requests=50.0)
    status = api.SpecDecodeServiceStatus(speculation=effective, observations=measured)
    state = cs.from_status(status, SPEC, _dt(NOW))
    idle_window = {"configHash": "h1", "requests": 0.0}
    written = cs.to_status(state, status, SPEC, observation=idle_window, max_history=C.MAX_DECISION_HISTORY)
    assert written.observations.alpha is None and written.observations.last_alpha == 0.8
    assert cs.from_status(written, SPEC, _dt(NOW)).last_alpha == 0.8


def test_the_collapse_evidence_lasts_while_every_evaluation_shows_it_and_survives_a_restart():
    """status.speculation.belowFloorSince: set by the first evaluation whose guard window is
    below the floor, kept by the next ones that are, dropped by one that is not (a dip) and by
    a change of config."""
    from specdecode.control.step import advance

    settings_ = PolicySettings.from_spec(SPEC, restart_s=ROLLOUT_S)
    state = cs.from_status(_live_status(), SPEC, _dt(NOW))
    fine = decide(settings_, state, both(GOOD, 3), (), NOW)
    assert not fine.changes and not fine.below_floor
    low = replace(fine, below_floor=True)
    first = advance(state, low, None, settings_.min_drafts, NOW)
    second = advance(first, low, None, settings_.min_drafts, NOW + 60)
    assert first.below_floor_since == second.below_floor_since == NOW
    assert advance(second, fine, None, settings_.min_drafts, NOW + 120).below_floor_since is None
    off = replace(low, action=Action.DISABLE, enabled=False, k=None, applied=True)
    assert advance(second, off, None, settings_.min_drafts, NOW + 120).below_floor_since is None

    written = cs.to_status(second, _live_status(), SPEC, max_history=C.MAX_DECISION_HISTORY)
    assert written.speculation.below_floor_since == timestamps.rfc3339(NOW)
    assert cs.from_status(written, SPEC, _dt(NOW + 90)).below_floor_since == NOW
