"""Pure glue between the control step and the status: what the policy is told, and what an
evaluation changes in status.

Everything the control loop remembers comes from status (`state.from_status`), so a restarted
operator decides exactly as the old one would have; `evaluate` runs one `step` and writes its
state back (`state.to_status`) with the conditions, the recommendation and the Events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from specdecode import api
from specdecode import constants as C
from specdecode.control import metrics
from specdecode import timestamps
from specdecode.control import state as cs
from specdecode.control import status as st
from specdecode.control.decision import Action, Decision
from specdecode.control.estimates import PolicyObservations, binomial_stderr
from specdecode.control.explain import fmt_s
from specdecode.control.settings import PolicySettings, PolicyTuning
from specdecode.control.step import step

DEFAULT_RESTART_S = 180.0
# A model download on a pod start with an empty cache: a 7-8B model (about 16 GB in bf16) at
# about 60 MB/s from the hub. Used until a measured change replaces the whole estimate.
DEFAULT_MODEL_DOWNLOAD_S = 270.0


@dataclass(frozen=True)
class EvaluationResult:
    """A decision turned into a new status and the Events to post about it."""

    status: api.SpecDecodeServiceStatus
    decision: Decision
    events: tuple[tuple[str, str, str], ...]  # (type, reason, message)
    rerender: bool  # the effective speculation changed: the Deployment must be re-rendered
    experiments_started: tuple[api.ExperimentRecord, ...] = ()
    """Canary experiments this evaluation started (the canary must be created)."""
    experiments_ended: tuple[api.ExperimentRecord, ...] = ()
    """Canary experiments this evaluation ended, with their verdict (the canary must go; the
    shell counts them, by purpose and verdict, once the status is written)."""

    @property
    def children_changed(self) -> bool:
        """The children differ from what the reconcile last rendered: the main Deployment's
        config, or a canary to create or delete (and the main's replicas with it)."""
        return self.rerender or bool(self.experiments_started) or bool(self.experiments_ended)



def measured_restart_s(status: api.SpecDecodeServiceStatus, spec: api.SpecDecodeServiceSpec) -> float:
    """How long the last change took to go live (the restart price's duration). Until the
    service has been through one: the default, plus a model download when every pod start
    downloads the weights again (an emptyDir cache). A measured change includes that download
    already: the pods it restarted downloaded too."""
    effective = status.speculation
    if effective and effective.since and effective.live_since:
        took = timestamps.epoch_seconds_or_none(effective.live_since) - timestamps.epoch_seconds_or_none(effective.since)
        if took > 0:
            return took
    return DEFAULT_RESTART_S + (DEFAULT_MODEL_DOWNLOAD_S if spec.downloads_weights_at_start else 0.0)


def observations_for(
    read: metrics.ReadResult,
    spec: api.SpecDecodeServiceSpec,
    namespace: str,
    name: str,
    config_hash: Optional[str],
    settings: PolicySettings,
) -> PolicyObservations:
    """The current config's observations over the long and the guard window, and the whole
    service's load over the trend window."""
    if isinstance(read, metrics.MetricsUnavailable):
        return PolicyObservations.unavailable(read.message, read.reason)
    long_scope, guard_scope, trend_scope = scopes_for(spec, settings)
    window = read.for_service(long_scope, namespace, name).get(config_hash or "")
    guard = read.for_service(guard_scope, namespace, name).get(config_hash or "")
    trend = metrics.service_request_rate(read.for_service(trend_scope, namespace, name).values())
    return PolicyObservations.of(window, guard, trend)


def scopes_for(
    spec: api.SpecDecodeServiceSpec, settings: PolicySettings
) -> tuple[metrics.QueryScope, metrics.QueryScope, metrics.QueryScope]:
    """The long, the guard and the trend (load only) scope of a service's queries."""
    selector = spec.metrics.selector
    return (
        metrics.QueryScope.of(settings.window_s, selector),
        metrics.QueryScope.of(settings.guard_window_s, selector),
        metrics.QueryScope.of(settings.trend_window_s, selector, load_only=True),
    )


def evaluate(
    status: api.SpecDecodeServiceStatus,
    spec: api.SpecDecodeServiceSpec,
    settings: PolicySettings,
    observed: PolicyObservations,
    generation: Optional[int],
    now: datetime,
    canary: Optional[metrics.Observation] = None,
) -> EvaluationResult:
    """One evaluation: the state from status, one `step`, and the status after it
    (observations, recommendation, history, conditions, experiments and, when the operator
    acts, the new effective speculation). ``canary`` is the running experiment's canary arm
    over the long window (`observations_for` with the record's candidateHash), from the same
    read as ``observed``."""
    state = cs.from_status(status, spec, now, generation)
    decision, after = step(settings, state, observed, now.timestamp(), canary)
    return apply_decision(status, spec, decision, after, observed, generation, now)


def apply_decision(
    status: api.SpecDecodeServiceStatus,
    spec: api.SpecDecodeServiceSpec,
    decision: Decision,
    after: cs.ControlState,
    observed: PolicyObservations,
    generation: Optional[int],
    now: datetime,
) -> EvaluationResult:
    """The status after a decision and the state `step` left (`state.to_status`), with the
    conditions, the recommendation and the Events."""
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

    slo = slo_condition(spec, observed.window if observed.available else None, decision)
    if slo is not None:
        conds = st.set_condition(conds, C.COND_SLO_MET, *slo, now, generation)

    recommendation = api.Recommendation.model_validate(decision.recommendation_status(epoch))
    new_advice = status.recommendation is None or not _same_advice(status.recommendation, recommendation)
    if not new_advice:
        # Unchanged advice keeps the time it was first given (fresh reason and numbers ride
        # along whenever something else makes the status worth a write).
        recommendation = recommendation.model_copy(update={"at": status.recommendation.at})

    window = observed.window if observed.available else None
    events: list[tuple[str, str, str]] = []
    rerender = decision.applied and decision.changes
    if rerender:
        kind = "Warning" if decision.action is Action.DISABLE else "Normal"
        events.append((kind, C.EVENT_SPECULATION_CHANGED, f"{decision.action.value}: {decision.reason}"))
    elif decision.changes and new_advice:
        events.append(("Normal", C.EVENT_RECOMMENDATION, f"recommend {decision.action.value}: {decision.reason}"))

    new_status = cs.to_status(
        after, status, spec, reason=decision.reason,
        observation=None if window is None else window.to_status(),
        max_history=C.MAX_DECISION_HISTORY,
    )
    started, ended = experiment_transitions(status.experiments, new_status.experiments)
    events.extend(experiment_events(started, ended, decision.reason))
    if new_status.experiments:
        conds = experimenting_condition(conds, new_status.experiments[-1], now, generation)
    plan = status.plan
    if decision.plan is not None:
        plan = api.PlanStatus.model_validate(decision.plan.to_status(epoch))
    new_status = new_status.model_copy(update={"conditions": conds, "recommendation": recommendation, "plan": plan})
    return EvaluationResult(new_status, decision, tuple(events), rerender, started, ended)


def slo_condition(
    spec: api.SpecDecodeServiceSpec, window: Optional[metrics.Observation], decision: Decision,
) -> Optional[tuple[bool, str, str]]:
    """SLOMet (status, reason, message) from the long window's P95 against spec.autotune.slo;
    None (left as it is) without an SLO or without a P95 the window is sure of. The message
    carries no live figures, so a steady breach costs no status write a minute; the
    decision's reason (status.recommendation) has them."""
    objectives = (
        ("end-to-end latency", spec.autotune.slo.p95_end_to_end, None if window is None else window.e2e_p95_s),
        ("time per output token", spec.autotune.slo.p95_time_per_output_token,
         None if window is None else window.tpot_p95_s),
    )
    declared = [(what, api.parse_duration(slo), p95) for what, slo, p95 in objectives if slo]
    if not declared:
        return None
    measured = [(what, slo, p95) for what, slo, p95 in declared if p95 is not None]
    if not measured:
        return None
    broken = [f"P95 {what} is over its {fmt_s(slo)} objective" for what, slo, p95 in measured if p95 > slo]
    if not broken:
        return True, C.REASON_SLO_MET, "P95 latency within every objective over the last window"
    if decision.applied and decision.changes:
        doing = "the operator is changing speculation to fix it"
    elif decision.changes:
        doing = "the operator recommends a change it does not make (status.recommendation says why)"
    else:
        doing = "no change the operator may make now is predicted to fix it (status.recommendation)"
    return False, C.REASON_SLO_BREACHED, f"{'; '.join(broken)}: {doing}"


def experiment_transitions(
    before: list[api.ExperimentRecord], after: list[api.ExperimentRecord]
) -> tuple[tuple[api.ExperimentRecord, ...], tuple[api.ExperimentRecord, ...]]:
    """(started, ended): the experiments ``after`` has running that ``before`` did not have,
    and those running in ``before`` that ``after`` has ended."""
    def key(record: api.ExperimentRecord) -> tuple[str, str]:
        return (record.started_at, record.candidate_hash)

    known = {key(r) for r in before}
    was_running = {key(r) for r in before if r.running}
    started = tuple(r for r in after if r.running and key(r) not in known)
    ended = tuple(r for r in after if not r.running and key(r) in was_running)
    return started, ended


def experiment_events(
    started: tuple[api.ExperimentRecord, ...], ended: tuple[api.ExperimentRecord, ...], why: str
) -> list[tuple[str, str, str]]:
    """One Event per experiment started (``why``: the decision that started it) and ended."""
    events = [("Normal", C.EVENT_EXPERIMENT_STARTED, why) for _ in started]
    for r in ended:
        if r.verdict == "Promote":
            events.append(("Normal", C.EVENT_EXPERIMENT_PROMOTED, f"{r.purpose}: {r.candidate} promoted: {r.reason}"))
        elif r.verdict == "Cancelled":
            events.append(("Normal", C.EVENT_EXPERIMENT_CANCELLED, f"{r.purpose}: {r.candidate} cancelled: {r.reason}"))
        elif r.verdict == "Measured":
            events.append(("Normal", C.EVENT_EXPERIMENT_MEASURED, f"{r.purpose}: {r.candidate} measured: {r.reason}"))
        else:
            events.append(("Normal", C.EVENT_EXPERIMENT_ABORTED,
                           f"{r.purpose}: {r.candidate} aborted ({r.verdict}): {r.reason}"))
    return events


def experimenting_condition(
    conditions: list[api.Condition], latest: api.ExperimentRecord, now: datetime, generation: Optional[int]
) -> list[api.Condition]:
    """Experimenting: True while the latest experiment runs (reason: its purpose), False with
    its verdict once it ended. Neutral for GitOps health: the main Deployment serves."""
    if latest.running:
        progress = latest.reason or "starting the canary"
        message = (f"{latest.purpose}: {latest.candidate} on the canary against the running config "
                   f"({latest.paired_windows} paired windows): {progress}")
        return st.set_condition(conditions, C.COND_EXPERIMENTING, True, latest.purpose, message, now, generation)
    message = f"last experiment ({latest.purpose}, {latest.candidate}) ended {latest.verdict}: {latest.reason}"
    return st.set_condition(conditions, C.COND_EXPERIMENTING, False, latest.verdict, message, now, generation)


def _same_advice(a: api.Recommendation, b: api.Recommendation) -> bool:
    """The same advice (what to run), whatever numbers its reason quotes today."""
    return (a.action, a.enabled, a.k, a.schedule) == (b.action, b.enabled, b.k, b.schedule)


# How far a new measurement must move from the stored one before it is worth an API write.
# Falls and rises are not alike. A fall is what a restarted operator's policy needs at once (it
# prices moves against the recent low and remembers what the draft paid), so a fall beyond the
# noise is written. A rise changes no decision the stored value drives (the recent low relaxes
# from its stored time by itself; a lower remembered acceptance is the cautious side), so it is
# written only when the stored figure would mislead a user reading status (measured: 50 steady
# services whose acceptance wandered by +-0.03 wrote 10.5 status patches a minute, each a rise
# or fall of about 0.03, with no decision to record).
ALPHA_WRITE_DELTA = 0.02
ACCEPTANCE_RATE_WRITE_DELTA = 0.05
RISE_WRITE_DELTA = 0.10
SCHEDULE_OVERHEAD_WRITE_SHARE = 0.10
PEAK_RATE_WRITE_SHARE = 0.10
"""The recent peak load is written when it moves by a tenth (a new peak, or a day's fading):
finer steps change no decision it holds back."""
PEAK_SEEN_WRITE_S = 2 * 3600.0
"""...and when it was last seen, once that moved by two hours: the hold's slack beyond a day
(`PolicyTuning.peak_hold_s`), so a restarted operator holds a daily peak until the next."""
REQUEST_ACCEPTANCE_SD = 0.15
"""How much one request's own acceptance varies around the service's (prompts differ: code
and chat, repeated and novel text): a window's acceptance is as uncertain as its number of
requests makes it, not only as its tokens do."""


def status_write_needed(stored: api.SpecDecodeServiceStatus, new: api.SpecDecodeServiceStatus,
                        rule_changed: bool = False) -> bool:
    """Whether an evaluation's new status says something the stored one does not.

    Written: any change of effective speculation, history, advice (action, K), a condition's
    status or reason, a new config's first observations, and acceptance or latency that moved
    materially (the policy's memory after a restart: `policy_state` reads observations.alpha
    and recentLowAlpha). Not written: evaluation times, numbers in condition messages, in
    the reason of unchanged advice and in scheduleReason, latency percentiles, measurement
    noise. A steady service costs no API writes.
    """
    if _material(stored, rule_changed) != _material(new, rule_changed):
        return True
    return observations_moved(stored.observations, new.observations)


NUMBER = re.compile(r"\d+(?:\.\d+)?")
"""A number in a reason: what varies from one evaluation to the next with the measurements."""


def _material(status: api.SpecDecodeServiceStatus, rule_changed: bool) -> dict:
    wire = status.to_wire()
    wire.pop("observations", None)
    # The plan's forecast and the load history move a little at every evaluation: what the
    # plan runs when is material, and the history once an hour (a restarted operator then
    # forecasts from all but the last hour); the rest rides along with the next write.
    plan = wire.pop("plan", None)
    wire["plan"] = None if plan is None else plan.get("configs")
    history = wire.pop("loadHistory", None)
    wire["loadHistory"] = None if history is None else (history.get("start"), len(history.get("rates") or []) // 6)
    speculation = wire.get("speculation")
    if speculation and speculation.get("scheduleReason"):
        # Why no schedule is adopted quotes today's figures ("2.8% per token saved ...");
        # a new reason is written, new numbers ride along with the next write (as the
        # reason of unchanged advice does).
        speculation["scheduleReason"] = NUMBER.sub("#", speculation["scheduleReason"])
    wire["conditions"] = [
        (c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"))
        for c in wire.get("conditions") or []
    ]
    advice = wire.get("recommendation")
    if advice is not None and not rule_changed:
        wire["recommendation"] = {k: v for k, v in advice.items() if k not in ("reason", "predictedSpeedup")}
    return wire


WRITE_STANDARD_ERRORS = 4.0
"""How far beyond the sampling noise a fall must be to be written. Each evaluation of each
service is one more chance for noise to cross the line, and the chances add up over a fleet
(500 services are 1,000 evaluations a minute): at three standard errors, a one-sided normal
tail of one in 740; at four, one in 31,600. The request-level test in test_evaluation.py
wrote four patches in 30,000 steady evaluations at three (one every eight minutes at N=500),
none at four. A collapse is many times either."""


def _noise(stored: api.Observations, new: api.Observations, a: float, b: float) -> float:
    """How far two windows' acceptance may differ by sampling alone: `WRITE_STANDARD_ERRORS`
    standard errors of the difference, each window's from its drafted tokens (binomial,
    overdispersed) and from its requests (each request has an acceptance of its own)."""
    overdispersion = PolicyTuning().overdispersion
    variance = 0.0
    for observed, value in ((stored, a), (new, b)):
        if observed.drafts:
            variance += binomial_stderr(value, observed.drafts, overdispersion) ** 2
        if observed.requests:
            variance += REQUEST_ACCEPTANCE_SD ** 2 / observed.requests
    return WRITE_STANDARD_ERRORS * variance ** 0.5


def _moved(a: Optional[float], b: Optional[float], tolerance: float, relative: bool = False) -> bool:
    """A stored figure and its new value differ: one is missing, or they lie more than
    ``tolerance`` apart (a share of the larger when ``relative``)."""
    if a is None or b is None:
        return (a is None) != (b is None)
    return abs(b - a) > tolerance * (max(a, b) if relative else 1.0)


def observations_moved(stored: Optional[api.Observations], new: Optional[api.Observations]) -> bool:
    """A new measurement worth storing: the first of a config, acceptance appearing or
    vanishing, a fall beyond the noise, or a rise large enough to mislead a reader."""
    if new is None or stored is new:
        return False
    if stored is None or stored.config_hash != new.config_hash or stored.metric_names != new.metric_names:
        return True
    for field_name, fall, rise in (("alpha", ALPHA_WRITE_DELTA, RISE_WRITE_DELTA),
                                   ("recent_low_alpha", ALPHA_WRITE_DELTA, None),
                                   ("acceptance_rate", ACCEPTANCE_RATE_WRITE_DELTA, RISE_WRITE_DELTA)):
        a, b = getattr(stored, field_name), getattr(new, field_name)
        if (a is None) != (b is None):
            return True
        if a is None or b is None:
            continue
        delta = fall if b < a else rise
        if delta is not None and abs(b - a) >= max(delta, _noise(stored, new, a, b)):
            return True
    # The recent peak load holds moves back (`rules`): a restarted operator must find it, and
    # its hold runs from when it was last seen: a restarted operator must not let go of a peak
    # seen again today because status still says yesterday.
    if _moved(stored.recent_peak_request_rate, new.recent_peak_request_rate, PEAK_RATE_WRITE_SHARE, relative=True):
        return True
    if _moved(timestamps.epoch_seconds_or_none(stored.recent_peak_at),
              timestamps.epoch_seconds_or_none(new.recent_peak_at), PEAK_SEEN_WRITE_S):
        return True
    # The schedule's calibrated cost is what a restarted operator prices schedules with.
    if _moved(stored.schedule_overhead_seconds, new.schedule_overhead_seconds, SCHEDULE_OVERHEAD_WRITE_SHARE,
              relative=True):
        return True
    # Latency is not among them: P95 from histogram buckets jumps by a bucket from one window
    # to the next with no change in the service, and no decision reads it back from status
    # (an SLO breach shows as a decision and in SpeculationEffective).
    return False
