"""Per-batch-size K schedules as a choice of the control step (pure).

vLLM (0.24 and later) takes ``num_speculative_tokens_per_batch_size``: ranges of the running
batch size, each with its K (0 = no drafting there), so the engine follows load step by step
without a restart. This module is the policy's part of it, run by `control.step` after the
rules (`rules.decide`) have decided:

1. No schedule in effect (plain K, speculation on, its window complete): propose a
   few-band schedule (`perfmodel.propose_schedule`) from the calibrated step model, the
   per-position acceptance (capped by the recent low, so a burst of easy text does not lure
   the top range's K up) and the running batches the service sees: the window's mean and
   peak (`vllm:num_requests_running`, mean and ``max_over_time``) and the range of batches
   of the last hours (`batch_memory`). Adopt it
   - when the rules settled on the plain K and the schedule saves at least ``ADOPT_GAIN``
     of the time per token at those batches (rare: per step, neighbouring Ks differ little);
   - when the plain K cannot carry the load of the last day's peak (`memory.recent_peak`)
     and a schedule that stops drafting at the peak's batch carries it, for at most
     ``PEAK_CARRY_MAX_LOSS`` of today's e2e latency and time per token: with maxSurge 0 the
     peak would otherwise meet an overload a restart cannot leave (`_peak_to_carry`);
   - or instead of a load-driven move the rules decided (tuning, hedge: a lower K or off as
     the load rises), when the schedule is predicted within ``ADOPT_MAX_LOSS`` of that move's
     mean e2e latency at today's load and within ``ADOPT_MAX_LOSS`` of the plain K's time per
     token at the low end of the batch range: the same restart now, and none when the load
     comes back (the plain policy would restart again).
   Adopting restarts the pods once, under the rules' cooldown and change budget; one
   adopted while the rules hold K (whose price they did not weigh) waits, with maxSurge 0,
   for a load the replicas left serving carry. Where canary experiments can run (Auto mode,
   `ExperimentPolicy.runs`), the schedule is first measured on a canary replica against the
   plain K (`control.canary`: rule Schedule is canaried) and reaches every replica only once
   measured as the model predicts it at the canary's load (`predicted_effect`; its gain may
   lie at loads the canary does not see); one that loses is not offered while it backs off.
   For the same reason it is not offered instead of a hedge there (the hedge applies at
   once; a canary would borrow a replica as the load rises). Nothing is adopted while
   another canary experiment runs: its restart would cancel the experiment, and the plain K
   to compare against is the one the verdict leaves.
1b. Speculation off, a re-probe due, and no plain K that pays carries the last day's peak
   (the rules stay off, `Decision.peak_probe_alpha`): the re-probe runs a schedule that
   drafts at the calm's batches and not at the peak's instead (`_reprobe_schedule`); what it
   replaced is speculation off, which a revert returns to.
2. A schedule in effect: load swings are its job, so the rules' load-driven moves (tuning,
   hedge, SLO guard, fast fallback) are held; the acceptance floor and collapse (the user's
   hard rule) and the bounds still act, and leave the schedule for plain K. So do tuning,
   the SLO guard and the fast fallback when the service is past its capacity at a batch the
   schedule drafts more than their target (`_past_capacity`: more requests arrive than
   finish, `Observation.past_capacity`): a schedule chosen before a peak may draft through it,
   and the peak then finds it no better than a plain K; it is remembered as rejected. For
   ``CHECK_EVALUATIONS`` evaluations from the first full window after its warm-up, the
   rollout is checked: the measured engine time per output token against what the plain K
   it replaced measured before the rollout (`PlainBaseline`: full windows of that K, one per
   factor-2 band of the running batch), taken at the nearest batch and moved along the
   model's curve to the schedule's batch; a prediction from that K's calibration only when
   nothing was measured. Clearly worse (``REVERT_MARGIN``) -> back to that K, and the
   schedule is remembered as rejected for this declaration. At any time while it is in
   effect, a schedule that falls behind its load (a queue, and ``BEHIND_MARGIN`` fewer
   requests finished than that K serves at the batch by what it measured before, or is
   predicted to serve when nothing was measured: a throughput collapse past a range's
   threshold) is reverted the same way, and so is a table the engine ignores (vllm#51510:
   every request drafts the largest K where the ranges draft less, `_table_ignored`). Every
   full window also calibrates the schedule's per-step overhead from the measured step
   time (kept in status for later proposals).
3. Re-render only when the acceptance regime changed enough: a new proposal must save
   ``REPLACE_GAIN`` of the time per token over the whole batch range (a fixed grid, the same
   whatever the load), so load swings alone never restart. A replacement is canaried as an
   adoption is.

In Recommend mode step 1 is advice (status.recommendation.schedule; not applied, so not paced
by the cooldown or the change budget) and steps 2 and 3 do not run; Off mode chooses nothing.

Where the vLLM version or the method drops tables (`render.features`), or the user declared
a table, nothing is chosen and `ScheduleUpdate.note` says why (status.speculation.scheduleReason).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from specdecode.api import AutotuneMode
from specdecode.control import perfmodel
from specdecode.control.canary import backing_off, promotion_in_effect
from specdecode.control.decision import CANARIED_RULES, FLOOR_RULES, Action, Decision, Held, Rule
from specdecode.control.estimates import (
    Calibration, Estimate, estimate, scaled_params, step_scale, workload_of,
)
from specdecode.control.experiments import Experiment, Verdict
from specdecode.control.explain import label, shut_way_out
from specdecode.control.hedge import overloading_rollout, rollout_capacity_of
from specdecode.control.memory import remember, stored
from specdecode.control.metrics import Observation
from specdecode.control.perfmodel import OFF, EngineParams, Schedule
from specdecode.control.schedule_support import unsupported_reason
from specdecode.control.settings import PolicySettings
from specdecode.control.state import ControlState, PlainBaseline, PlainPoint, stored_batch, stored_point

ADOPT_GAIN = 0.03
"""A schedule must save at least 3 % of the time per token against the plain K, at the batches
the service runs, to be worth the restart that adopts it."""
ADOPT_MAX_LOSS = 0.02
"""... and lose no more than 2 % of predicted mean e2e latency at today's load and at a surge."""
SURGE = 1.3
"""The surge a schedule must not lose at: today's request rate times this."""
REPLACE_GAIN = 0.08
"""A running schedule is replaced only for a new one 8 % cheaper per token over the whole
batch range (a change of acceptance, not of load)."""
REVERT_MARGIN = 0.08
"""A schedule whose measured time per token is this much above the plain K it replaced
(measured before it, at the same batch), beyond what its canary measured, is reverted."""
CHECK_EVALUATIONS = 5
"""Evaluations after a schedule's first full window during which it may be reverted."""
BEHIND_MARGIN = 0.25
"""A schedule at its capacity that finishes this much fewer requests than the plain K it
replaced is predicted to serve is reverted, whenever it happens while the schedule is in
effect: the throughput collapse reported when concurrency crosses a schedule's threshold
shows only when the load first crosses it, which may be days after the rollout. Wider than
`REVERT_MARGIN`: at capacity the running batch is the engine's cap, further from what the
calibration measured. Both windows must show it, the long one at one load (`_steady`): a
backlog draining into the calm queues too, and finishes less than the capacity on average."""
PEAK_CARRY_MAX_LOSS = 0.05
"""A schedule adopted because it carries the load of the last day's peak that the plain K in
effect cannot may cost this much mean e2e latency at today's load: the premium for not
meeting the peak overloaded, where a restart out of the overload is locked out by its own
rollout (maxSurge 0) and every window of it is priced against that restart. The same bound
holds for the time per token at today's batch, which the after-rollout check measures: kept
under `REVERT_MARGIN` by the noise a window reads, so the premium predicted is not reverted
as a penalty."""
PEAK_WEIGHT = 0.25
"""Share of the time the window's peak batch stands for in the proposal (the rest: the mean)."""
OVERHEAD_BOUNDS = (0.0, 0.05)
"""Clamp of the calibrated per-step schedule overhead, seconds."""
KEPT_RULES = FLOOR_RULES | {Rule.BOUNDS, Rule.MODE_OFF, Rule.SCHEDULE, Rule.SCHEDULE_REVERT}
"""Rules that still change a config under a schedule: the floor and collapse (acceptance, the
user's hard rule) and the bounds. The others react to load, which the schedule follows."""
SETTLED_RULES = frozenset({Rule.HOLD, Rule.TUNE, Rule.HEDGE, Rule.PEAK_READINESS, Rule.PLAN})
"""Rules whose hold means "the plain K is right": a schedule may then be proposed."""
LOAD_RULES = frozenset({Rule.TUNE, Rule.HEDGE, Rule.PEAK_READINESS, Rule.PLAN})
"""Rules whose change follows the load: a schedule may be adopted instead."""
PAST_CAPACITY_RULES = frozenset({Rule.TUNE, Rule.PLAN, Rule.FAST_FALLBACK, Rule.SLO_GUARD})
"""The rules' moves to less drafting as the load rises: under a schedule they act only when
the service is past its capacity at a batch the schedule drafts more (`_past_capacity`)."""
BATCH_MEMORY_S = 6 * 3600.0
"""Time constant of the batch range memory: a load swing of a day's peak is remembered
through the hours until it comes back."""
STEADY_PEAK_RATIO = 4.0
"""A window whose peak running batch is more than this times its mean mixed loads (a surge's
onset, a backlog draining): its time per token is no baseline for one batch, nor a schedule's
measurement to check against one."""
GRID = tuple(2 ** i for i in range(11))
"""The whole batch range (1..1024, factor 2), equal weights: what a replacement is judged on."""


