"""The control loop's state, and its conversion from and to the status (pure).

`ControlState` is one frozen value: the effective choice (speculation on or off, K) and its
cause, when it was chosen and went live, the acceptance memory, the last observation time,
the decision history and the configs that could not start. The status is its only store:
`from_status` reads it, `to_status` writes it back, so an operator restarted between two
evaluations decides exactly as the old one would have (`specdecode.control.step`).

K is derived here and nowhere else (`bounded`, `choose`; the declared K is
`render.initial_choice`): the reconcile renders what
`choose` says, the policy moves a state outside the bounds to what `bounded` says.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple, Optional, Sequence

from specdecode import api, constants, timestamps
from specdecode.control.decision import Action
from specdecode.control.explain import label
from specdecode.control.forecast import BUCKET_S, LoadHistory
from specdecode.control.experiments import Experiment, rendered_schedule
from specdecode.control.memory import HistoryEntry, history_from_status
from specdecode.control.perfmodel import OFF, Schedule, ScheduleError
from specdecode.control.schedule_support import blocked_reason
from specdecode.render.workload import SpeculationChoice, initial_choice, stable_hash


class Cause(StrEnum):
    """Why the effective speculation is what it is (status.speculation.cause)."""

    DECLARED = "Declared"
    """The spec's numSpeculativeTokens: a new service, or a new declaration."""
    AUTOTUNE_OFF = "AutotuneOff"
    """autotune.mode Off runs the declared K."""
    POLICY = "Policy"
    """A decision of the control loop (the rule is in status.history)."""
    BOUNDS = "Bounds"
    """Moved into the spec's bounds (K outside minK..maxK, or off while allowDisable is false)."""
    STARTUP_FAILURE = "StartupFailure"
    """Turned off because the pods of the speculative config could not start."""
    DRAFT_INCOMPATIBLE = "DraftIncompatible"
    """Turned off because the draft preflight found the draft incompatible."""


class PlainPoint(NamedTuple):
    """What a plain K measured on one full window of its own."""

    batch: float
    """Mean running batch of a replica."""
    seconds_per_token: float
    """Engine seconds per output token."""
    acceptance: float | None = None
    """The window's fitted draft acceptance: tokens per step, and so the time per token, move
    with it from window to window at the same batch (None: a status from an older operator)."""


@dataclass(frozen=True)
class PlainBaseline:
    """What a plain K measured on full windows while it ran, at most one window per factor-2
    band of the running batch (the latest): the baseline a schedule that replaces that K is
    checked against after its rollout (`control.schedules`)."""

    k: int
    points: tuple[PlainPoint, ...] = ()
    """By batch."""


