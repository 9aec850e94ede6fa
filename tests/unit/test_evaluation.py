"""What a decision changes in status, and what the policy is told from status alone."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from specdecode import api, constants as C
from specdecode.control import decision as policy
from specdecode.control import evaluation
from specdecode.control import rules
from specdecode.control import state as cs
from specdecode.control import status as st
from specdecode.control.estimates import PolicyObservations
from specdecode.control.settings import PolicySettings
from specdecode.control.step import advance
from specdecode.control.perfmodel import Workload
from specdecode.timestamps import rfc3339

from .test_policy import observe

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


def _spec(mode: str = "Auto") -> api.SpecDecodeServiceSpec:
    return api.parse_spec({"model": {"name": "m"}, "speculation": {"method": "ngram", "numSpeculativeTokens": 3},
                           "autotune": {"mode": mode}})


def _status(spec, k=3, enabled=True) -> api.SpecDecodeServiceStatus:
    return api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
        enabled=enabled, k=k if enabled else None, method="ngram", since=rfc3339(T0 - timedelta(hours=1)),
        live_since=rfc3339(T0 - timedelta(minutes=59)), config_hash="abc", live=True,
        spec_hash=st.declared_speculation_hash(spec)))


def _decision(action=policy.Action.DISABLE, enabled=False, k=None, applied=True, reason="alpha 0.2 < floor 0.35"):
    return policy.Decision(
        action=action, enabled=enabled, k=k, reason=reason, rule="floor", applied=applied,
        metrics_available=True, metrics_reason=C.REASON_METRICS_OK, metrics_message="",
        speculation_effective=False if not enabled else True, effective_reason="AcceptanceBelowFloor",
        effective_message=reason,
    )


def _apply(status, spec, decision, observation, now):
    """One evaluation's write with a given decision: the state from status, advanced by the
    decision, written back."""
    state = cs.from_status(status, spec, now, 1)
    after = advance(state, decision, observation, spec.autotune.min_drafts, now.timestamp())
    observed = PolicyObservations.of(observation, None)
    return evaluation.apply_decision(status, spec, decision, after, observed, 1, now)


def test_applied_disable_changes_speculation_and_says_so():
    spec = _spec()
    status = _status(spec)
    state = cs.from_status(status, spec, T0)
    result = _apply(status, spec, _decision(), None, T0)
    assert result.rerender is True
    assert result.status.speculation.enabled is False and result.status.speculation.k is None
    assert result.status.speculation.since == rfc3339(T0)
    (record,) = result.status.history
    assert (record.action, record.from_k, record.to_k, record.applied) == ("disable", 3, None, True)
    assert result.events[0][1] == C.EVENT_SPECULATION_CHANGED
    effective = st.get_condition(result.status.conditions, C.COND_SPECULATION_EFFECTIVE)
    assert effective.status == "False" and "0.2" in effective.message


def test_recommend_mode_reports_once_and_changes_nothing():
    spec = _spec("Recommend")
    status = _status(spec)
    state = cs.from_status(status, spec, T0)
    first = _apply(status, spec, _decision(applied=False), None, T0)
    assert first.rerender is False
    assert first.status.speculation == status.speculation
    assert first.status.recommendation.action == "disable"
    assert len(first.status.history) == 1 and first.status.history[0].applied is False
    again = _apply(first.status, spec, _decision(applied=False), None, T0 + timedelta(minutes=1))
    assert again.status.to_wire() == first.status.to_wire()  # same advice: no write, no event
    assert again.events == ()


def test_a_hold_writes_nothing_new():
    spec = _spec()
    status = _status(spec)
    state = cs.from_status(status, spec, T0)
    hold = _decision(action=policy.Action.HOLD, enabled=True, k=3, applied=False, reason="K=3 is best within 5%")
    first = _apply(status, spec, hold, None, T0)
    again = _apply(first.status, spec, hold, None, T0 + timedelta(seconds=30))
    assert again.status.to_wire() == first.status.to_wire() and again.events == () and not again.rerender


def test_new_figures_in_the_schedule_reason_alone_are_not_worth_a_write():
    """scheduleReason quotes today's figures ("2.8% per token saved"): a steady service whose
    figures wander writes nothing for them; a reason that says something new is written."""
    spec = _spec()
    stored = _status(spec)

    def saying(reason: str) -> api.SpecDecodeServiceStatus:
        return stored.model_copy(update={"speculation": stored.speculation.model_copy(update={"schedule_reason": reason})})

    before = saying("plain K: 1-64:K2,65+:off: 2.8% per token saved against K=3 (needs 3%), -3.6% e2e")
    wandered = saying("plain K: 1-64:K2,65+:off: 2.6% per token saved against K=3 (needs 3%), -3.9% e2e")
    assert not evaluation.status_write_needed(before, wandered)
    other = saying("plain K: 1-64:K2,65+:off: its restart would load the replicas left serving to 103% of the "
                   "17.4 req/s they carry: waiting for a lower load")
    assert evaluation.status_write_needed(before, other)


def test_history_is_bounded():
    spec = _spec()
    status = _status(spec)
    for i in range(C.MAX_DECISION_HISTORY + 5):
        state = cs.from_status(status, spec, T0 + timedelta(minutes=i))
        decision = _decision(action=policy.Action.SET_K, enabled=True, k=2 + i % 2, reason=f"move {i}")
        status = _apply(status, spec, decision, None, T0 + timedelta(minutes=i)).status
    assert len(status.history) == C.MAX_DECISION_HISTORY
    assert status.history[-1].reason == f"move {C.MAX_DECISION_HISTORY + 4}"


def test_policy_state_comes_from_status():
    spec = _spec()
    status = _status(spec).model_copy(update={
        "failed_configs": [api.FailedConfig(config_hash="x", spec_generation=1, cause="OutOfMemory", k=5, at=rfc3339(T0))],
        "observations": api.Observations(config_hash="abc", alpha=0.71),
    })
    state = cs.from_status(status, spec, T0, generation=1)
    assert (state.enabled, state.k, state.excluded_ks, state.last_alpha) == (True, 3, frozenset(range(1, 9)), 0.71)
    assert cs.from_status(status, spec, T0, generation=2).excluded_ks == frozenset()  # spec changed
    assert state.live_since == (T0 - timedelta(minutes=59)).timestamp()


def test_restart_price_duration_is_measured_from_the_last_rollout():
    spec = _spec()
    assert evaluation.measured_restart_s(_status(spec), spec) == 60.0
    persistent = spec.model_copy(update={"model_cache": api.ModelCache(claim_name="hf-model-cache")})
    assert evaluation.measured_restart_s(api.SpecDecodeServiceStatus(), persistent) == evaluation.DEFAULT_RESTART_S


def test_restart_price_includes_the_download_while_the_cache_is_an_empty_dir():
    """Before any measured change, an emptyDir cache prices each restart with a model download;
    a PVC, or weights at a path on a volume of the user's own, do not."""
    unmeasured = api.SpecDecodeServiceStatus()
    empty_dir = _spec()
    assert empty_dir.downloads_weights_at_start
    assert evaluation.measured_restart_s(unmeasured, empty_dir) == (
        evaluation.DEFAULT_RESTART_S + evaluation.DEFAULT_MODEL_DOWNLOAD_S)
    local = api.parse_spec({"model": {"name": "/models/qwen"}, "speculation": {"method": "ngram"}})
    assert not local.downloads_weights_at_start
    assert evaluation.measured_restart_s(unmeasured, local) == evaluation.DEFAULT_RESTART_S
    settings = PolicySettings.from_spec(empty_dir, restart_s=evaluation.measured_restart_s(unmeasured, empty_dir))
    assert settings.restart_s > PolicySettings.from_spec(local, restart_s=evaluation.DEFAULT_RESTART_S).restart_s