@dataclass(frozen=True)
class ScheduleUpdate:
    """What this evaluation adds to the state besides the decision."""

    note: str | None = None
    """status.speculation.scheduleReason."""
    overhead_s: float | None = None
    """A new calibration of the per-step schedule overhead (None: keep the stored one)."""
    rejected: str | None = None
    """A schedule reverted by this decision (its label)."""
    replaced_k: int | None = None
    """The plain K an adopted schedule replaces."""
    replaced_scale: float | None = None
    """That K's measured/prior step time."""
    batches: tuple[float, float] | None = None
    """(mean, peak) running batch of a replica in this evaluation's long window."""
    plain_point: PlainPoint | None = None
    """What the plain K measured on this evaluation's full window (None: a schedule runs, or
    nothing measurable)."""
    at: float = 0.0
    """When (for the batch memory's forgetting)."""
    on_trial: bool = False
    """A schedule's canary experiment ran into this evaluation (its note follows the trial)."""


def batch_memory(before: ControlState, batches: tuple[float, float], now: float) -> tuple[float, float]:
    """The batch range seen lately: a new low or peak at once, a return only gradually (each
    evaluation closes the gap to the present by elapsed / ``BATCH_MEMORY_S``)."""
    mean, peak = batches
    fraction = 1.0
    if before.observed_at is not None:
        fraction = min(1.0, max(0.0, now - before.observed_at) / BATCH_MEMORY_S)
    low = mean if before.batch_low is None else min(mean, before.batch_low + (mean - before.batch_low) * fraction)
    high = peak if before.batch_high is None else max(peak, before.batch_high + (peak - before.batch_high) * fraction)
    return low, high


def consider(
    settings: PolicySettings, state: ControlState, observed: Any, decision: Decision, now: float
) -> tuple[Decision, ScheduleUpdate]:
    """The rules' ``decision`` with schedules taken into account, and the schedule memory."""
    if not settings.schedules:
        return decision, ScheduleUpdate()
    if settings.schedules_unsupported:
        return decision, ScheduleUpdate(note=settings.schedules_unsupported)
    if settings.mode is AutotuneMode.OFF:
        return decision, ScheduleUpdate(note="autotune mode Off: no schedule is chosen")
    if settings.mode is AutotuneMode.RECOMMEND:
        if state.schedule is not None:
            # Left by Auto mode: Recommend acts on nothing, so it is neither checked nor reverted.
            return decision, ScheduleUpdate(note="autotune mode Recommend: the schedule in effect is kept, not checked")
        decision, update = _maybe_adopt(settings, state, observed, decision, now, advise=True)
    elif state.schedule is not None:
        decision, update = _under_schedule(settings, state, observed, decision, now)
    elif not state.enabled and decision.peak_probe_alpha is not None:
        decision, update = _reprobe_schedule(settings, state, observed, decision, now)
    else:
        decision, update = _maybe_adopt(settings, state, observed, decision, now)
    return decision, replace(update, batches=_batches_now(observed), plain_point=_plain_point(settings, state, observed, now),
                             at=now)


def _plain_point(settings: PolicySettings, state: ControlState, observed: Any, now: float) -> PlainPoint | None:
    """What the plain K running now measured on a full window of its own."""
    if state.schedule is not None or not state.enabled or not state.k or not _window_complete(settings, state, now):
        return None
    if not getattr(observed, "available", False) or observed.window is None:
        return None
    obs: Observation = observed.window
    if obs.idle or obs.requests < settings.min_requests or not _steady(obs):
        return None
    measured = _measured_per_token(obs)
    if measured is None:
        return None
    return PlainPoint(obs.batch_per_pod, measured, estimate(obs, settings.tuning).alpha)


def _steady(obs: Observation) -> bool:
    """The window ran at one load: its peak batch within ``STEADY_PEAK_RATIO`` of its mean."""
    mean = obs.batch_per_pod
    if mean is None or mean <= 0:
        return False
    return obs.peak_running is None or obs.peak_running <= STEADY_PEAK_RATIO * mean


def _band(batch: float) -> int:
    """The factor-2 band of a running batch (1, 2-3, 4-7, ...)."""
    return int(math.floor(math.log2(max(1.0, batch))))


def with_plain_point(baseline: PlainBaseline | None, k: int, point: PlainPoint) -> PlainBaseline:
    """``baseline`` of plain ``k`` with ``point`` as the latest of its band (a baseline of
    another K is dropped: it measured a different config)."""
    kept = () if baseline is None or baseline.k != k else baseline.points
    band = _band(point.batch)
    points = [p for p in kept if _band(p.batch) != band] + [point]
    return PlainBaseline(k=k, points=tuple(sorted(points, key=lambda p: p.batch)))


def _batches_now(observed: Any) -> tuple[float, float] | None:
    """(mean, peak) running batch of a replica on the long window (None: not measured)."""
    if not getattr(observed, "available", False) or observed.window is None:
        return None
    obs: Observation = observed.window
    mean = obs.batch_per_pod
    if mean is None or obs.idle:
        return None
    peak = obs.peak_running if obs.peak_running is not None else mean
    return mean, max(mean, peak)