@dataclass(frozen=True)
class ControlState:
    """What the control loop knows between two evaluations (all of it from status)."""

    enabled: bool
    k: int | None
    """K in use; None when speculation is off."""
    since: float
    """When the current config was chosen (status.speculation.since), seconds since epoch."""
    live_since: float | None
    """When every replica ran the current config and was Ready; None while rolling out."""
    ready_replicas: int = 1
    excluded_ks: frozenset[int] = frozenset()
    """Configs whose pods failed to start (status.failedConfigs): never chosen again."""
    last_alpha: float | None = None
    """status.observations.alpha as the previous evaluation left it (kept through outages):
    the memory of how the current config did before this evaluation."""
    recent_low_alpha: float | None = None
    """status.observations.recentLowAlpha: the lowest acceptance of the evaluations of about
    the last hour (`memory.recent_low_alpha`), whatever config measured it. Acceptance that
    fell this low lately can fall this low again: tuning moves are priced against it too."""
    recent_peak_rate: float | None = None
    """status.observations.recentPeakRequestRate: the highest load of about the last day
    (`memory.recent_peak`). A load that rose this high lately can come back: with maxSurge 0 a
    move to a config that cannot carry it is judged against it."""
    recent_peak_at: float | None = None
    """status.observations.recentPeakAt: when that load was last seen (its hold runs from there)."""
    observed_at: float | None = None
    """status.observations.observedAt: when the acceptance memory was last updated."""
    cause: Cause = Cause.POLICY
    config_hash: str | None = None
    """The rendered engine config of the current choice (None until the reconcile renders it)."""
    history: tuple[HistoryEntry, ...] = ()
    """status.history, oldest first."""
    advice: tuple[Action, bool, int | None, str | None] | None = None
    """status.recommendation's (action, enabled, K, schedule): the advice last given."""
    experiments: tuple[Experiment, ...] = ()
    """status.experiments, oldest first: the recent canary experiments; the last one runs
    while it has no end (`experiment`)."""

    schedule: Schedule | None = None
    """status.speculation.schedule: the per-batch-size K schedule in effect (``k`` is its
    largest K); None: plain K (`control.schedules`)."""
    schedule_replaced_k: int | None = None
    """The plain K the schedule replaced (a revert returns to it)."""
    schedule_step_scale: float | None = None
    """Measured/prior step time of that plain K when the schedule replaced it."""
    schedule_overhead_s: float | None = None
    """status.observations.scheduleOverheadSeconds: the per-step schedule cost calibrated
    after a schedule rollout (None: the prior's)."""
    rejected_schedules: frozenset[str] = frozenset()
    """status.rejectedSchedules of the current declaration: never chosen again."""
    schedule_note: str | None = None
    """status.speculation.scheduleReason: why no schedule runs, or why this one was chosen."""
    batch_low: float | None = None
    """status.observations.recentLowRunningRequests: the smallest mean running batch of a
    replica seen lately (a new low at once, forgotten over hours): the bottom of the batch
    range a schedule must serve."""
    batch_high: float | None = None
    """status.observations.recentPeakRunningRequests: the largest running batch of a replica
    seen lately (a new peak at once, forgotten over hours): the top of that range."""
    plain_baseline: PlainBaseline | None = None
    """status.observations.plainBaseline: what the plain K measured before a schedule replaced
    it (kept while that K or its schedule runs)."""
    load_history: LoadHistory = LoadHistory()
    """status.loadHistory: the request rate of each 10-minute bucket of about the last day
    (`forecast.LoadHistory`): what the plan's forecast is made from."""
    below_floor_since: float | None = None
    """status.speculation.belowFloorSince: since when the guard window of the running config
    has shown acceptance confidently below the floor at every evaluation (None: the last one
    did not). The collapse guard acts on a second such window (`rules`)."""

    @property
    def experiment(self) -> Experiment | None:
        """The canary experiment running now, if any."""
        if self.experiments and self.experiments[-1].running:
            return self.experiments[-1]
        return None

    @property
    def config(self) -> int:
        """The current config as perfmodel counts it: 0 off, else K."""
        return self.k if (self.enabled and self.k) else OFF

    @property
    def config_label(self) -> str:
        """The running config as reasons name it: `K=3`, `off`, or its schedule (`1-32:K6,33+:K3`)."""
        return self.schedule.label if self.schedule is not None and self.enabled else label(self.config)


# --------------------------------------------------------------------------------------------
# K: one derivation, one bounds rule
# --------------------------------------------------------------------------------------------


def bounded(config: int, min_k: int, max_k: int, allow_disable: bool, declared_k: int) -> int:
    """``config`` moved into the spec's bounds: K is clamped into [minK, maxK]; speculation
    off while allowDisable is false turns on at the declared K clamped into the bounds (what
    a new service starts with; minK would second-guess the user's declaration)."""
    if config == OFF:
        return OFF if allow_disable else min(max_k, max(min_k, declared_k))
    return min(max_k, max(min_k, config))


def declared_speculation_hash(spec: api.SpecDecodeServiceSpec) -> str:
    """What the user declared about speculation, bounds aside: when it changes, the operator
    starts again from the declared K instead of its own earlier choice."""
    s = spec.speculation
    return stable_hash([s.method.value, s.draft_model, s.draft_revision, s.num_speculative_tokens], length=8)