def test_recent_low_acceptance_is_kept_in_status_across_configs_and_while_off():
    """A collapse seen on K=3 is remembered in status.observations.recentLowAlpha, survives a
    config change and an evaluation without acceptance (speculation off), and reaches the
    policy through status alone (an operator restart loses nothing)."""
    spec = _spec()
    status = _status(spec)
    hold = _decision(action=policy.Action.HOLD, enabled=True, k=3, applied=False, reason="hold")
    state = cs.from_status(status, spec, T0)
    seen = []
    for minute, (k, alpha) in enumerate([(3, 0.7), (3, 0.12), (3, 0.7), (0, None)]):
        now = T0 + timedelta(minutes=minute)
        observation = observe(Workload(8, 1000, 200, 0, alpha or 0.5), k, 300)
        status = _apply(status, spec, hold, observation, now).status
        seen.append(status.observations.recent_low_alpha)
    assert seen[0] == 0.7 and seen[1] == 0.12
    assert 0.12 < seen[2] < 0.15  # forgotten over about an hour, not at once
    assert seen[3] == seen[2]  # off: nothing measured, nothing forgotten
    restarted = cs.from_status(status, spec, T0 + timedelta(minutes=5))
    assert restarted.recent_low_alpha == seen[3]


def test_the_days_peak_load_is_kept_in_status_and_survives_a_restart():
    """The highest load of about the last day is in status.observations.recentPeakRequestRate
    (and when it was seen, recentPeakAt): a new peak at once, kept through the calm after it,
    and an operator restarted from status holds the peak its predecessor saw."""
    spec = _spec()
    status = _status(spec)
    hold = _decision(action=policy.Action.HOLD, enabled=True, k=3, applied=False, reason="hold")
    seen = []
    for minute, rate in enumerate([8, 30, 8]):
        observation = observe(Workload(rate, 1000, 200, 0, 0.7), 3, 300)
        status = _apply(status, spec, hold, observation, T0 + timedelta(minutes=minute)).status
        seen.append(status.observations.recent_peak_request_rate)
    assert seen == [pytest.approx(8), pytest.approx(30), pytest.approx(30)]
    assert status.observations.recent_peak_at == rfc3339(T0 + timedelta(minutes=1))
    restarted = cs.from_status(status, spec, T0 + timedelta(minutes=5))
    assert (restarted.recent_peak_rate, restarted.recent_peak_at) == (seen[2], (T0 + timedelta(minutes=1)).timestamp())