def advance(after: ControlState, before: ControlState, decision: Decision, update: ScheduleUpdate) -> ControlState:
    """The schedule fields of the state after ``decision`` (`step.advance` did the rest)."""
    new = after
    if decision.applied and decision.changes:
        schedule = decision.schedule
        replaced_k, replaced_scale = update.replaced_k, update.replaced_scale
        if schedule is not None and before.schedule is None and replaced_k is None and after.experiments:
            # Promoted from a canary: it replaces the plain K it ran beside (or speculation
            # off, for a re-probe), calibrated by the step time measured there in the
            # experiment's windows.
            replaced_k = before.k if before.enabled and before.k is not None else OFF
            replaced_scale = after.experiments[-1].incumbent_step_scale
        new = replace(
            new,
            schedule=schedule,
            schedule_replaced_k=(replaced_k if schedule is not None and before.schedule is None
                                 else before.schedule_replaced_k if schedule is not None else None),
            schedule_step_scale=(replaced_scale if schedule is not None and before.schedule is None
                                 else before.schedule_step_scale if schedule is not None else None),
        )
    if update.overhead_s is not None:
        new = replace(new, schedule_overhead_s=update.overhead_s)
    if update.batches is not None:
        low, high = batch_memory(before, update.batches, update.at)
        new = replace(new, batch_low=stored_batch(low), batch_high=stored_batch(high))
    if update.rejected is not None:
        new = replace(new, rejected_schedules=new.rejected_schedules | {update.rejected})
    baseline = before.plain_baseline
    if update.plain_point is not None and before.k is not None:
        baseline = with_plain_point(baseline, before.k, stored_point(update.plain_point))
    # The baseline describes the plain K running, or the one the schedule in effect replaced
    # (a revert returns to it); a move to another config leaves it behind.
    owner = new.schedule_replaced_k if new.schedule is not None else (new.k if new.enabled else None)
    if baseline is not None and baseline.k != owner:
        baseline = None
    new = replace(new, plain_baseline=baseline)
    note = update.note
    trial = new.experiments[-1] if new.experiments else None
    if trial is not None and trial.candidate_schedule is not None and (update.on_trial or update.replaced_k is not None):
        # A schedule's canary experiment started, runs, or ended in this evaluation: say
        # where it stands (the note of the evaluation that chose it, or of the one before,
        # no longer does once the canary has answered).
        note = _trial_note(trial, before.k)
    elif update.replaced_k is not None and new.schedule is None:
        # The schedule chosen was not adopted: it waits (a loss lately, the collapse guard);
        # the decision's reason says which.
        note = f"not adopted yet: {decision.reason}"[:512]
    if note is None and new.schedule is not None:
        note = before.schedule_note if before.schedule is not None else None
    return replace(new, schedule_note=note)


def _trial_note(trial: Experiment, k: int | None) -> str:
    """Where a schedule's canary experiment stands, for status.speculation.scheduleReason."""
    assert trial.candidate_schedule is not None
    name = trial.candidate_schedule.label
    if trial.running:
        return f"on trial: {name} runs on a canary against K={k} ({trial.purpose.value} experiment)"
    outcome = trial.outcome
    verdict = outcome.verdict.value if outcome is not None else "ended"
    why = outcome.reason if outcome is not None else ""
    if outcome is not None and outcome.verdict is Verdict.PROMOTE:
        return f"promoted from its canary: {why}"[:512]
    return f"{name} ended {verdict} on its canary: {why}; plain K"[:512]


# --- no schedule yet ---------------------------------------------------------------------------


def _maybe_adopt(
    settings: PolicySettings, state: ControlState, observed: Any, decision: Decision, now: float,
    advise: bool = False,
) -> tuple[Decision, ScheduleUpdate]:
    """A schedule instead of the rules' decision, when one pays (module doc, 1). With
    ``advise`` (Recommend mode) the same choice is advice: not applied, and not held back by
    the cooldown or the change budget, which pace restarts that advice does not make."""
    if not state.enabled or state.k is None or not _window_complete(settings, state, now):
        return decision, ScheduleUpdate()
    trial = state.experiment
    if trial is not None:
        if trial.candidate_schedule is not None:
            return decision, ScheduleUpdate(on_trial=True)  # the note follows the trial (`advance`)
        return decision, ScheduleUpdate(note=f"a canary experiment ({trial.purpose.value}) runs: a "
                                             "schedule is judged against the plain K its verdict leaves")
    instead = decision.changes and (decision.applied or advise) and decision.rule in LOAD_RULES
    if decision.changes and not instead:
        return decision, ScheduleUpdate()
    if instead and decision.rule not in CANARIED_RULES and _canaried(settings):
        # A schedule is measured on a canary first, and the canary borrows a replica: a move
        # the rules make at once (a hedge against rising load) is not delayed for one.
        return decision, ScheduleUpdate()
    if not decision.changes:
        if decision.rule not in SETTLED_RULES or (not advise and not _restart_allowed(settings, state, now)):
            return decision, ScheduleUpdate()
    model = _model(settings, state, observed)
    if model is None:
        return decision, ScheduleUpdate()
    params, est, acceptance, batches = model
    context = est.prompt_tokens + est.output_tokens / 2.0
    prefill = _prefill(est, params)
    target = decision.config if instead else state.k
    ks = _family(settings, state)
    peak = None if instead else _peak_to_carry(settings, state, params, est, ks)
    if peak is not None:
        # The peak's batch joins those seen: the top range is chosen for the load coming back.
        batches = [*batches, (peak.batch, PEAK_WEIGHT)]
    candidates = []
    for family in (ks, tuple(sorted({target, state.k}))):
        if not any(k > 0 for k in family):
            continue
        try:
            proposal = perfmodel.propose_schedule(
                params, acceptance, batches, context, family,
                prompt_tokens=est.prompt_tokens, output_tokens=est.output_tokens,
            )
        except perfmodel.ScheduleError:
            continue
        name = proposal.schedule.label
        if (len(proposal.schedule.bands) >= 2 and name not in state.rejected_schedules
                and all(c.schedule.label != name for c in candidates)):
            candidates.append(proposal)
    if not candidates:
        return decision, ScheduleUpdate(note="no schedule pays: one K fits every batch seen")
    low = min(b for b, _ in batches)
    # Every check must hold at today's acceptance and at its recent low (the proposal's):
    # a schedule that only pays while acceptance is low (a burst of hard text) is not one to
    # restart for, nor one that only pays while it is high.
    measured_positions = _positions(est.alpha, params.acceptance_decay, settings.max_k)
    futures = (acceptance, measured_positions)
    alphas = (acceptance[0], est.alpha)

    def worst_loss(config: perfmodel.Config, reference: int, at: Sequence[tuple[float, float]]) -> float:
        out = -math.inf
        for positions in futures:
            ref = _per_token(params, reference, at, context, positions, prefill)
            cost = _per_token(params, config, at, context, positions, prefill)
            out = max(out, cost / ref - 1.0 if ref > 0 else math.inf)
        return out

    def worst_e2e(schedule: Schedule, reference: int, *factors: float) -> float | None:
        losses = [_e2e_loss(params, est, schedule, reference, *factors, alpha=a) for a in alphas]
        return None if any(x is None for x in losses) else max(losses)

    rate = observed.highest_request_rate(settings)
    notes = []
    for proposal in candidates:
        schedule = proposal.schedule
        shut = _shuts_way_out(settings, state, params, est, schedule, min(ks), rate)
        if shut is not None:
            notes.append(f"{schedule.label}: {shut}")
            continue
        lost = backing_off(settings, state, schedule, now)
        if lost is not None:
            notes.append(f"{schedule.label}: {lost}")
            continue
        overload = None if instead else _overloading_restart(settings, params, est, schedule, state.k, rate)
        if overload is not None:
            notes.append(f"{schedule.label}: {overload}")
            continue
        if instead:
            loss = worst_e2e(schedule, target)
            low_loss = worst_loss(schedule, state.k, [(low, 1.0)])
            if loss is None or loss > ADOPT_MAX_LOSS or low_loss > ADOPT_MAX_LOSS:
                notes.append(f"{schedule.label}: {_pct(loss)} e2e against {label(target)} now, "
                             f"{_pct(low_loss)} per token against K={state.k} at batch {low:.0f}")
                continue
            short = _peak_shortfall(state, params, est, acceptance[0], schedule, state.k)
            if short is not None:
                notes.append(f"{schedule.label}: {short}")
                continue
            reason = (
                f"instead of {label(target)} ({decision.rule.value}: {decision.reason})"[:400]
                + f"; per-batch-size schedule {schedule.label} is predicted within "
                f"{ADOPT_MAX_LOSS:.0%} of it now ({_pct(loss)} e2e) and of K={state.k} at batch "
                f"{low:.0f} ({_pct(low_loss)} per token): the same restart now, none when the load returns"
            )
        elif peak is not None:
            loss = worst_e2e(schedule, state.k)
            token_loss = worst_loss(schedule, state.k, [(est.batch_per_replica, 1.0)])
            at_peak = _peak_workload(est, acceptance[0], peak.rate)
            capacity = perfmodel.steady_state(params, at_peak, schedule).capacity_rps
            if (capacity < peak.rate or loss is None
                    or max(loss, token_loss) > PEAK_CARRY_MAX_LOSS):
                notes.append(f"{schedule.label}: carries {capacity:.1f} req/s of the {peak.rate:.1f} that "
                             f"K={state.k} cannot, {_pct(loss)} e2e and {_pct(token_loss)} per token now "
                             f"(at most {PEAK_CARRY_MAX_LOSS:.0%})")
                continue
            reason = (
                f"per-batch-size schedule {schedule.label}: the load reached {peak.rate:.1f} req/s within the "
                f"last day and K={state.k} carries {peak.plain_capacity_rps:.1f}; the schedule carries "
                f"{capacity:.1f} (crossovers {_crossovers(proposal)}) at {_pct(loss)} e2e and "
                f"{_pct(token_loss)} per token now: should the peak come back, it meets no overload and "
                "needs no restart"
            )
        else:
            gain = -worst_loss(schedule, state.k, batches)
            loss = worst_e2e(schedule, state.k, SURGE)
            if gain < ADOPT_GAIN or loss is None or loss > ADOPT_MAX_LOSS:
                notes.append(f"{schedule.label}: {gain:.1%} per token saved against K={state.k} "
                             f"(needs {ADOPT_GAIN:.0%}), {_pct(loss)} e2e")
                continue
            short = _peak_shortfall(state, params, est, acceptance[0], schedule, state.k)
            if short is not None:
                notes.append(f"{schedule.label}: saves {gain:.1%} per token against K={state.k} but {short}")
                continue
            reason = (
                f"per-batch-size schedule {schedule.label} saves {gain:.1%} per token against "
                f"K={state.k} at the batches seen ({_batches_text(batches)}); crossovers "
                f"{_crossovers(proposal)}; load swings then need no restart"
            )
        # What its canary can check: the model's word at the load it runs (`experiments.judge`),
        # at the acceptance measured now.
        here = [(est.batch_per_replica, 1.0)]
        predicted = (_per_token(params, schedule, here, context, measured_positions, prefill)
                     / _per_token(params, state.k, here, context, measured_positions, prefill) - 1.0)
        replaced_scale = _clamped_scale(settings, state.k, est)
        adopted = replace(
            decision, action=Action.SET_K, enabled=True, k=schedule.max_k, reason=reason[:1024],
            rule=Rule.SCHEDULE, applied=not advise, held=None, wanted=None, schedule=schedule,
            step_scale=replaced_scale, predicted_effect=stored(predicted),
        )
        if advise:
            return adopted, ScheduleUpdate(note=f"recommended from batches {_batches_text(batches)} (Recommend mode)")
        return adopted, ScheduleUpdate(
            note=f"chosen from batches {_batches_text(batches)}",
            replaced_k=state.k, replaced_scale=replaced_scale,
        )
    return decision, ScheduleUpdate(note=("plain K: " + "; ".join(notes))[:512])


