"""Pure glue between the policy and the status: what the policy is told, and what its
decision changes in status.

Everything the policy remembers comes from status (effective speculation, history, failed
configs) and the live Deployment, so a restarted operator decides exactly as the old one
would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from . import api
from . import constants as C
from . import fallback, policy
from .control import metrics
from . import status as st
from . import timestamps

DEFAULT_RESTART_S = 180.0
# A model download on a pod start with an empty cache: a 7-8B model (about 16 GB in bf16) at
# about 60 MB/s from the hub. Used until a measured change replaces the whole estimate.
DEFAULT_MODEL_DOWNLOAD_S = 270.0


@dataclass(frozen=True)
class EvaluationResult:
    """A decision turned into a new status and the Events to post about it."""

    status: api.SpecDecodeServiceStatus
    decision: policy.Decision
    events: tuple[tuple[str, str, str], ...]  # (type, reason, message)
    rerender: bool  # the effective speculation changed: the Deployment must be re-rendered


def _epoch(text: Optional[str]) -> Optional[float]:
    return timestamps.epoch_seconds(text) if text else None


def policy_state(status: api.SpecDecodeServiceStatus, spec: api.SpecDecodeServiceSpec, now: datetime,
                 generation: Optional[int] = None) -> policy.PolicyState:
    """The policy's view of what runs, from status alone."""
    effective = status.speculation
    # While a speculative config that could not start is remembered, no K is tried: the
    # known causes (vocabulary, memory, method) fail for every K alike.
    remembered = fallback.active_failures(status, spec, generation, now)
    s = spec.speculation
    excluded = frozenset(range(s.min_k, s.max_k + 1)) if remembered and s.allow_disable else frozenset()
    if effective is None:
        k = spec.speculation.num_speculative_tokens
        return policy.PolicyState(enabled=True, k=k, since=now.timestamp(), live_since=None,
                                  ready_replicas=status.ready_replicas or 0, excluded_ks=excluded)
    # The previous evaluation's acceptance, if it was measured on the config that runs now:
    # kept through an outage, it remembers that the draft paid.
    earlier = status.observations
    last_alpha = earlier.alpha if earlier and earlier.config_hash == effective.config_hash else None
    return policy.PolicyState(
        enabled=effective.enabled,
        k=effective.k if effective.enabled else None,
        since=_epoch(effective.since) or now.timestamp(),
        live_since=_epoch(effective.live_since),
        ready_replicas=status.ready_replicas or 0,
        excluded_ks=excluded,
        last_alpha=last_alpha,
        recent_low_alpha=earlier.recent_low_alpha if earlier else None,
    )


def measured_restart_s(status: api.SpecDecodeServiceStatus, spec: api.SpecDecodeServiceSpec) -> float:
    """How long the last change took to go live (the restart price's duration). Until the
    service has been through one: the default, plus a model download when every pod start
    downloads the weights again (an emptyDir cache). A measured change includes that download
    already: the pods it restarted downloaded too."""
    effective = status.speculation
    if effective and effective.since and effective.live_since:
        took = _epoch(effective.live_since) - _epoch(effective.since)
        if took > 0:
            return took
    return DEFAULT_RESTART_S + (DEFAULT_MODEL_DOWNLOAD_S if spec.downloads_weights_at_start else 0.0)


def observations_for(
    read: metrics.ReadResult,
    spec: api.SpecDecodeServiceSpec,
    namespace: str,
    name: str,
    config_hash: Optional[str],
    settings: policy.PolicySettings,
) -> tuple[policy.PolicyObservations, Optional[metrics.Observation]]:
    """The current config's observations over the long and the guard window."""
    if isinstance(read, metrics.MetricsUnavailable):
        return policy.PolicyObservations.unavailable(read.message, read.reason), None
    long_scope, guard_scope = scopes_for(spec, settings)
    window = read.for_service(long_scope, namespace, name).get(config_hash or "")
    guard = read.for_service(guard_scope, namespace, name).get(config_hash or "")
    return policy.PolicyObservations.of(window, guard), window


def scopes_for(spec: api.SpecDecodeServiceSpec, settings: policy.PolicySettings) -> tuple[metrics.QueryScope, metrics.QueryScope]:
    selector = spec.metrics.selector
    return metrics.QueryScope.of(settings.window_s, selector), metrics.QueryScope.of(settings.guard_window_s, selector)