def choose(
    spec: api.SpecDecodeServiceSpec, status: Optional[api.SpecDecodeServiceStatus]
) -> tuple[SpeculationChoice, Cause, str]:
    """The speculation to run now, its cause and why, from the spec and the operator's
    earlier choice. Off mode runs what is declared. Otherwise the earlier choice stands
    (moved into new bounds by `bounded`) unless the user changed what they declared."""
    s = spec.speculation
    if spec.autotune.mode == api.AutotuneMode.OFF:
        return initial_choice(spec), Cause.AUTOTUNE_OFF, "autotune is Off: running the declared K"
    earlier = status.speculation if status else None
    if earlier is None or earlier.spec_hash != declared_speculation_hash(spec):
        return initial_choice(spec), Cause.DECLARED, "declared in spec"
    k = earlier.k if earlier.k is not None else s.num_speculative_tokens
    config = k if earlier.enabled else OFF
    moved = bounded(config, s.min_k, s.max_k, s.allow_disable, s.num_speculative_tokens)
    choice = SpeculationChoice(k=moved or None)
    if moved != config:
        if config == OFF:
            return choice, Cause.BOUNDS, f"speculation may not be turned off (allowDisable: false): K={moved}"
        return choice, Cause.BOUNDS, f"K {k} moved into the new bounds [{s.min_k}, {s.max_k}]"
    default = "chosen by the operator" if earlier.enabled else "turned off by the operator"
    schedule = schedule_of(earlier, spec) if earlier.enabled else None
    if schedule is not None:
        choice = SpeculationChoice(k=moved or None, per_batch_size=schedule.rows())
    elif earlier.enabled and earlier.schedule:
        blocked = blocked_reason(spec)
        if blocked is not None:
            # The user changed what may run (a vLLM without tables, a layout that ignores them,
            # schedules Off): the operator's own table gives way, to the plain K it replaced (a
            # revert returns there too), not to its largest K, which suits only small batches.
            replaced = k if earlier.schedule_replaced_k is None else earlier.schedule_replaced_k
            back = bounded(replaced, s.min_k, s.max_k, s.allow_disable,
                           s.num_speculative_tokens)
            return (SpeculationChoice(k=back or None), cause_of(earlier),
                    f"the schedule {earlier.schedule} cannot run ({blocked}): {label(back)}, the plain K it replaced")
    return choice, cause_of(earlier), earlier.reason or default


def schedule_of(
    effective: Optional[api.EffectiveSpeculation], spec: api.SpecDecodeServiceSpec
) -> Schedule | None:
    """The operator's schedule in status.speculation, while the spec still lets it run
    (`schedule_support.blocked_reason`: autotune.schedules Auto, no declared perBatchSizeK, a
    vLLM and layout that run tables) and K is the schedule's largest, within the bounds."""
    if effective is None or not effective.schedule or not effective.enabled:
        return None
    if blocked_reason(spec) is not None:
        return None
    try:
        schedule = rendered_schedule(effective.schedule, spec)
    except ScheduleError:
        return None
    s = spec.speculation
    if effective.k != schedule.max_k or not s.min_k <= schedule.max_k <= s.max_k:
        return None
    return schedule


def cause_of(effective: Optional[api.EffectiveSpeculation]) -> Cause:
    """The typed cause of status.speculation (a status written before causes: Policy)."""
    if effective is None or not effective.cause:
        return Cause.POLICY
    try:
        return Cause(effective.cause)
    except ValueError:
        return Cause.POLICY


# --------------------------------------------------------------------------------------------
# status -> state -> status
# --------------------------------------------------------------------------------------------



def active_failures(
    status: api.SpecDecodeServiceStatus, spec: api.SpecDecodeServiceSpec, generation: Optional[int], now: datetime
) -> list[api.FailedConfig]:
    """Failed configs still remembered: same spec generation, and for unclassified causes
    within the retry back-off."""
    retry_s = api.parse_duration(spec.autotune.startup_failure_retry)
    keep = []
    for failed in status.failed_configs:
        if failed.spec_generation != generation:
            continue  # the spec changed: the user may have fixed it
        if not failed.classified and (now - timestamps.parse_rfc3339(failed.at)).total_seconds() >= retry_s:
            continue
        keep.append(failed)
    return keep


def excluded_ks(spec: api.SpecDecodeServiceSpec, remembered: Sequence[api.FailedConfig]) -> frozenset[int]:
    """The Ks not to run while ``remembered`` (the active start-up failures) is not empty:
    every K, since the known causes (vocabulary, memory, method) fail for every K alike;
    none when speculation may not be turned off (the service is Degraded instead)."""
    s = spec.speculation
    return frozenset(range(s.min_k, s.max_k + 1)) if remembered and s.allow_disable else frozenset()