@dataclass(frozen=True)
class PeakToCarry:
    """The load of the last day's peak, which the plain K in effect cannot carry."""

    rate: float
    """Request rate (`ControlState.recent_peak_rate`)."""
    batch: float
    """Running batch of a replica of the most capacious config of the family at that rate
    (its batch cap if even that one is overloaded)."""
    plain_capacity_rps: float
    """What the plain K in effect carries (at today's acceptance)."""


def _peak_to_carry(
    settings: PolicySettings, state: ControlState, params: EngineParams, est: Estimate, ks: Sequence[int],
) -> PeakToCarry | None:
    """The peak of the last day (`memory.recent_peak`) when the plain K in effect would be
    overloaded by it and a config of the family ``ks`` carries more, else None. A plain K
    chosen at the calm (a re-probe, a tuning move) can carry less than the peak that comes
    back daily; with maxSurge 0 its restart to a config that carries it would then overload
    the replicas left serving, and the service rides the peak overloaded (traced: a re-probe
    at night chose K=1, and the next day's peak of 37 req/s met it at batches of 450-690 while
    speculation off carried it). A schedule whose top range is that config follows the peak
    with no restart."""
    peak = state.recent_peak_rate
    if peak is None or state.k is None or est.request_rate <= 0 or peak <= est.request_rate:
        return None
    workload = _peak_workload(est, est.alpha, peak)
    plain = perfmodel.steady_state(params, workload, state.k)
    if not plain.saturated:
        return None
    others = [perfmodel.steady_state(params, workload, k) for k in ks if k != state.k]
    widest = max(others, key=lambda s: s.capacity_rps, default=None)
    if widest is None or widest.capacity_rps <= plain.capacity_rps:
        return None
    if overloading_rollout(_one_model(params), est, (state.k, widest.k), settings, peak) is None:
        return None  # maxSurge >= 1: at the peak the rules' own restart carries the load
    return PeakToCarry(rate=peak, batch=widest.batch, plain_capacity_rps=plain.capacity_rps)


def _peak_workload(est: Estimate, alpha: float | None, peak: float) -> perfmodel.Workload:
    """Today's workload at acceptance ``alpha`` with the request rate of the last day's ``peak``."""
    return workload_of(est, alpha, peak / est.request_rate)


def _peak_shortfall(
    state: ControlState, params: EngineParams, est: Estimate, alpha: float | None,
    new: perfmodel.Config, old: perfmodel.Config,
) -> str | None:
    """Why ``new`` would carry less of the last day's peak than ``old`` does (None: as much,
    all of it, or no peak above today's load). Where the peak overloads ``old`` already, the
    queue it builds grows with every request a second less carries: a schedule's own cost
    (0.2 % of capacity there) cost a peak on the H200's measured steps 70 % of its e2e."""
    peak = state.recent_peak_rate
    if peak is None or peak <= est.request_rate:
        return None
    at_peak = _peak_workload(est, alpha, peak)
    carried = perfmodel.steady_state(params, at_peak, old).capacity_rps
    capacity = perfmodel.steady_state(params, at_peak, new).capacity_rps
    if capacity >= min(peak, carried):
        return None
    return (f"carries {capacity:.1f} req/s of the {peak:.1f} the load reached within the last day, "
            f"{perfmodel.config_label(old)} {carried:.1f}")


def _family(settings: PolicySettings, state: ControlState) -> tuple[int, ...]:
    """The configs a schedule may map batches to: off (when allowed) and every K not excluded
    for failing to start."""
    return tuple(k for k in settings.configs() if k == OFF or k not in state.excluded_ks)