def test_a_peak_seen_again_is_written_once_its_hold_would_otherwise_run_from_yesterday():
    """Status holds the peak's time to two hours: a restarted operator keeps a daily peak
    that was seen again today, without a status write every minute of the peak."""
    def stored(at: datetime, rate: float = 30.0) -> api.Observations:
        return api.Observations(config_hash="abc", recent_peak_request_rate=rate, recent_peak_at=rfc3339(at))

    assert not evaluation.observations_moved(stored(T0), stored(T0 + timedelta(minutes=90), 31.0))
    assert evaluation.observations_moved(stored(T0), stored(T0 + timedelta(hours=3)))
    assert evaluation.observations_moved(stored(T0), stored(T0, 40.0))


def test_a_gain_that_repays_a_cached_restart_does_not_repay_one_with_a_download():
    """With maxSurge 0 and an emptyDir cache, the download makes each restart dearer: a change
    that pays with the weights cached is held when every pod must fetch them again."""
    from .test_policy import NOW, auto, both, on

    load = Workload(12, 1000, 300, 0, 0.5)
    cached = evaluation.DEFAULT_RESTART_S
    downloading = evaluation.DEFAULT_RESTART_S + evaluation.DEFAULT_MODEL_DOWNLOAD_S
    taken = rules.decide(auto(max_surge=0, restart_s=cached), on(3), both(load, 3), (), NOW)
    held = rules.decide(auto(max_surge=0, restart_s=downloading), on(3), both(load, 3), (), NOW)
    assert taken.action is policy.Action.SET_K and taken.k == 1
    assert held.action is policy.Action.HOLD and "slower than staying" in held.reason


def _stored_window(alpha, drafts, requests=None, low=None, overhead=None):
    return api.Observations(config_hash="abc", alpha=alpha, recent_low_alpha=alpha if low is None else low,
                            acceptance_rate=alpha * 0.8, drafts=drafts, requests=requests,
                            schedule_overhead_seconds=overhead)


def test_acceptance_moving_within_sampling_noise_is_not_written_but_a_real_drop_is():
    """A short window of a small service: alpha wanders by more than 0.02 with no change in
    the service (no write); a collapse is written at once."""
    from specdecode.control.evaluation import observations_moved

    window = _stored_window
    assert not observations_moved(window(0.80, 2000), window(0.77, 2000))
    assert observations_moved(window(0.80, 2000), window(0.55, 2000))
    # a long window of a busy service measures finely: the fixed delta decides
    assert observations_moved(window(0.80, 2_000_000), window(0.77, 2_000_000))
    # without a sample count, the fixed delta decides too
    assert observations_moved(window(0.80, None), window(0.77, None))


def test_a_window_of_few_requests_is_as_uncertain_as_its_requests_make_it():
    """120 requests of 300 tokens: 36,000 drafted tokens measure alpha to +-0.004 if tokens
    were independent, but each request has an acceptance of its own, so a fall of 0.03 is
    within what two such windows differ by with no change in the service."""
    from specdecode.control.evaluation import observations_moved

    window = _stored_window
    assert observations_moved(window(0.80, 36_000), window(0.77, 36_000))  # tokens alone: a real fall
    assert not observations_moved(window(0.80, 36_000, requests=120), window(0.77, 36_000, requests=120))
    assert observations_moved(window(0.80, 36_000, requests=120), window(0.70, 36_000, requests=120))