def from_status(
    status: api.SpecDecodeServiceStatus,
    spec: api.SpecDecodeServiceSpec,
    now: datetime,
    generation: Optional[int] = None,
) -> ControlState:
    """The control state the status stores."""
    effective = status.speculation
    # While a speculative config that could not start is remembered, no K is tried: the
    # known causes (vocabulary, memory, method) fail for every K alike.
    excluded = excluded_ks(spec, active_failures(status, spec, generation, now))
    earlier = status.observations
    history = history_from_status(r.to_wire() for r in status.history)
    advice = None
    if status.recommendation is not None:
        r = status.recommendation
        advice = (Action(r.action) if r.action in _ACTIONS else Action.HOLD, r.enabled, r.k, r.schedule)
    memory = dict(
        recent_low_alpha=earlier.recent_low_alpha if earlier else None,
        recent_peak_rate=earlier.recent_peak_request_rate if earlier else None,
        recent_peak_at=timestamps.epoch_seconds_or_none(earlier.recent_peak_at) if earlier else None,
        observed_at=timestamps.epoch_seconds_or_none(earlier.observed_at) if earlier else None,
        history=history,
        advice=advice,
        excluded_ks=excluded,
        ready_replicas=status.ready_replicas or 0,
        experiments=tuple(Experiment.from_record(r, spec) for r in status.experiments),
        load_history=_load_history(status.load_history),
    )
    if effective is None:
        choice, cause, _ = choose(spec, None)
        return ControlState(enabled=choice.enabled, k=choice.k, since=now.timestamp(), live_since=None,
                            cause=cause, **memory)
    # The previous evaluation's acceptance, if it was measured on the config that runs now:
    # kept through an outage, it remembers that the draft paid.
    since = timestamps.epoch_seconds_or_none(effective.since)
    # The acceptance memory counts for the running config only: the same config hash, and
    # measured after it was chosen (the window of the evaluation that changed the choice was
    # measured on the config it left).
    last_alpha = None
    measured_at = timestamps.epoch_seconds_or_none(earlier.observed_at) if earlier else None
    if earlier and earlier.config_hash == effective.config_hash and not (
        measured_at is not None and since is not None and measured_at <= since
    ):
        last_alpha = earlier.alpha if earlier.alpha is not None else earlier.last_alpha
    spec_hash = declared_speculation_hash(spec)
    schedule_memory = dict(
        schedule=schedule_of(effective, spec),
        schedule_replaced_k=effective.schedule_replaced_k,
        schedule_step_scale=effective.schedule_step_scale,
        schedule_overhead_s=earlier.schedule_overhead_seconds if earlier else None,
        rejected_schedules=frozenset(
            r.schedule for r in status.rejected_schedules if r.spec_hash in (None, spec_hash)
        ),
        schedule_note=effective.schedule_reason,
        below_floor_since=timestamps.epoch_seconds_or_none(effective.below_floor_since),
        batch_low=earlier.recent_low_running_requests if earlier else None,
        batch_high=earlier.recent_peak_running_requests if earlier else None,
        plain_baseline=_plain_baseline(earlier.plain_baseline if earlier else None),
    )
    return ControlState(
        **schedule_memory,
        enabled=effective.enabled,
        k=effective.k if effective.enabled else None,
        since=now.timestamp() if since is None else since,
        live_since=timestamps.epoch_seconds_or_none(effective.live_since),
        last_alpha=last_alpha,
        cause=cause_of(effective),
        config_hash=effective.config_hash,
        **memory,
    )


_ACTIONS = {a.value for a in Action}


def _load_history(stored: Optional[api.LoadHistory]) -> LoadHistory:
    if stored is None or stored.start is None:
        return LoadHistory()
    return LoadHistory(timestamps.epoch_seconds_or_none(stored.start), tuple(stored.rates))


def load_history_status(history: LoadHistory) -> Optional[dict]:
    """status.loadHistory of ``history`` (None while it is empty)."""
    if history.start is None:
        return None
    return {"start": timestamps.rfc3339(history.start), "bucketSeconds": int(BUCKET_S),
            "rates": list(history.rates)}


def _plain_baseline(stored: Optional[api.PlainBaseline]) -> PlainBaseline | None:
    if stored is None:
        return None
    return PlainBaseline(k=stored.k, points=tuple(sorted(
        (PlainPoint(p.running_requests, p.seconds_per_output_token, p.acceptance) for p in stored.points
         if p.running_requests > 0 and p.seconds_per_output_token > 0),
        key=lambda p: p.batch,
    )))


BATCH_DIGITS = 2
"""Running batches as status keeps them (recentLow/PeakRunningRequests, plainBaseline)."""
TOKEN_TIME_DIGITS = 7
"""Seconds per output token as status keeps them (plainBaseline)."""


def stored_batch(batch: float) -> float:
    """A running batch as status keeps it: the state holds it so, and reads back the same."""
    return round(batch, BATCH_DIGITS)


ACCEPTANCE_DIGITS = 4
"""Acceptance as status keeps it (plainBaseline)."""


def stored_point(point: PlainPoint) -> PlainPoint:
    """A plain baseline's point as status keeps it."""
    acceptance = None if point.acceptance is None else round(point.acceptance, ACCEPTANCE_DIGITS)
    return PlainPoint(stored_batch(point.batch), round(point.seconds_per_token, TOKEN_TIME_DIGITS), acceptance)