def _reprobe_schedule(
    settings: PolicySettings, state: ControlState, observed: Any, decision: Decision, now: float,
) -> tuple[Decision, ScheduleUpdate]:
    """A re-probe with a schedule where the rules found no plain K that pays and carries the
    load of the last day's peak (`Decision.peak_probe_alpha`): the schedule drafts at the
    calm's batches and stops drafting at the peak's, so it carries the peak, and the calm gets
    the draft's speed back without waiting for the peak's memory to fade (traced: after a
    day's only peak `diurnal-load` stayed off through the calm to its end). The rules'
    re-probe acceptance (remembered, less the probe's discount), the calibrated step time of
    speculation off; the same pacing (the cooldown, the change budget, a restart the replicas
    left serving carry); a canary first where experiments run (purpose Reprobe), and after
    the rollout the schedule's checks with speculation off as the config it replaced."""
    if not getattr(observed, "available", False) or observed.window is None or not settings.allow_disable:
        return decision, ScheduleUpdate()
    obs: Observation = observed.window
    peak, alpha = state.recent_peak_rate, decision.peak_probe_alpha
    if obs.idle or obs.requests < settings.min_requests or peak is None or alpha is None:
        return decision, ScheduleUpdate()
    est = estimate(obs, settings.tuning)
    scale = _clamped_scale(settings, OFF, est)
    if scale is None or est.batch_per_replica is None or est.request_rate <= 0 or peak <= est.request_rate:
        return decision, ScheduleUpdate()
    params = _calibrated(settings, state, scale, None)
    at_peak = _peak_workload(est, alpha, peak)
    now_load = workload_of(est, alpha)
    ks = _family(settings, state)
    off_at_peak = perfmodel.steady_state(params, at_peak, OFF)
    positions = _positions(alpha, params.acceptance_decay, settings.max_k)
    context = est.prompt_tokens + est.output_tokens / 2.0
    try:
        proposal = perfmodel.propose_schedule(
            params, positions, [(est.batch_per_replica, 0.5), (off_at_peak.batch, 0.5)], context, ks,
            prompt_tokens=est.prompt_tokens, output_tokens=est.output_tokens,
        )
    except perfmodel.ScheduleError:
        return decision, ScheduleUpdate()
    schedule = proposal.schedule
    if len(schedule.bands) < 2 or schedule.label in state.rejected_schedules:
        return decision, ScheduleUpdate(note="no schedule re-probes: none drafts at the calm and not at the peak")
    carries = perfmodel.steady_state(params, at_peak, schedule).capacity_rps
    off, scheduled = perfmodel.steady_state(params, now_load, OFF), perfmodel.steady_state(params, now_load, schedule)
    gain = off.e2e_s / scheduled.e2e_s - 1.0 if not scheduled.saturated and not off.saturated else -math.inf
    why = backing_off(settings, state, schedule, now)
    if why is None and carries < peak:
        why = f"it carries {carries:.1f} req/s, short of the peak's {peak:.1f}"
    if why is None and gain < settings.tuning.min_gain:
        why = f"{gain:+.1%} e2e against off at {est.request_rate:.2f} req/s (needs {settings.tuning.min_gain:.0%})"
    if why is None:
        why = _overloading_restart(settings, params, est, schedule, OFF, observed.highest_request_rate(settings))
    if why is None and not _restart_allowed(settings, state, now):
        why = "the cooldown or the change budget holds restarts"
    if why is not None:
        return decision, ScheduleUpdate(note=f"off: no re-probe with {schedule.label}: {why}"[:512])
    here = [(est.batch_per_replica, 1.0)]
    predicted = (_per_token(params, schedule, here, context, positions)
                 / _per_token(params, OFF, here, context, positions) - 1.0)
    reason = (
        f"re-probe with per-batch-size schedule {schedule.label} (crossovers {_crossovers(proposal)}): at alpha "
        f"{alpha:.2f} predicted {gain:+.1%} e2e against off at {est.request_rate:.2f} req/s, and it carries "
        f"{carries:.1f} req/s of the last day's peak of {peak:.1f}, drafting nothing at its batch; no plain K "
        f"would do: {decision.reason}"
    )
    return replace(
        decision, action=Action.ENABLE, enabled=True, k=schedule.max_k, reason=reason[:1024], rule=Rule.REPROBE,
        applied=True, held=None, wanted=None, schedule=schedule, step_scale=scale, predicted_effect=stored(predicted),
    ), ScheduleUpdate(note=f"re-probed from off, carrying the peak of {peak:.1f} req/s", replaced_k=OFF,
                      replaced_scale=scale)


def _shuts_way_out(
    settings: PolicySettings, state: ControlState, params: EngineParams, est: Estimate,
    schedule: Schedule, exit_config: int, rate: float,
) -> str | None:
    """Why adopting ``schedule`` would shut the acceptance floor's way out, or None: the rule
    the tuning rule keeps for a longer plain K (`rules._exit_closed`). With maxSurge 0 the
    floor waits while a rollout would overload the replicas left serving. A schedule whose
    top range is off carries about speculation off's load at any acceptance (the engine stops
    drafting as the batch grows), so it leaves the way out open; one that drafts in its top
    range carries, at the floor, about what that range's K does. It may not carry less there
    than the plain K it replaces, where the rollout out of it at the floor would load the
    replicas left serving past `restart_max_rollout_load`."""
    if state.k is None:
        return None
    floor = settings.acceptance_floor
    calibration = _one_model(params)
    under = rollout_capacity_of(calibration, est, (schedule,), settings, floor)
    if under is None or under >= rollout_capacity_of(calibration, est, (state.k,), settings, floor):
        return None
    capacity = overloading_rollout(calibration, est, (schedule, exit_config), settings, rate, floor)
    return None if capacity is None else shut_way_out(rate, capacity, floor, exit_config)


def _one_model(params: EngineParams) -> Calibration:
    """The schedule path's one calibrated model as the hedge's checks take it."""
    return Calibration(off=params, on=params, scale_now=None)


def _overloading_restart(
    settings: PolicySettings, params: EngineParams, est: Estimate, schedule: Schedule, k: perfmodel.Config,
    rate: float,
) -> str | None:
    """Why adopting ``schedule`` over plain ``k`` at ``rate`` would overload the replicas left
    serving (None: it would not, or maxSurge >= 1): a rollout, or a canary's start borrowing
    a replica, takes one down for minutes. The rules price that restart into a move of K
    (the price, `rules`); a schedule adopted while K holds is not priced by them, so it
    waits for a load the replicas left serving carry (`restart_max_rollout_load`)."""
    capacity = overloading_rollout(_one_model(params), est, (k, schedule), settings, rate)
    if capacity is None:
        return None
    return (f"its restart would load the replicas left serving to {rate / capacity:.0%} of the {capacity:.1f} "
            "req/s they carry: waiting for a lower load")


def _canaried(settings: PolicySettings) -> bool:
    """A schedule the operator adopts runs on a canary first (`control.canary`): Auto mode,
    experiments on and their plan able to run."""
    policy = settings.experiments
    return settings.mode is AutotuneMode.AUTO and policy is not None and policy.runs


def _restart_allowed(settings: PolicySettings, state: ControlState, now: float) -> bool:
    """The cooldown and the change budget (less the slot kept for fallbacks) allow a restart."""
    memory = remember(state.history, state, now)
    if memory.last_change_at is not None and now < memory.last_change_at + settings.cooldown_s:
        return False
    budget = settings.max_changes_per_hour
    if budget > 1:
        budget -= settings.tuning.reserved_guard_changes
    return memory.changes_last_hour < budget


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:+.1%}"


def _batches_text(batches: Sequence[tuple[float, float]]) -> str:
    return ", ".join(f"{b:.0f}" for b in sorted({round(b) for b, _ in batches}))


# --- a schedule in effect ------------------------------------------------------------------------


