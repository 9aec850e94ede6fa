"""Canary experiments in the control loop: the step's second half (pure; time passed in).

A move the performance model predicts (a tuning move, a re-probe while speculation is off, a
per-batch-size K schedule adopted or replaced) is a bet on the model, and losing it restarts
every replica twice. In Auto mode, when the plan can run (`CanaryPlan.blocker` is None),
such a move starts an experiment instead: the candidate runs on a canary Deployment beside
the running config, on the same traffic, and reaches every replica only once it is measured
better (`experiments.judge`; a schedule: measured as the model predicts it at the canary's
load). After the rules have decided, `run`

- cancels a running experiment that can no longer answer its question: autotune left Auto,
  the plan became blocked, the spec changed what was tested (the candidate's or the running
  config's engine config, the bounds), or a safety move changes the running config now (the
  acceptance floor, the guards, bounds, a hedge apply at once, never on a canary);
- measures it once per window, windows never overlapping, the first after the canary's
  start and warm-up, and turns its verdict into the decision: Promote is an applied change
  to the candidate (rule Experiment, a history entry); every Abort keeps the running config
  and is remembered, so the same candidate is not tried again before a back-off
  (reprobeInterval, doubled for each further loss in a row, at most 8x);
- starts one in place of a tuning move, a re-probe or a schedule, or a periodic Control experiment
  (speculation off on the canary) for a config that has run unchanged for controlInterval,
  or one early Calibrate experiment (speculation off for one window, verdict Measured) when
  the running config's step time is well above the prior's: any window in which the canary
  and the running config differ in speculation measures both step times (`step_scales`),
  and the rules price the other kind of config by their ratio (`memory.off_per_on`).

Recommend mode starts none and says in its advice what Auto mode would test; Off mode runs
none. Everything it knows comes from the state (status.experiments), so an operator
restarted between two evaluations resumes an experiment where the old one left it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from specdecode import constants
from specdecode.api import AutotuneMode
from specdecode.control.decision import CANARIED_RULES, Action, Decision, Held, Rule
from specdecode.control.estimates import PolicyObservations, estimate, step_scale
from specdecode.control.experiments import (
    Experiment, ExperimentPolicy, Purpose, Verdict, arm_window, below_floor, cancel_reason, rendered_schedule,
    traffic_skew,
)
from specdecode.control.explain import fmt_s
from specdecode.control.hedge import serving_in_rollout
from specdecode.control.memory import off_per_on, stored
from specdecode.control.metrics import Observation
from specdecode.control.perfmodel import OFF, Config, Schedule
from specdecode.control.settings import PolicySettings
from specdecode.control.state import ControlState

LOSSES = frozenset({Verdict.ABORT_WORSE, Verdict.ABORT_NO_GAIN, Verdict.ABORT_SLO, Verdict.ABORT_TIMEOUT})
"""Verdicts that say the candidate did not beat the running config (a cancel says nothing)."""
PATIENT_LOSSES = frozenset({Verdict.ABORT_NO_GAIN, Verdict.ABORT_TIMEOUT, Verdict.ABORT_WORSE, Verdict.ABORT_SLO})
"""Losses whose canary may serve on until the load allows the restart its end costs
(`_end_overloads`): every one but a canary below the acceptance floor (ended before any
verdict, as the collapse guard ends the running config's)."""
END_WAIT_TOLERANCE = 0.5
"""... while its last window's time per token is at most this much above the running
config's. A candidate that timed out on calm windows may be far worse at a peak (traced: an
EAGLE head at acceptance 0.32, K=2 2.26 times speculation off's time per token there), and its
end does not wait. One some 10 % slower carries nearly its share, and its end would leave the
main Deployment alone under the peak (traced: n-gram K=5 against K=3 in a generated swing,
measured 11 % slower over the peak's windows, one of them 26 %: ended there, 0.80; waiting
for the calm, 0.97). Both arms queue at a peak's bursts, the one no worse as much as the
other: a queue does not tell them apart."""


def run(
    settings: PolicySettings,
    state: ControlState,
    decision: Decision,
    observed: PolicyObservations,
    canary: Optional[Observation],
    now: float,
) -> tuple[Decision, ControlState]:
    """The decision once experiments had their say, and the state with its experiments.

    ``canary`` is the canary's observation over the long window (its config hash), None
    when no canary runs or it has no series yet."""
    policy = settings.experiments
    # status keeps whole seconds: times kept as such read back the same after a restart
    at = float(math.floor(now))
    running = state.experiment
    if running is not None:
        why = _cancel_reason(policy, state, running, decision)
        if why is None:
            assert policy is not None  # no policy cancels
            return _measure(settings, policy, state, running, decision, observed, canary, at)
        state = replace(state, experiments=state.experiments[:-1] + (running.cancel(why, at),))
        if decision.changes and decision.rule not in CANARIED_RULES:
            return decision, state  # the safety move applies now
    return _start_if_due(settings, policy, state, decision, observed, at)


def serving_settings(settings: PolicySettings, state: ControlState) -> PolicySettings:
    """The settings the rules judge the running config by. While a canary borrows replicas,
    the main Deployment runs fewer (`CanaryPlan.main_replicas`) and the incumbent's window
    holds only their share of the traffic: per replica, the load is what it was."""
    policy = settings.experiments
    if state.experiment is None or policy is None or not policy.plan.borrows_replicas(policy.spec):
        return settings
    return replace(settings, replicas=max(1, policy.plan.main_replicas(policy.spec)))


def canary_starting(settings: PolicySettings, state: ControlState, now: float) -> bool:
    """A capacity-neutral canary is starting, and the guard window still holds those minutes:
    its borrowed replicas serve nothing until ``restart_s`` after the experiment began, so the
    main Deployment's replicas carry the whole load for a while by construction, not because
    the load rose."""
    policy, running = settings.experiments, state.experiment
    if running is None or policy is None or not policy.plan.borrows_replicas(policy.spec):
        return False
    return now < running.started_at + settings.restart_s + settings.guard_window_s


def promoted_lately(state: ControlState) -> bool:
    """The running config was measured on a canary and promoted (the last change was that
    promotion): it is not on trial like a re-probe the model only predicted."""
    return bool(state.experiments) and _promoted_running(state.experiments[-1], state)


def promotion_in_effect(state: ControlState) -> Optional[Experiment]:
    """The experiment whose promotion put the running config in place (None: no canary did).
    Not necessarily the last one: a Calibrate may have started under that config since."""
    return next((x for x in reversed(state.experiments) if _promoted_running(x, state)), None)


def _promoted_running(experiment: Experiment, state: ControlState) -> bool:
    """``experiment`` was promoted into the running config, since that config was chosen."""
    schedule = experiment.candidate_schedule.label if experiment.candidate_schedule is not None else None
    return (experiment.outcome is not None and experiment.outcome.verdict is Verdict.PROMOTE
            and experiment.candidate_k == (state.k if state.enabled else None)
            and schedule == (state.schedule.label if state.schedule is not None else None)
            and experiment.ended_at is not None and experiment.ended_at >= math.floor(state.since))


# --- a running experiment ----------------------------------------------------------------------


def _cancel_reason(
    policy: Optional[ExperimentPolicy], state: ControlState, running: Experiment, decision: Decision,
) -> Optional[str]:
    """Why the running experiment cannot go on (None: it goes on): the spec no longer allows
    it (`experiments.cancel_reason`, the reconcile's check too), or a safety move changes the
    running config now."""
    if policy is None:
        return "experiments are turned off"
    why = cancel_reason(policy.spec, running, state.config_hash, state.excluded_ks)
    if why is None and decision.changes and decision.applied and decision.rule not in CANARIED_RULES:
        why = f"the running config changes at once (rule {decision.rule.value}): {decision.reason}"
    return why


def _window_due(settings: PolicySettings, policy: ExperimentPolicy, running: Experiment, at: float) -> bool:
    """A new window to measure: a full window after the last one measured (the first after the
    canary's start, `restart_s`, and its warm-up), or the experiment's time is up."""
    if running.last_window_at is not None:
        start = running.last_window_at
    else:
        start = running.started_at + settings.restart_s + settings.warmup_s
    if at >= start + settings.window_s:
        return True
    # Time is up: one window to judge on at once. A promotion that waits for the load
    # (`_promotion_overloads`) runs on past it, a window at a time: windows never overlap.
    deadline = running.started_at + policy.test.max_duration_s
    return at >= deadline and (running.last_window_at is None or running.last_window_at < deadline)


def _measure(
    settings: PolicySettings, policy: ExperimentPolicy, state: ControlState, running: Experiment,
    decision: Decision, observed: PolicyObservations, canary: Optional[Observation], at: float,
) -> tuple[Decision, ControlState]:
    current = state.config_label
    if not observed.available:
        return decision, state  # fail static: no window is measured; the rules' hold says why
    below = below_floor(arm_window(canary), policy.test)
    if below is not None:
        # As the collapse guard on the running config: at once, not after the test's windows
        # (a re-probe into an acceptance that has not recovered costs one replica for minutes).
        ended = running.end(Verdict.ABORT_WORSE, below, at)
        state = replace(state, experiments=state.experiments[:-1] + (ended,))
        return _experiment_hold(decision, state, (
            f"canary experiment ({running.purpose.value}) ended {Verdict.ABORT_WORSE.value}: {below}; "
            f"keeping {current}")), state
    if not _window_due(settings, policy, running, at):
        progress = running.outcome.reason if running.outcome else "waiting for the canary's first full window"
        return _experiment_hold(decision, state, (
            f"canary experiment ({running.purpose.value}) runs {running.candidate} against {current}: "
            f"{progress} ({running.evidence.paired} paired windows so far)")), state
    measured = running.observe(canary, observed.window, at, policy.test)
    scales = step_scales(settings, policy, state, measured, canary, observed.window)
    if scales is not None:
        measured = replace(measured, candidate_step_scale=scales[0], incumbent_step_scale=scales[1])
    if running.purpose is Purpose.CALIBRATE and scales is not None and not measured.outcome.verdict.final:
        # Its question is answered; a verdict on speed would take windows it does not need.
        measured = replace(measured, ended_at=at, outcome=replace(
            measured.outcome, verdict=Verdict.MEASURED, reason=_measured_reason(measured, current)))
    state = replace(state, experiments=state.experiments[:-1] + (measured,))
    outcome = measured.outcome
    assert outcome is not None
    evidence = (f"{measured.evidence.paired} paired windows, {measured.evidence.candidate_requests:.0f} "
                f"canary and {measured.evidence.incumbent_requests:.0f} running-config requests")
    if outcome.verdict is Verdict.CONTINUE:
        return _experiment_hold(decision, state, (
            f"canary experiment ({running.purpose.value}) runs {running.candidate} against {current}: "
            f"{outcome.reason} ({evidence})")), state
    if outcome.verdict is Verdict.PROMOTE:
        overload = _promotion_overloads(settings, state, measured, decision, observed)
        if overload is not None:
            # The canary goes on serving the candidate on its borrowed replicas, both configs
            # carrying the load; the verdict stands (`Experiment.promotion_waits_since`) and
            # the next window checks the load again.
            waiting = replace(
                measured, ended_at=None, promotion_waits_since=measured.promotion_waits_since or at,
                outcome=replace(outcome, verdict=Verdict.CONTINUE,
                                reason=f"{outcome.reason}; the promotion waits: {overload}"))
            state = replace(state, experiments=state.experiments[:-1] + (waiting,))
            return _experiment_hold(decision, state, (
                f"canary experiment ({running.purpose.value}) would promote {running.candidate} over {current}: "
                f"{outcome.reason} ({evidence}), but {overload}: the canary keeps serving "
                f"{running.candidate} until the load allows the rollout")), state
        target = measured.candidate_k
        if target is None:
            action = Action.DISABLE
        else:
            action = Action.SET_K if state.enabled else Action.ENABLE
        reason = (f"canary experiment ({running.purpose.value}) promoted {running.candidate} over {current}: "
                  f"{outcome.reason} ({evidence})")
        return replace(decision, action=action, enabled=target is not None, k=target, rule=Rule.EXPERIMENT,
                       reason=reason, applied=True, held=None, wanted=None,
                       schedule=measured.candidate_schedule), state
    if outcome.verdict in PATIENT_LOSSES and _serves_as_well(canary, observed.window):
        overload = _end_overloads(settings, state, decision, observed)
        if overload is not None:
            # The canary goes on serving the candidate on its borrowed replicas; each later
            # window is judged again (one more than END_WAIT_TOLERANCE slower per token, or a
            # canary below the floor, ends it at once) and checks the load again.
            waiting = replace(measured, ended_at=None, outcome=replace(
                outcome, verdict=Verdict.CONTINUE, reason=f"{outcome.reason}; the end waits: {overload}"))
            state = replace(state, experiments=state.experiments[:-1] + (waiting,))
            return _experiment_hold(decision, state, (
                f"canary experiment ({running.purpose.value}) would end {outcome.verdict.value}: {outcome.reason} "
                f"({evidence}), but {overload}: the canary keeps serving {running.candidate} until the load "
                "allows its replicas to restart")), state
    return _experiment_hold(decision, state, (
        f"canary experiment ({running.purpose.value}) ended {outcome.verdict.value}: {outcome.reason} "
        f"({evidence}); keeping {current}")), state


def _serves_as_well(canary: Optional[Observation], incumbent: Optional[Observation]) -> bool:
    """The canary's last window served about as well as the running config's: a time per
    token at most ``END_WAIT_TOLERANCE`` above it (`_end_overloads`)."""
    if canary is None or incumbent is None or canary.idle or incumbent.idle:
        return False
    mine, theirs = canary.tpot_mean_s, incumbent.tpot_mean_s
    return mine is not None and theirs is not None and mine <= theirs * (1.0 + END_WAIT_TOLERANCE)


def _end_overloads(
    settings: PolicySettings, state: ControlState, decision: Decision, observed: PolicyObservations,
) -> Optional[str]:
    """Why ending a capacity-neutral canary now would overload the main Deployment, or None.
    Its end gives the borrowed replicas back, and they restart into the running config while
    the main Deployment's replicas carry the whole load. Traced in a generated swing (EAGLE-3,
    `maxSurge: 0`, two replicas): a canary of K=4 against K=3 started a minute before a step
    to 91 % of the service's capacity, served it as well as K=3 did, and timed out 29 minutes
    into the peak; its replica's restart left one replica of K=3 under the whole peak, and
    the queue of those minutes took half the day's score (0.49, where K=3 all day scores
    0.97). Above ``restart_max_rollout_load`` of what the main Deployment carries, a canary
    serving within ``END_WAIT_TOLERANCE`` of the running config keeps serving until the load
    falls."""
    policy = settings.experiments
    if policy is None or not policy.plan.borrows_replicas(policy.spec):
        return None
    predicted = {p.k: p for p in decision.predictions}
    incumbent = predicted.get(state.config)
    window = observed.window if observed.available else None
    if incumbent is None or window is None or window.idle:
        return None
    # The predictions are the main Deployment's (`serving_settings`): its replicas carry
    # ``incumbent.capacity_rps``; the window's load is their share of the service's.
    main = max(1, policy.plan.main_replicas(policy.spec))
    return _overloads(settings, observed, main, incumbent.capacity_rps,
                      f"its end would load the {main} replica(s) left serving during the canary's restart")


def _promotion_overloads(
    settings: PolicySettings, state: ControlState, measured: Experiment, decision: Decision,
    observed: PolicyObservations,
) -> Optional[str]:
    """Why promoting now would overload the replicas left serving, or None. A promotion rolls
    the main Deployment to the candidate; with maxSurge 0 the canary's borrowed replicas go
    back at once and each round of the rollout serves on the replicas the others leave, at the
    lower capacity of the two configs. Above ``restart_max_rollout_load`` of what those carry
    the queue of the rollout costs every request of the next minutes more than the promotion
    gains (a canary promoted EAGLE-3 K=8 over K=6, 7.8 % faster per token, eight minutes into
    a peak at 56 % of the service's capacity: one replica served it for six minutes, and the
    day's mean latency tripled)."""
    if settings.rollout_keeps_capacity or state.schedule is not None or measured.candidate_schedule is not None:
        return None
    predicted = {p.k: p for p in decision.predictions}
    incumbent = predicted.get(state.config)
    candidate = predicted.get(OFF if measured.candidate_k is None else measured.candidate_k)
    window = observed.window if observed.available else None
    if incumbent is None or candidate is None or window is None or window.idle:
        return None
    # The predictions are the main Deployment's (`serving_settings` while the canary ran; the
    # Promote has ended it in ``state``, so its plan gives the main Deployment's replicas).
    policy = settings.experiments
    main = max(1, policy.plan.main_replicas(policy.spec)) if policy is not None else settings.replicas
    per_replica = min(incumbent.capacity_rps, candidate.capacity_rps) / main
    left = per_replica * serving_in_rollout(settings, settings.replicas)
    return _overloads(settings, observed, main, left, "the rollout would load the replicas left serving")


def _overloads(settings: PolicySettings, observed: PolicyObservations, main: int, left: float,
               what: str) -> Optional[str]:
    """``what`` (a restart's words) with the load it would meet, when the service's load
    (the main Deployment's ``main`` replicas' share, scaled to the service's) reaches
    ``restart_max_rollout_load`` of the ``left`` requests/s the replicas left serving carry;
    None below it."""
    rate = observed.highest_request_rate(settings) / main * settings.replicas
    if left <= 0 or rate < settings.tuning.restart_max_rollout_load * left:
        return None
    return f"at {rate:.2f} req/s {what} to {rate / left:.0%} of the {left:.1f} req/s they carry"


def step_scales(
    settings: PolicySettings, policy: ExperimentPolicy, state: ControlState, experiment: Experiment,
    canary: Optional[Observation], incumbent: Optional[Observation],
) -> Optional[tuple[float, float]]:
    """(canary, running config): each arm's measured step time over the prior's at its own
    batch, its replicas and its config, within the calibration's bounds and rounded as status
    keeps them; None unless the window measured both. Their ratio is the one measurement the
    running config alone cannot give: what the other kind of config (speculation off on a
    Control canary, on on a Reprobe's) costs here, on the same traffic at the same time. None
    too when the two arms did not serve the same traffic (`traffic_skew`): the window then
    measured two loads, not two configs."""
    if traffic_skew(canary, incumbent) is not None:
        return None
    prior = settings.prior_params()
    arms = (
        (canary, policy.plan.replicas, experiment.candidate_schedule or experiment.candidate_k or OFF),
        (incumbent, policy.plan.main_replicas(policy.spec), state.schedule or state.config),
    )
    lo, hi = settings.tuning.scale_bounds
    scales = []
    for observation, replicas, config in arms:
        if observation is None or observation.idle:
            return None
        measured = step_scale(replace(prior, replicas=max(1, replicas)), config, estimate(observation, settings.tuning))
        if measured is None:
            return None
        scales.append(stored(min(hi, max(lo, measured))))
    return scales[0], scales[1]


def _experiment_hold(decision: Decision, state: ControlState, reason: str, wanted: Optional[Rule] = None) -> Decision:
    """The rules' decision turned into a hold for an experiment (its conditions kept). A hold
    for missing metrics keeps its own reason: it says what is wrong."""
    if not decision.changes and decision.rule is Rule.METRICS:
        return decision
    return replace(decision, action=Action.HOLD, enabled=state.enabled, k=state.k if state.enabled else None,
                   rule=Rule.EXPERIMENT, reason=reason, applied=False, held=Held.EXPERIMENT, wanted=wanted)


# --- starting one --------------------------------------------------------------------------------


def _start_if_due(
    settings: PolicySettings, policy: Optional[ExperimentPolicy], state: ControlState, decision: Decision,
    observed: PolicyObservations, at: float,
) -> tuple[Decision, ControlState]:
    wanted = decision.rule if decision.changes else decision.wanted
    if wanted in CANARIED_RULES:
        if policy is None or not policy.plan.enabled:
            return decision, state  # the user turned experiments off: moves apply as they always did
        if policy.blocker is not None:  # today's behaviour, and why no canary measures the move
            if not decision.changes:
                note = f"no canary could test it: {policy.blocker}"
            elif not decision.applied:
                note = f"in Auto mode every replica would change at once (no canary: {policy.blocker})"
            else:
                note = f"every replica changes at once, no canary: {policy.blocker}"
            return replace(decision, reason=f"{decision.reason}; {note}"), state
    if decision.changes and decision.rule in CANARIED_RULES:
        assert policy is not None
        candidate_k = decision.k if decision.enabled else None
        # As the pods render it (the main Deployment's after a promotion hashes alike).
        schedule = rendered_schedule(decision.schedule.label, policy.spec) if decision.schedule is not None else None
        purpose = Purpose.CHANGE if state.enabled else Purpose.REPROBE
        if not decision.applied:  # Recommend mode: say what Auto mode would do
            note = (f"in Auto mode it would first run as a canary experiment ({purpose.value}): "
                    f"{policy.describe(candidate_k, schedule)} on {policy.plan.replicas} canary replica(s) "
                    f"against {state.config_label}")
            return replace(decision, reason=f"{decision.reason}; {note}"), state
        if state.config_hash is None:
            return decision, state  # the running config's pods cannot be told apart yet
        return _start(settings, policy, state, decision, observed, purpose, candidate_k, at, schedule=schedule)
    control = _control_due(settings, policy, state, decision, at)
    if control is not None:
        assert policy is not None
        return _start(settings, policy, state, decision, observed, Purpose.CONTROL, None, at, control)
    calibrate, waiting = _calibration_due(settings, policy, state, decision, observed, at)
    if calibrate is not None:
        assert policy is not None
        return _start(settings, policy, state, decision, observed, Purpose.CALIBRATE, None, at, calibrate)
    if waiting is not None:
        return replace(decision, reason=f"{decision.reason}; {waiting}"), state
    return decision, state


def _start(
    settings: PolicySettings, policy: ExperimentPolicy, state: ControlState, decision: Decision,
    observed: PolicyObservations, purpose: Purpose, candidate_k: Optional[int], at: float,
    why: Optional[str] = None, schedule: Optional[Schedule] = None,
) -> tuple[Decision, ControlState]:
    candidate_hash = policy.config_hash(candidate_k, schedule)
    candidate = policy.describe(candidate_k, schedule)
    wanted = decision.rule if decision.changes else None
    short = _borrowed_capacity_short(settings, policy, state, decision, observed)
    if short is not None:
        return _experiment_hold(decision, state, (
            f"{decision.reason}; no canary experiment with {candidate} now: {short} (autotune.allowOutages "
            f"is false); keeping {state.config_label}"), wanted), state
    if decision.below_floor:
        # The collapse guard may change the running config at the next evaluation: a canary
        # started now would be cancelled then, its start-up and the borrowed replica's wasted.
        return _experiment_hold(decision, state, (
            f"{decision.reason}; no canary experiment with {candidate} while the short window shows "
            f"acceptance below the floor (the collapse guard decides first); keeping {state.config_label}"),
            wanted), state
    lost = _lost_lately(settings, state, candidate_hash, at)
    if lost is not None:
        return _experiment_hold(decision, state, (
            f"{candidate} {_lost_text(*lost, at)}; keeping {state.config_label}"), wanted), state
    experiment = Experiment(purpose=purpose, candidate=candidate, candidate_hash=candidate_hash,
                            incumbent_hash=state.config_hash or "", started_at=at, candidate_k=candidate_k,
                            candidate_schedule=schedule,
                            predicted_effect=decision.predicted_effect if schedule is not None else None)
    why = decision.reason if decision.changes else why
    reason = (f"canary experiment ({purpose.value}) started: {candidate} on {policy.plan.replicas} canary "
              f"replica(s) against {state.config_label}, before any change to every replica; {why}")
    experiments = (state.experiments + (experiment,))[-constants.MAX_EXPERIMENTS:]
    return _experiment_hold(decision, state, reason, wanted), replace(state, experiments=experiments)


def _borrowed_capacity_short(
    settings: PolicySettings, policy: ExperimentPolicy, state: ControlState, decision: Decision,
    observed: PolicyObservations,
) -> Optional[str]:
    """Why a canary that borrows replicas from the main Deployment would leave too few to carry
    the load while it starts (spec.autotune.allowOutages false), or None: the replicas left must
    carry the load, as a restart's must (`disruption.gate`)."""
    if settings.allow_outages or not policy.plan.borrows_replicas(policy.spec):
        return None
    current = {p.k: p for p in decision.predictions}.get(state.config)
    if current is None or not observed.available or observed.window is None:
        return None
    main = policy.plan.main_replicas(policy.spec)
    left = current.capacity_rps * main / max(1, settings.replicas)
    rate = observed.highest_request_rate(settings)
    if rate < left:
        return None
    return (f"at {rate:.2f} req/s the {main} replica(s) left serving while its canary starts would carry "
            f"{rate / left:.0%} of the {left:.1f} req/s they can")


def backing_off(settings: PolicySettings, state: ControlState, config: Config, at: float) -> Optional[str]:
    """Why ``config`` (a plain K or a schedule) may not run on a canary now (None: it may, or
    no canary runs here): it lost lately and its back-off is not over. The schedules path then
    offers none, and the rules' own decision stands (a schedule held back would hold their
    moves behind it); the tuning rule moves to the model's favourite instead of a shorter
    draft whose canary found no gain (`rules.shortest_near_best`)."""
    policy = settings.experiments
    if policy is None or not policy.runs:
        return None
    # No canary of its kind ran: nothing to back off from, and no hash to compute (this runs
    # at every evaluation that weighs a schedule or a shorter draft).
    if isinstance(config, Schedule):
        if all(x.candidate_schedule is None for x in state.experiments):
            return None
        rendered = rendered_schedule(config.label, policy.spec)
        candidate_hash = policy.config_hash(rendered.max_k, rendered)
    else:
        if not any(x.candidate_schedule is None and (x.candidate_k or OFF) == config for x in state.experiments):
            return None
        candidate_hash = policy.config_hash(config if config != OFF else None, None)
    lost = _lost_lately(settings, state, candidate_hash, float(math.floor(at)))
    return None if lost is None else _lost_text(*lost, float(math.floor(at)))


def _lost_text(last: Experiment, losses: int, retry_at: float, at: float) -> str:
    verdict = last.outcome.verdict.value if last.outcome else "lost"
    return (f"lost {losses} canary experiment(s) in a row, the last {fmt_s(at - (last.ended_at or at))} ago "
            f"({verdict}: {last.outcome.reason if last.outcome else ''}); not tried again for {fmt_s(retry_at - at)}")


def _lost_lately(
    settings: PolicySettings, state: ControlState, candidate_hash: str, at: float,
) -> Optional[tuple[Experiment, int, float]]:
    """(its last loss, losses in a row, when it may be tried again) while ``candidate_hash``
    is backing off after lost experiments; None when it may run. Only this candidate's own
    experiments count (a loss of another K says nothing of it); a cancel says nothing."""
    losses, last = 0, None
    for experiment in reversed(state.experiments):
        if experiment.running or experiment.candidate_hash != candidate_hash or experiment.outcome is None:
            continue
        verdict = experiment.outcome.verdict
        if verdict is Verdict.CANCELLED:
            continue
        if verdict not in LOSSES:
            break
        losses += 1
        last = last or experiment
    if last is None or last.ended_at is None:
        return None
    factor = min(settings.tuning.reprobe_backoff_max, 2 ** (losses - 1))
    retry_at = last.ended_at + settings.reprobe_interval_s * factor
    return (last, losses, retry_at) if at < retry_at else None


def _settled_on_speculation(
    settings: PolicySettings, policy: Optional[ExperimentPolicy], state: ControlState, decision: Decision,
) -> bool:
    """Whether speculation off may run on a canary now: experiments can run with Control ones
    allowed, Auto mode with speculation on and allowed off, the policy settled on the running
    config (a plain hold) and its pods told apart by their config hash."""
    if policy is None or policy.blocker is not None or policy.plan.control_interval_s is None:
        return False
    if settings.mode is not AutotuneMode.AUTO or not state.enabled or not settings.allow_disable:
        return False
    return not decision.changes and decision.rule is Rule.HOLD and state.config_hash is not None


def _control_due(
    settings: PolicySettings, policy: Optional[ExperimentPolicy], state: ControlState, decision: Decision, at: float,
) -> Optional[str]:
    """Why a Control experiment (speculation off on the canary) is due now; None when it is not:
    speculation on and unchanged for controlInterval, the policy settled on it, and no control
    experiment answered within that interval (a cancelled one is tried again after
    reprobeInterval)."""
    if not _settled_on_speculation(settings, policy, state, decision):
        return None
    assert policy is not None and policy.plan.control_interval_s is not None
    interval = policy.plan.control_interval_s
    if at - state.since < interval:
        return None
    for experiment in state.experiments:
        if experiment.purpose is not Purpose.CONTROL or experiment.ended_at is None:
            continue
        cancelled = experiment.outcome is not None and experiment.outcome.verdict is Verdict.CANCELLED
        if at - experiment.ended_at < (settings.reprobe_interval_s if cancelled else interval):
            return None
    return f"{state.config_label} has run unchanged for {fmt_s(at - state.since)}: does speculation still pay?"


def _calibration_due(
    settings: PolicySettings, policy: Optional[ExperimentPolicy], state: ControlState, decision: Decision,
    observed: PolicyObservations, at: float,
) -> tuple[Optional[str], Optional[str]]:
    """(why a Calibrate experiment (speculation off on the canary for one window) starts now,
    why one that is due waits); (None, None) when none is due.

    Due when the running config's step time is well above the prior's
    (`PolicyTuning.split_scale_gap`) and no experiment has measured speculation off beside
    speculation on (`memory.off_per_on`; one that ended without measuring is tried again after
    reprobeInterval). The model scales the config without the draft alike, and one config
    cannot tell a costly draft from a slow target: the answer decides where speculation stops
    paying. Started only when it costs little: the replicas left serving carry the load while
    the canary starts, and speculation off could keep the latency SLOs at this load at least
    under the reading most in its favour. Otherwise it waits, and the decision says so and what
    would let it run: the model's ranking of speculation against off is unmeasured meanwhile."""
    if not _settled_on_speculation(settings, policy, state, decision):
        return None, None
    assert policy is not None
    # Only a step costlier than the prior's leaves the answer open: the model then makes
    # speculation off as much slower as the running config, the ranking most in speculation's
    # favour, and a costly draft would look like a slow target. A faster step scaled onto
    # speculation off too is the ranking least in its favour: if speculation pays under it,
    # it pays under the other reading as well.
    scale = decision.step_scale
    if scale is None or scale < 1.0 + settings.tuning.split_scale_gap:
        return None, None
    if off_per_on(state.experiments) is not None:
        return None, None
    if any(x.purpose is Purpose.CALIBRATE and x.ended_at is not None and at - x.ended_at < settings.reprobe_interval_s
           for x in state.experiments):
        return None, None
    predicted = {p.k: p for p in decision.predictions}
    current, off = predicted.get(state.config), predicted.get(OFF)
    window = observed.window if observed.available else None
    if current is None or off is None or window is None or window.idle:
        return None, None
    due = f"{state.config_label} runs at {scale:.2f}x the step time of the model's prior"
    waits = (f"a Calibrate experiment is due but waits: {due}, and only speculation off measured beside it "
             "tells a costly draft from a slow target (where speculation stops paying depends on it)")
    rate = observed.highest_request_rate(settings)
    left = current.capacity_rps * policy.plan.main_replicas(policy.spec) / max(1, settings.replicas)
    if rate >= settings.tuning.restart_max_rollout_load * left:
        extra = ""
        if policy.plan.borrows_replicas(policy.spec):
            extra = (f"; with spec.rollout.maxSurge >= 1 and spec.autotune.experiments.maxExtraReplicas >= "
                     f"{policy.plan.replicas} the canary would run beside them")
        return None, (f"{waits}; at {rate:.2f} req/s the replicas left serving while its canary starts "
                      f"would carry {rate / left:.0%} of the {left:.1f} req/s they can{extra}")
    # A canary that would break an SLO whatever the answer is not started for a measurement:
    # it would end AbortSLO, often before its window measured anything. At low load latency
    # is about proportional to the step time, so at the prior's cost (the reading most in its
    # favour) speculation off's P95 would be the model's over the scale.
    for predicted_p95, slo in ((off.e2e_p95_s, settings.slo_e2e_s), (off.tpot_p95_s, settings.slo_tpot_s)):
        if slo is not None and predicted_p95 / scale > slo:
            return None, f"{waits}; speculation off would break the latency SLO at this load"
    return (f"{due}, and the running config alone cannot tell whether the draft or the target costs more than "
            "the prior says (the answer decides the load where speculation stops paying): measuring speculation "
            "off beside it for one window"), None


def _measured_reason(running: Experiment, incumbent: str) -> str:
    """What a Calibrate experiment found, for its record and its Event."""
    ratio = off_per_on((running,))
    assert ratio is not None and running.candidate_step_scale is not None and running.incumbent_step_scale is not None
    if ratio < 0.95:
        reading = "the draft costs more than the prior says"
    elif ratio > 1.05:
        reading = "the draft costs less than the prior says"
    else:
        reading = "the target and the draft are both as much off the prior"
    return (f"speculation off ran at {running.candidate_step_scale:.2f}x the prior's step time beside {incumbent} at "
            f"{running.incumbent_step_scale:.2f}x on the same traffic: {reading}; the model scales speculation off "
            f"by {ratio:.2f} of the running config's scale from now on")