def test_a_rise_is_written_only_when_the_stored_figure_would_mislead():
    """A fall is what a restarted operator needs (new lows, what the draft paid); a rise
    changes no decision the stored value drives, so +0.04 costs no write, +0.15 does (a
    reader of `kubectl get sds` would be misled), and a rising recent low never does."""
    from specdecode.control.evaluation import observations_moved

    window = _stored_window
    assert not observations_moved(window(0.76, 2_000_000), window(0.80, 2_000_000))
    assert observations_moved(window(0.80, 2_000_000), window(0.76, 2_000_000))
    assert observations_moved(window(0.60, 2_000_000), window(0.75, 2_000_000))
    assert not observations_moved(window(0.80, 2_000_000, low=0.60), window(0.80, 2_000_000, low=0.70))
    assert observations_moved(window(0.80, 2_000_000, low=0.70), window(0.80, 2_000_000, low=0.60))


def test_a_new_schedule_calibration_is_written():
    """The per-step schedule cost calibrated after a schedule rollout is what a restarted
    operator prices schedules with: its first value and a real change are written."""
    from specdecode.control.evaluation import observations_moved

    window = _stored_window
    assert observations_moved(window(0.8, 2000), window(0.8, 2000, overhead=0.0004))
    assert not observations_moved(window(0.8, 2000, overhead=0.0004), window(0.8, 2000, overhead=0.00041))
    assert observations_moved(window(0.8, 2000, overhead=0.0004), window(0.8, 2000, overhead=0.0008))


def _measured_window(rng, alpha: float, requests: int = 120, tokens_per_request: int = 300) -> api.Observations:
    """One window of a steady service: each request has an acceptance of its own around the
    service's, and its drafted tokens are accepted at that rate."""
    own = np.clip(rng.normal(alpha, evaluation.REQUEST_ACCEPTANCE_SD, requests), 0.0, 1.0)
    drafted = requests * tokens_per_request
    measured = float(rng.binomial(tokens_per_request, own).sum()) / drafted
    return _stored_window(measured, drafted, requests=requests)


def test_a_steady_fleet_writes_almost_no_observations_by_chance():
    """Every evaluation of every service is a chance for sampling noise to look like a fall,
    and a fleet adds them up: 500 services evaluated twice a minute are 1,000 chances a
    minute. 60 steady services evaluated 500 times each (30,000 evaluations, windows of 120
    requests) write at most one status patch by chance; at three standard errors they wrote
    four."""
    from specdecode.control.evaluation import observations_moved

    rng = np.random.default_rng(7)
    writes = evaluations = 0
    for _ in range(60):
        stored = _measured_window(rng, 0.8)
        for _ in range(500):
            new = _measured_window(rng, 0.8)
            evaluations += 1
            if observations_moved(stored, new):
                writes += 1
                stored = new
    assert writes <= 1, f"{writes} chance writes in {evaluations} evaluations"


def test_the_trend_is_the_whole_services_load_over_half_an_hour_or_six_windows():
    """The hedge compares the long window's load with the trend window's: the whole service
    (the running config and a canary or the config before a restart alike), read by one
    cheap query per scope; six long windows when those are longer than five minutes."""
    from dataclasses import replace
    from specdecode.control import metrics

    spec = _spec()
    settings = PolicySettings.from_spec(spec)
    long_scope, guard_scope, trend_scope = evaluation.scopes_for(spec, settings)
    assert (long_scope.window_s, guard_scope.window_s, trend_scope.window_s) == (300, 75, 1800)
    assert trend_scope.load_only and not long_scope.load_only
    assert [q.spec.name for q in metrics.build_query_plan(trend_scope)] == ["e2e_count"]
    longer = api.parse_spec({"model": {"name": "m"}, "speculation": {"method": "ngram"},
                             "autotune": {"window": "10m"}})
    assert PolicySettings.from_spec(longer).trend_window_s == 3600

    window = observe(Workload(12, 1000, 300, 0, 0.7), 3, 300)
    by_scope = {
        long_scope: {replace(window.key, config_hash="abc"): replace(window, key=replace(window.key, config_hash="abc"))},
        trend_scope: {
            replace(window.key, config_hash=h): replace(window, key=replace(window.key, config_hash=h),
                                                        window_s=1800.0, requests=n)
            for h, n in (("abc", 9000.0), ("old", 9000.0))
        },
    }
    read = metrics.MetricsSnapshot(evaluated_at=0.0, observations=by_scope, queries=2)
    observed = evaluation.observations_for(read, spec, window.key.namespace, window.key.service, "abc", settings)
    assert observed.window is not None and observed.trend_rate == 10.0
    unread = evaluation.observations_for(read, spec, "other", "svc", "abc", settings)
    assert unread.trend_rate is None