def _under_schedule(
    settings: PolicySettings, state: ControlState, observed: Any, decision: Decision, now: float
) -> tuple[Decision, ScheduleUpdate]:
    schedule = state.schedule
    assert schedule is not None
    if decision.changes and decision.rule in KEPT_RULES:
        return decision, ScheduleUpdate(note=f"left for plain K: {decision.rule.value}")
    past = None
    if decision.changes and decision.rule in PAST_CAPACITY_RULES:
        past = _past_capacity(settings, observed, schedule, decision.config)
    if past is not None:
        return replace(
            decision,
            reason=(f"schedule {schedule.label} is past its capacity ({past}): it does not follow this "
                    f"load, and {decision.rule.value} leaves it ({decision.reason}); not chosen again "
                    f"for this spec")[:1024],
        ), ScheduleUpdate(note=f"left past its capacity: {past}"[:512], rejected=schedule.label)
    if decision.changes:
        decision = replace(
            decision, action=Action.HOLD, enabled=True, k=state.k, applied=False,
            held=Held.SETTLED, wanted=decision.rule, schedule=None,
            reason=(f"schedule {schedule.label} in effect: it follows the load inside the engine; "
                    f"{decision.rule.value} would restart the pods ({decision.reason})")[:1024],
        )
    if not _window_complete(settings, state, now):
        return decision, ScheduleUpdate()
    ignored = _table_ignored(schedule, observed.window)
    if ignored is not None:
        plain_k = _replaced_config(state)
        reason = (f"schedule {schedule.label} {ignored}: the engine ignores the table (vLLM's Model Runner V2 "
                  f"does, vllm#51510); reverted to {label(plain_k)} and not chosen again for this spec")
        return _revert(decision, schedule, plain_k, reason), ScheduleUpdate(
            note=f"reverted: the engine ignores the table ({ignored})"[:512], rejected=schedule.label,
        )
    behind = _behind(settings, state, observed, decision)
    if behind is not None:
        return behind
    model = _model(settings, state, observed, scale=state.schedule_step_scale)
    if model is None:
        return decision, ScheduleUpdate()
    params, est, acceptance, batches = model
    obs: Observation = observed.window
    measured = _measured_per_token(obs)
    if measured is None:
        return decision, ScheduleUpdate()
    plain_k = _replaced_config(state)
    workload = workload_of(est, est.alpha)
    baseline = plain_baseline_at(state.plain_baseline, plain_k, params, est, obs.batch_per_pod)
    if baseline is not None:
        best, basis = baseline
    else:
        # Nothing measured before the rollout (a status from an older operator): the plain K
        # at today's load, at the batch it would run there (Little's law), predicted with the
        # step scale measured when the schedule was adopted.
        steady = perfmodel.steady_state(params, workload, plain_k)
        best = math.inf if steady.saturated else steady.step_time_s / steady.tokens_per_step
        basis = f"predicted at that load ({best * 1e3:.2f} ms)"
    best_k = plain_k
    # The per-step overhead: what the schedule measured beyond the model's schedule without
    # a schedule cost, per step at its tokens per step.
    bare = perfmodel.steady_state(replace(params, schedule_overhead_s=0.0), workload, schedule)
    overhead = None
    if not bare.saturated:
        extra = (measured - bare.step_time_s / bare.tokens_per_step) * bare.tokens_per_step
        overhead = min(OVERHEAD_BOUNDS[1], max(OVERHEAD_BOUNDS[0], extra))
    accepted = _canary_cost(state)
    bar = (1.0 + accepted) * (1.0 + REVERT_MARGIN)
    if _checking(settings, state, now) and _steady(obs) and math.isfinite(best) and measured > best * bar:
        over = measured / best - 1.0
        beyond = f", beyond the {accepted:.1%} its canary measured" if accepted > 0 else ""
        reason = (
            f"schedule {schedule.label} measured {measured * 1e3:.2f} ms per token at "
            f"{est.request_rate:.1f} req/s{_tpot_text(obs)}, {over:.0%} above {label(best_k)} {basis}{beyond}; calibrated "
            f"schedule overhead {0.0 if overhead is None else overhead * 1e3:.2f} ms per step: reverted to "
            f"{label(plain_k)} and not chosen again for this spec"
        )
        return _revert(decision, schedule, plain_k, reason), ScheduleUpdate(
            note=f"reverted: {over:.0%} slower per token than {label(best_k)}",
            overhead_s=overhead, rejected=schedule.label,
        )
    replacement = _replacement(settings, state, params, est, acceptance, batches,
                               overhead if overhead is not None else params.schedule_overhead_s, now,
                               observed.highest_request_rate(settings))
    if replacement is not None and not decision.changes:
        new, saving = replacement
        reason = (
            f"acceptance changed: schedule {new.label} is {saving:.0%} cheaper per token than "
            f"{schedule.label} over batches 1-1024"
        )
        return replace(
            decision, action=Action.SET_K, enabled=True, k=new.max_k, reason=reason,
            rule=Rule.SCHEDULE, applied=True, held=None, wanted=None, schedule=new, step_scale=None,
        ), ScheduleUpdate(overhead_s=overhead, note=f"replaced: acceptance changed ({saving:.0%})")
    return decision, ScheduleUpdate(overhead_s=overhead)


IGNORED_MIN_DRAFTS = 1000.0
"""Drafts a window needs before their length can say the table is ignored."""
IGNORED_FULL = 0.9
"""Drafted tokens per request-step at this share of the table's largest K read as every step
drafting it (n-gram proposes nothing on some steps; prefill steps draft nothing)."""
IGNORED_SHORTER_BY = 1.0
"""An ignored table: the requests draft the table's largest K on every step while its ranges,
at the window's batch, would have drafted at least this many tokens fewer per request-step
(or a quarter of the largest K, if more: the margin above the honoured table's own drafts
must exceed what the batch's spread can add)."""


def _table_ignored(schedule: Schedule, obs: Observation) -> str | None:
    """What shows that the engine runs ``schedule``'s largest K at every batch (vllm#51510):
    every request drafts a full-length draft on (nearly) every step (drafted tokens per
    request-step, ``draft_tokens / steps``, at `IGNORED_FULL` of the largest K) in a window whose batch sits
    where the table's ranges draft at least `IGNORED_SHORTER_BY` fewer
    (`perfmodel.mean_drafted_tokens`). None while the batch stays where the table drafts its
    largest K: there an ignored table costs nothing and cannot be told apart."""
    spec, batch = obs.speculation, obs.batch_per_pod
    if spec is None or batch is None or obs.steps <= 0 or spec.drafts < IGNORED_MIN_DRAFTS:
        return None
    drafted = spec.draft_tokens / obs.steps
    expected = perfmodel.mean_drafted_tokens(schedule, batch)
    shorter = max(IGNORED_SHORTER_BY, 0.25 * schedule.max_k)
    if drafted >= IGNORED_FULL * schedule.max_k and expected <= schedule.max_k - shorter:
        return (f"drafted {drafted:.1f} tokens a request a step at a running batch of {batch:.0f}, where its "
                f"ranges draft {expected:.1f}")
    return None


def _canary_cost(state: ControlState) -> float:
    """How much slower per token the schedule in effect measured on its canary, paired with the
    plain K on the same traffic, before its promotion (0: no canary promoted it, or it was not
    slower). The promotion accepted that cost at the calm for the loads the schedule is for;
    the check after the rollout reverts what lies clearly beyond it. Without it, one window of
    a schedule its canary measured 3 to 4 % slower read some 9 % against a baseline from
    another hour, and the check reverted it: two restarts for the noise of one window. The
    promotion need not be the last experiment: a Calibrate may run under the schedule."""
    promotion = promotion_in_effect(state)
    outcome = promotion.outcome if promotion is not None else None
    return max(0.0, outcome.effect) if outcome is not None and outcome.effect is not None else 0.0