def apply_decision(
    status: api.SpecDecodeServiceStatus,
    spec: api.SpecDecodeServiceSpec,
    decision: policy.Decision,
    state: policy.PolicyState,
    observation: Optional[metrics.Observation],
    generation: Optional[int],
    now: datetime,
) -> EvaluationResult:
    """The status after a decision: observations, recommendation, history, conditions and,
    when the operator acts, the new effective speculation."""
    epoch = now.timestamp()
    conds = st.set_condition(
        status.conditions, C.COND_METRICS_AVAILABLE, decision.metrics_available,
        decision.metrics_reason, decision.metrics_message, now, generation,
    )
    if decision.speculation_effective is not None:
        conds = st.set_condition(
            conds, C.COND_SPECULATION_EFFECTIVE, decision.speculation_effective,
            decision.effective_reason, decision.effective_message, now, generation,
        )

    observations = status.observations
    if observation is not None:
        low = policy.recent_low_alpha(
            observations.recent_low_alpha if observations else None,
            _epoch(observations.observed_at) if observations else None,
            observation,
            spec.autotune.min_drafts,
            epoch,
        )
        observations = api.Observations.model_validate(
            {**observation.to_status(), "observedAt": timestamps.rfc3339(now),
             "recentLowAlpha": None if low is None else round(low, 4)}
        )

    recommendation = api.Recommendation.model_validate(decision.recommendation_status(epoch))
    if status.recommendation is not None and _same_advice(status.recommendation, recommendation):
        # Unchanged advice keeps the time it was first given (fresh reason and numbers ride
        # along whenever something else makes the status worth a write).
        recommendation = recommendation.model_copy(update={"at": status.recommendation.at})

    history = list(status.history)
    events: list[tuple[str, str, str]] = []
    effective = status.speculation
    rerender = False
    entry = decision.history_entry(epoch, state)
    new_advice = status.recommendation is None or not _same_advice(status.recommendation, recommendation)
    if entry is not None and (decision.applied or new_advice):
        history.append(api.DecisionRecord.model_validate(entry.to_status()))
        history = history[-C.MAX_DECISION_HISTORY:]
    if decision.applied and decision.changes:
        rerender = True
        effective = api.EffectiveSpeculation(
            enabled=decision.enabled,
            method=spec.speculation.method.value,
            k=decision.k if decision.enabled else None,
            since=timestamps.rfc3339(now),
            reason=decision.reason[:1024],
            live=False,
            spec_hash=st.declared_speculation_hash(spec),
        )
        kind = "Warning" if decision.action is policy.Action.DISABLE else "Normal"
        events.append((kind, C.EVENT_SPECULATION_CHANGED, f"{decision.action.value}: {decision.reason}"))
    elif decision.changes and new_advice:
        events.append(("Normal", C.EVENT_RECOMMENDATION, f"recommend {decision.action.value}: {decision.reason}"))

    new_status = status.model_copy(
        update={
            "conditions": conds,
            "observations": observations,
            "recommendation": recommendation,
            "history": history,
            "speculation": effective,
        }
    )
    return EvaluationResult(new_status, decision, tuple(events), rerender)


def _same_advice(a: api.Recommendation, b: api.Recommendation) -> bool:
    """The same advice (what to run), whatever numbers its reason quotes today."""
    return (a.action, a.enabled, a.k) == (b.action, b.enabled, b.k)


# How far a new measurement must move from the stored one before it is worth an API write:
# below these the stored numbers still tell a user (and a restarted operator's policy) the same.
ALPHA_WRITE_DELTA = 0.02
ACCEPTANCE_RATE_WRITE_DELTA = 0.05


def status_write_needed(stored: api.SpecDecodeServiceStatus, new: api.SpecDecodeServiceStatus,
                        rule_changed: bool = False) -> bool:
    """Whether an evaluation's new status says something the stored one does not.

    Written: any change of effective speculation, history, advice (action, K), a condition's
    status or reason, a new config's first observations, and acceptance or latency that moved
    materially (the policy's memory after a restart: `policy_state` reads observations.alpha
    and recentLowAlpha). Not written: evaluation times, numbers in condition messages and in
    the reason of unchanged advice, latency percentiles, measurement noise. A steady service costs no API writes.
    """
    if _material(stored, rule_changed) != _material(new, rule_changed):
        return True
    return observations_moved(stored.observations, new.observations)


def _material(status: api.SpecDecodeServiceStatus, rule_changed: bool) -> dict:
    wire = status.to_wire()
    wire.pop("observations", None)
    wire["conditions"] = [
        (c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"))
        for c in wire.get("conditions") or []
    ]
    advice = wire.get("recommendation")
    if advice is not None and not rule_changed:
        wire["recommendation"] = {k: v for k, v in advice.items() if k not in ("reason", "predictedSpeedup")}
    return wire


def observations_moved(stored: Optional[api.Observations], new: Optional[api.Observations]) -> bool:
    """A new measurement worth storing: the first of a config, or one that moved materially."""
    if new is None or stored is new:
        return False
    if stored is None or stored.config_hash != new.config_hash or stored.metric_names != new.metric_names:
        return True
    for field_name, delta in (("alpha", ALPHA_WRITE_DELTA), ("recent_low_alpha", ALPHA_WRITE_DELTA),
                              ("acceptance_rate", ACCEPTANCE_RATE_WRITE_DELTA)):
        a, b = getattr(stored, field_name), getattr(new, field_name)
        if (a is None) != (b is None) or (a is not None and abs(a - b) >= delta):
            return True
    # Latency is not among them: P95 from histogram buckets jumps by a bucket from one window
    # to the next with no change in the service, and no decision reads it back from status
    # (an SLO breach shows as a decision and in SpeculationEffective).
    return False