def _plain_baseline_status(baseline: PlainBaseline | None) -> Optional[dict]:
    if baseline is None:
        return None
    points = []
    for point in map(stored_point, baseline.points):
        entry: dict = {"runningRequests": point.batch, "secondsPerOutputToken": point.seconds_per_token}
        if point.acceptance is not None:
            entry["acceptance"] = point.acceptance
        points.append(entry)
    return {"k": baseline.k, "points": points}


def to_status(
    state: ControlState,
    status: api.SpecDecodeServiceStatus,
    spec: api.SpecDecodeServiceSpec,
    *,
    reason: str = "",
    observation: Optional[dict] = None,
    max_history: int,
) -> api.SpecDecodeServiceStatus:
    """``status`` with the state written into it: the effective speculation (a new one when
    the choice changed; the reconcile's live fields kept otherwise), the history and the
    acceptance memory. ``observation`` is the window's `Observation.to_status()` when this
    evaluation measured one (status.observations is replaced by it)."""
    effective = status.speculation
    label = state.schedule.label if state.schedule is not None else None
    same = (
        effective is not None
        and effective.enabled == state.enabled
        and (effective.k if effective.enabled else None) == state.k
        and timestamps.epoch_seconds_or_none(effective.since) == state.since
        and effective.schedule == label
    )
    if not same:
        effective = api.EffectiveSpeculation(
            enabled=state.enabled,
            method=spec.speculation.method.value,
            k=state.k if state.enabled else None,
            since=timestamps.rfc3339(state.since),
            reason=reason[:1024],
            cause=state.cause.value,
            live=False,
            spec_hash=declared_speculation_hash(spec),
        )
    effective = effective.model_copy(update={
        "schedule": label,
        "schedule_reason": None if state.schedule_note is None else state.schedule_note[:512],
        "schedule_replaced_k": state.schedule_replaced_k if label else None,
        "schedule_step_scale": (
            None if not label or state.schedule_step_scale is None else round(state.schedule_step_scale, 4)
        ),
        "below_floor_since": (
            None if state.below_floor_since is None else timestamps.rfc3339(state.below_floor_since)
        ),
    })
    observations = status.observations
    if observation is not None:
        observations = api.Observations.model_validate(
            {**observation,
             "observedAt": None if state.observed_at is None else timestamps.rfc3339(state.observed_at),
             "recentLowAlpha": None if state.recent_low_alpha is None else round(state.recent_low_alpha, 4),
             "recentPeakRequestRate": None if state.recent_peak_rate is None else round(state.recent_peak_rate, 4),
             "recentPeakAt": None if state.recent_peak_at is None else timestamps.rfc3339(state.recent_peak_at),
             "lastAlpha": None if state.last_alpha is None else round(state.last_alpha, 4),
             "scheduleOverheadSeconds": (
                 None if state.schedule_overhead_s is None else round(state.schedule_overhead_s, 6)
             ),
             "recentLowRunningRequests": None if state.batch_low is None else stored_batch(state.batch_low),
             "recentPeakRunningRequests": None if state.batch_high is None else stored_batch(state.batch_high),
             "plainBaseline": _plain_baseline_status(state.plain_baseline)}
        )
    history = [api.DecisionRecord.model_validate(e.to_status()) for e in state.history[-max_history:]]
    if [r.to_wire() for r in history] == [r.to_wire() for r in status.history]:
        history = list(status.history)
    experiments = [e.to_record() for e in state.experiments[-constants.MAX_EXPERIMENTS:]]
    if [r.to_wire() for r in experiments] == [r.to_wire() for r in status.experiments]:
        experiments = list(status.experiments)
    rejected = list(status.rejected_schedules)
    known = {r.schedule for r in rejected}
    for schedule in sorted(state.rejected_schedules - known):
        rejected.append(api.RejectedSchedule(
            schedule=schedule, reason=reason[:1024], spec_hash=declared_speculation_hash(spec),
            at=timestamps.rfc3339(state.since),
        ))
    load_history = status.load_history
    if _load_history(load_history) != state.load_history:
        stored = load_history_status(state.load_history)
        load_history = None if stored is None else api.LoadHistory.model_validate(stored)
    return status.model_copy(update={
        "load_history": load_history,
        "speculation": effective, "observations": observations, "history": history,
        "experiments": experiments, "rejected_schedules": rejected[-8:],
    })