def _behind(
    settings: PolicySettings, state: ControlState, observed: Any, decision: Decision
) -> tuple[Decision, ScheduleUpdate] | None:
    """The revert of a schedule that fell behind a load the plain K it replaced serves
    (`_plain_serves`: by what it measured, else as predicted; None: it did not, or too little
    is known to say). Needs no acceptance counts of the window: past a collapsing range's
    threshold the engine may draft nothing at all; for a prediction the acceptance last
    measured stands in (the lower of it and the recent low: the lower the acceptance, the less
    the plain K is predicted to serve, the later the revert)."""
    if not getattr(observed, "available", False) or state.schedule_step_scale is None:
        return None
    obs: Observation | None = observed.window
    guard: Observation | None = observed.guard
    # A backlog draining (a surge's, or the rollout's own) also queues, and a window mixing
    # its drain with the calm after it finishes fewer requests than the capacity: the window
    # must have run at one load, and the guard window (its last minutes) must queue too.
    # Checked first: most windows have no queue, and then nothing below is computed.
    if obs is None or guard is None or obs.requests < settings.min_requests:
        return None
    if not (obs.queued and guard.queued and _steady(obs)):
        return None
    est = estimate(obs, settings.tuning)
    alphas = [a for a in (est.alpha if est.alpha is not None else state.last_alpha, state.recent_low_alpha)
              if a is not None]
    if not alphas:
        return None
    params = _calibrated(settings, state, state.schedule_step_scale, est.decay)
    plain_k = _replaced_config(state)
    plain_serves, basis = _plain_serves(state, params, est, obs, plain_k, min(alphas))
    finished = _finished_short(obs, plain_serves)
    if finished is None or _finished_short(guard, plain_serves) is None:
        return None
    behind = 1.0 - finished / plain_serves
    reason = (
        f"schedule {state.schedule.label} fell behind its load: {finished:.2f} req/s per replica finished "
        f"with {obs.waiting / obs.pods:.1f} requests waiting per replica{_tpot_text(obs)}, {behind:.0%} under "
        f"the {plain_serves:.2f} req/s {label(plain_k)} {basis}: reverted to {label(plain_k)} "
        f"and not chosen again for this spec"
    )
    return _revert(decision, state.schedule, plain_k, reason), ScheduleUpdate(
        note=f"reverted: fell {behind:.0%} behind {label(plain_k)}'s capacity", rejected=state.schedule.label,
    )


def _plain_serves(
    state: ControlState, params: EngineParams, est: Estimate, obs: Observation, plain_k: int, alpha: float,
) -> tuple[float, str]:
    """Requests a second one replica of ``plain_k`` serves at the window's running batch, and
    the words for where that figure comes from. What that K measured before the schedule
    (`plain_baseline_at`, as the after-rollout check reads it: a replica at batch b finishes
    b / (time per token x output tokens)); the model's capacity at acceptance ``alpha`` only
    when nothing was measured. The model's step scale is measured at the calm, and on a GPU
    whose steps grow faster with the batch than the prior's (traced on an L40S-class one) it
    puts the plain K's capacity at the peak a third above what it serves: a schedule that
    carried the peak better than the plain K was reverted there, by a restart into it."""
    # The window may have drafted nothing (past a collapsing range's threshold): the curve
    # that moves the measurement to this batch takes the stand-in acceptance then.
    at = est if est.alpha is not None else replace(est, alpha=alpha)
    measured = plain_baseline_at(state.plain_baseline, plain_k, params, at, obs.batch_per_pod)
    if measured is not None and measured[0] > 0 and est.output_tokens > 0:
        per_token, basis = measured
        return obs.batch_per_pod / (per_token * est.output_tokens), f"serves at this batch by what it {basis}"
    return (perfmodel.capacity(params, workload_of(est, alpha), plain_k) / max(1, params.replicas),
            "is predicted to serve")


def _past_capacity(
    settings: PolicySettings, observed: Any, schedule: Schedule, target: perfmodel.Config
) -> str | None:
    """What shows the replicas past their capacity while ``schedule`` drafts more at their
    batch than ``target`` would (`Observation.past_capacity` on the long window and the guard
    window, both with a queue), for a reason; None when they are not, when the windows cannot
    say, or when the schedule drafts no more than the target there (a restart would add no
    capacity)."""
    if not getattr(observed, "available", False):
        return None
    windows = (observed.window, observed.guard)
    if any(obs is None or not obs.past_capacity(settings.tuning.past_capacity_margin) for obs in windows):
        return None
    batch = observed.window.batch_per_pod
    if batch is None or schedule.k_at(batch) <= perfmodel.config_max_k(target):
        return None
    obs = observed.window
    return (f"{obs.arrival_rate:.1f} req/s arrive and {obs.request_rate:.1f} finish, "
            f"{obs.waiting / obs.pods:.0f} requests waiting per replica")


def _finished_short(obs: Observation, plain_serves: float) -> float | None:
    """Requests finished per second per replica when ``BEHIND_MARGIN`` short of
    ``plain_serves`` (plain K's predicted capacity per replica), else None. Per replica, so a
    pod down is not taken for a slower engine."""
    finished = obs.request_rate / obs.pods
    if not math.isfinite(plain_serves) or plain_serves <= 0 or finished >= (1.0 - BEHIND_MARGIN) * plain_serves:
        return None
    return finished


def _revert(decision: Decision, schedule: Schedule, plain_k: int, reason: str) -> Decision:
    """Back from ``schedule`` to the plain K it replaced, or to speculation off for one a
    re-probe chose (the caller rejects the schedule)."""
    return replace(
        decision, action=Action.SET_K if plain_k != OFF else Action.DISABLE, enabled=plain_k != OFF,
        k=plain_k if plain_k != OFF else None, reason=reason, rule=Rule.SCHEDULE_REVERT,
        applied=True, held=None, wanted=None, schedule=None, step_scale=None,
    )


def _replaced_config(state: ControlState) -> int:
    """What the schedule in effect replaced, which a revert returns to: a plain K, or OFF for
    one a re-probe chose; its largest K when a status from an older operator did not say."""
    assert state.schedule is not None
    return state.schedule.max_k if state.schedule_replaced_k is None else state.schedule_replaced_k


def _tpot_text(obs: Observation) -> str:
    return "" if obs.tpot_mean_s is None else f", mean TPOT {obs.tpot_mean_s * 1e3:.1f} ms"


def plain_baseline_at(
    baseline: PlainBaseline | None, k: int, params: EngineParams, est: Estimate, batch: float | None,
) -> tuple[float, str] | None:
    """Seconds per output token of plain ``k`` at running ``batch`` and the estimate's
    acceptance, from what it measured before the rollout: the measurement at the nearest
    batch, moved along the calibrated model's curve of that K from its batch and acceptance to
    these (a ratio: the model's scale cancels, only its shape counts, and not at all at the
    same batch and acceptance). None: nothing of that K measured.

    The acceptance matters as much as the batch: a window's acceptance wanders by a few
    hundredths, and K=3's tokens per step by some 6 % with it (0.78 against 0.82), as much as
    a schedule's overhead; uncorrected, that noise reverted a schedule measured 4 % slower on
    its canary for 9 % against a baseline from a window of higher acceptance."""
    if baseline is None or baseline.k != k or not baseline.points or batch is None or batch <= 0:
        return None
    point = min(baseline.points, key=lambda p: abs(math.log(p.batch / batch)))
    context = est.prompt_tokens + est.output_tokens / 2.0
    now_positions = _positions(est.alpha, params.acceptance_decay, max(1, k))
    then_alpha = point.acceptance if point.acceptance is not None else est.alpha
    then_positions = _positions(then_alpha, params.acceptance_decay, max(1, k))
    # Prompt tokens chunked into a step grow with the batch at the same request shape: both
    # are the request rate times the step time (the batch up to the tokens per step).
    prefill_per_running = _prefill(est, params) / batch

    def curve(b: float, positions: tuple[float, ...]) -> float:
        return _per_token(params, k, [(b, 1.0)], context, positions, prefill_per_running * b)

    moved = point.seconds_per_token * curve(batch, now_positions) / curve(point.batch, then_positions)
    then = f" and acceptance {point.acceptance:.2f}" if point.acceptance is not None else ""
    now = f" and acceptance {est.alpha:.2f}" if point.acceptance is not None else ""
    basis = (f"measured before the schedule ({point.seconds_per_token * 1e3:.2f} ms per token at batch "
             f"{point.batch:.0f}{then}, {moved * 1e3:.2f} ms at this batch {batch:.0f}{now})")
    return moved, basis


def _replacement(
    settings: PolicySettings, state: ControlState, params: EngineParams, est: Estimate,
    acceptance: Sequence[float], batches: Sequence[tuple[float, float]], overhead: float, now: float,
    rate: float,
) -> tuple[Schedule, float] | None:
    """A new schedule when the acceptance regime changed enough, judged on the whole batch
    range with equal weights (the same whatever the load). Like an adoption, its restart (or
    its canary's borrowed replica) waits for a load the replicas left serving carry at
    ``rate``, and it may not carry less of the last day's peak than the schedule it replaces:
    traced, a replacement drafting at every batch started its canary as the second peak rose,
    and the schedule it was to replace, which stops drafting there, fell behind the peak on
    the replica left to it."""
    schedule = state.schedule
    assert schedule is not None
    if est.draft_tokens < settings.min_drafts:
        return None
    memory = remember(state.history, state, now)
    if memory.last_change_at is not None and now < memory.last_change_at + settings.cooldown_s:
        return None
    params = replace(params, schedule_overhead_s=overhead)
    context = est.prompt_tokens + est.output_tokens / 2.0
    ks = _family(settings, state)
    try:
        proposal = perfmodel.propose_schedule(
            params, acceptance, batches, context, ks,
            prompt_tokens=est.prompt_tokens, output_tokens=est.output_tokens,
        )
    except perfmodel.ScheduleError:
        return None
    new = proposal.schedule
    if len(new.bands) < 2 or new.label == schedule.label or new.label in state.rejected_schedules:
        return None
    if _overloading_restart(settings, params, est, new, schedule, rate) is not None:
        return None
    if _peak_shortfall(state, params, est, acceptance[0], new, schedule) is not None:
        return None
    grid = [(float(b), 1.0) for b in GRID if b <= params.max_num_seqs]
    old_cost = _per_token(params, schedule, grid, context, acceptance)
    new_cost = _per_token(params, new, grid, context, acceptance)
    saving = 1.0 - new_cost / old_cost if old_cost > 0 else 0.0
    return (new, saving) if saving >= REPLACE_GAIN else None


# --- the model -----------------------------------------------------------------------------------


def _checking(settings: PolicySettings, state: ControlState, now: float) -> bool:
    """The after-rollout check: the first ``CHECK_EVALUATIONS`` evaluations after the
    schedule's first full window. Later, a load the schedule meets is its job, not a reason
    to restart (the floor and collapse still act)."""
    if state.live_since is None:
        return False
    start = state.live_since + settings.warmup_s + settings.window_s
    return start <= now < start + CHECK_EVALUATIONS * settings.evaluation_interval_s


def _window_complete(settings: PolicySettings, state: ControlState, now: float) -> bool:
    """The current config's first full window after its warm-up is over."""
    return state.live_since is not None and now >= state.live_since + settings.warmup_s + settings.window_s


def _clamped_scale(settings: PolicySettings, k: int, est: Estimate) -> float | None:
    measured = step_scale(settings.prior_params(), k, est)
    if measured is None:
        return None
    lo, hi = settings.tuning.scale_bounds
    return min(hi, max(lo, measured))


def _model(
    settings: PolicySettings, state: ControlState, observed: Any, scale: float | None = None
) -> tuple[EngineParams, Estimate, tuple[float, ...], list[tuple[float, float]]] | None:
    """The calibrated step model, the estimate, the per-position acceptance and the batches
    seen on the long window (None: not enough to go on). ``scale`` given: the plain K's
    calibration (a schedule's own step time mixes Ks); else measured on the plain K running."""
    if not getattr(observed, "available", False) or observed.window is None:
        return None
    obs: Observation = observed.window
    if obs.idle or obs.speculation is None or obs.requests < settings.min_requests:
        return None
    est = estimate(obs, settings.tuning)
    if est.alpha is None or est.batch_per_replica is None or est.batch_per_replica <= 0:
        return None
    if scale is None:
        if est.draft_tokens < settings.min_drafts:
            return None
        scale = _clamped_scale(settings, state.k or 1, est)
        if scale is None:
            return None
    params = _calibrated(settings, state, scale, est.decay)
    alpha = est.alpha
    if state.recent_low_alpha is not None:
        alpha = min(alpha, state.recent_low_alpha)
    acceptance = _positions(alpha, params.acceptance_decay, settings.max_k)
    mean = est.batch_per_replica
    peak = obs.peak_running if obs.peak_running is not None and obs.peak_running > mean else mean
    low = mean if state.batch_low is None else min(mean, state.batch_low)
    high = peak if state.batch_high is None else max(peak, state.batch_high)
    # Today's batches, and the range of the last hours at the same weight: a schedule is
    # for the load that comes back, not only for the load of this window.
    batches = [(mean, 0.5 - PEAK_WEIGHT / 2), (peak, PEAK_WEIGHT / 2), (low, 0.25), (high, 0.25)]
    return params, est, acceptance, batches


def _calibrated(settings: PolicySettings, state: ControlState, scale: float, decay: float | None) -> EngineParams:
    """The prior at the step ``scale`` and ``decay``, with the schedule overhead calibrated
    so far."""
    return scaled_params(settings.prior_params(state.schedule_overhead_s), scale, decay)


def _prefill(est: Estimate, params: EngineParams) -> float:
    """Prompt tokens chunked into each step (as `estimates.step_scale` counts them)."""
    if est.step_time_s is None:
        return 0.0
    return est.request_rate / max(1, params.replicas) * est.prompt_tokens * est.step_time_s


def _positions(alpha: float, decay: float, max_k: int) -> tuple[float, ...]:
    """Per-position conditional acceptance from the fitted alpha and decay."""
    return tuple(min(1.0, alpha * decay ** i) for i in range(max(1, max_k)))


def _per_token(
    params: EngineParams, config: perfmodel.Config, batches: Sequence[tuple[float, float]],
    context: float, acceptance: Sequence[float], prefill: float = 0.0,
) -> float:
    """Time-weighted mean seconds per output token of ``config`` at the batches given, with
    ``prefill`` prompt tokens in each step."""
    total = math.fsum(w for _, w in batches)
    cost = 0.0
    for batch, weight in batches:
        k = config.k_at(batch) if isinstance(config, Schedule) else int(config)
        step = perfmodel.step_time(params, config, batch, context, prefill)
        cost += weight * step / perfmodel.tokens_per_step_from_positions(acceptance, k)
    return cost / total if total > 0 else math.inf


def _measured_per_token(obs: Observation) -> float | None:
    """Seconds of engine time per output token: the inter-token latency sum (one observation
    per running request per step) over the tokens generated."""
    if obs.step_time_mean_s is None or obs.generation_tps is None or obs.generation_tps <= 0 or obs.steps <= 0:
        return None
    return obs.step_time_mean_s * obs.steps / (obs.generation_tps * obs.window_s)


def _e2e_loss(
    params: EngineParams, est: Estimate, schedule: Schedule, k: int, *factors: float,
    alpha: float | None = None,
) -> float | None:
    """The largest predicted relative loss of mean e2e latency of ``schedule`` against plain
    ``k`` at today's load and at each of ``factors`` times it (negative: it gains), at
    acceptance ``alpha`` (default: the estimate's)."""
    worst = -math.inf
    for factor in (1.0, *factors):
        workload = workload_of(est, est.alpha if alpha is None else alpha, factor)
        plain = perfmodel.steady_state(params, workload, k)
        scheduled = perfmodel.steady_state(params, workload, schedule)
        if plain.saturated and scheduled.saturated:
            # Both overloaded: the one with less capacity falls behind faster.
            worst = max(worst, plain.capacity_rps / scheduled.capacity_rps - 1.0)
            continue
        if scheduled.saturated:
            return math.inf
        if plain.saturated:
            worst = max(worst, -1.0)
            continue
        worst = max(worst, scheduled.e2e_s / plain.e2e_s - 1.0)
    return None if worst == -math.inf else worst


def _crossovers(proposal: perfmodel.ScheduleProposal) -> str:
    return ", ".join(f"K{k}@{b}" for b, k in proposal.crossover_batches) or "none"
