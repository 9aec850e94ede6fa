"""Running one scenario: the policy in simulated time, every static choice, the oracle.

The policy runs as in production: a `SpecDecodeService` spec with the API's default autotune
settings (Auto mode, 1m evaluations, 5m window, 2m warm-up, 10m cooldown, 4 changes per hour,
30m re-probe), the scenario's SLO and replicas, maxSurge 0 / maxUnavailable 1, a 15s scrape
interval and the prior costs of the scenario's method (never the scenario's true costs or
acceptance), turned into settings by `PolicySettings.from_spec` (the restart price fixed at
180s). Every scrape interval the Ready pods advance (`telemetry.Fleet`), every evaluation
interval the policy reads them through the production reader and `evaluation.evaluate` runs
the production step on the service's status (state read from it and written back); a change
rolls through the replicas one at a time, each new pod Ready after the scenario's true
``rollout_s``, and the reconcile's part (the new config live) is written into status too.

Figures of a strategy (all from `engine.Segment` lists, BENCHMARK.md's definitions):
- goodput: output tokens per second of requests meeting both SLO bounds, time-averaged;
- latency: time-weighted mean of e2e and TPOT; P95 of the time-weighted mixture of the
  segments' latency distributions (lognormal fitted to each segment's mean and P95);
- SLO-violation minutes: time whose P95 e2e or P95 TPOT is above its bound;
- score: min(goodput / G*, L* / mean e2e), G* the highest goodput and L* the lowest mean e2e
  among the oracle and every static choice (`scored`);
- changes: config changes (each restarts every replica); a static choice other than the
  declared K changes once, at the start;
- fallback: after a collapse (true acceptance falls below the floor) the time until the
  policy's first decision that reduces speculation, also in evaluation intervals after the
  collapse became visible (one scrape after it); a collapse met with speculation already
  off is reported as such (``already_off``) and needs no fallback;
- re-enable: after a recovery (acceptance back above the floor) the time until the policy
  turns speculation on (``already_on`` when it never turned it off);
- stationary changes: policy changes later than the settling time after a phase start
  (warm-up + window + rollout of every replica + two evaluations); re-probes and their
  abandonment are counted apart as exploration.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from specdecode import api, timestamps
from specdecode.control import perfmodel, promql
from specdecode.tools.bench import engine, peers, telemetry
from specdecode.control import decision as dec
from specdecode.control import evaluation
from specdecode.control.estimates import PolicyObservations
from specdecode.control.settings import PolicySettings, PolicyTuning
from specdecode.control.experiments import CanaryPlan, record_schedule, running_record
from specdecode.control.metrics import ConfigKey, QueryScope, service_request_rate
from specdecode.control.perfmodel import OFF
from specdecode.tools.scenario import Scenario, load_scenario

POLICY = "policy"
"""The policy as the API defaults it (``autotune.schedules: Auto``, canary experiments on)."""
ORACLE = "oracle"
ORACLE_SCHEDULES = "oracle+sched"
"""The oracle that may also choose the scenario's schedule family (`engine.schedule_family`)."""
POLICY_PLAIN = "policy (sched Off)"
"""The policy with ``autotune.schedules: Off``: plain K only (reported beside the default)."""
SCRAPE_INTERVAL_S = 15.0
DECLARED_K = 3
"""The K a service declares when its scenario does not bound it away: every strategy starts
there (the policy, the oracle and every static choice, which switches at the start)."""
DAY_LONG_S = 20 * 3600.0
"""A single-phase scenario at least this long is a day-long stationary one: its figure is
the number of changes, its target the oracle's."""

strategy_name = engine.strategy_label


def declared_config(params: perfmodel.EngineParams) -> int:
    """The service's declared config: K = 3 within the scenario's bounds."""
    return min(params.max_k, max(params.min_k, DECLARED_K))


def is_day_long_stationary(scenario: Scenario) -> bool:
    return len(scenario.phases) == 1 and scenario.duration >= DAY_LONG_S


RESTART_S = 180.0
"""The restart price's duration the policy assumes (the scenario's true rollout is not told)."""


def service_spec(
    scenario: Scenario, scrape_interval_s: float = SCRAPE_INTERVAL_S, experiments: bool = True,
    schedules: bool | None = None, allow_outages: bool = True,
) -> api.SpecDecodeServiceSpec:
    """The scenario's service as a user would declare it: the API's defaults, the scenario's
    method, K bounds, replicas and SLO, K = 3 declared within the bounds; canary experiments
    as the API defaults them (on) or turned off (`autotune.experiments.enabled`); ``schedules``
    sets autotune.schedules (None: the API's default). ``allow_outages`` is
    autotune.allowOutages unless the scenario's autotune sets it: true by default, so that the
    benchmark judges the policy's choices with restarts allowed, as a user who opted in runs it
    (the API's default, false, is measured with ``bench policy --safe-defaults``)."""
    params = scenario.params
    speculation: dict[str, Any] = {
        "method": scenario.method, "numSpeculativeTokens": declared_config(params),
        "minK": params.min_k, "maxK": params.max_k, "allowDisable": True,
    }
    if api.SpeculationMethod(scenario.method) in api.METHODS_WITH_DRAFT_MODEL:
        speculation["draftModel"] = "bench/draft"
    slo = {key: promql.format_duration(value) for key, value in
           (("p95EndToEnd", scenario.slo.p95_e2e_s), ("p95TimePerOutputToken", scenario.slo.p95_tpot_s))
           if value is not None}
    autotune: dict[str, Any] = {"allowOutages": allow_outages, **scenario.autotune}
    autotune["experiments"] = {**autotune.get("experiments", {}), "enabled": experiments}
    if slo:
        autotune["slo"] = slo
    if schedules is not None:
        autotune["schedules"] = "Auto" if schedules else "Off"
    return api.parse_spec({
        "model": {"name": "bench/target"},
        "speculation": speculation,
        "replicas": params.replicas,
        "autotune": autotune,
        "metrics": {"scrapeInterval": promql.format_duration(scrape_interval_s)},
    })


def policy_settings(
    scenario: Scenario, scrape_interval_s: float = SCRAPE_INTERVAL_S, experiments: bool = True,
    schedules: bool | None = None, planner: bool = False, allow_outages: bool = True,
) -> PolicySettings:
    """The production settings of the scenario's service (`PolicySettings.from_spec`);
    ``planner``: tuning by the receding-horizon planner (`PolicyTuning.planner`)."""
    return PolicySettings.from_spec(
        service_spec(scenario, scrape_interval_s, experiments, schedules, allow_outages), restart_s=RESTART_S,
        tuning=PolicyTuning(planner=planner),
    )


# --- the policy in simulated time ------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One applied decision of the policy."""

    time: float
    from_config: perfmodel.Config
    to_config: perfmodel.Config
    rule: dec.Rule
    reason: str


@dataclass(frozen=True)
class Blocked:
    """A decision whose rule wanted a change and held (restart price, overload, cooldown,
    budget)."""

    time: float
    rule: dec.Rule
    held: dec.Held
    reason: str


@dataclass
class ExperimentSpan:
    """One canary experiment as the benchmark ran it (from the status record it started)."""

    purpose: str
    candidate: engine.Config
    incumbent: engine.Config
    started: float
    ready_at: float
    """When the canary's pods became Ready (``started`` + the scenario's start-up time)."""
    borrowed: int
    """Replicas the main Deployment gave up for it (capacity-neutral canary)."""
    replicas: int
    ended: float | None = None
    verdict: str = "Running"
    reason: str = ""

    @property
    def promoted(self) -> bool:
        return self.verdict == "Promote"


@dataclass
class _Canary:
    """The running canary: its record's identity, its pods' slots and label."""

    started_at: str
    config: engine.Config
    label: str
    slots: tuple[int, ...]
    borrowed_slots: tuple[int, ...]
    span: ExperimentSpan


@dataclass
class PolicyRun:
    schedule: list[engine.Serving]
    changes: list[Change]
    experiments: list[ExperimentSpan] = field(default_factory=list)
    alpha_trace: list[tuple[float, float]] = field(default_factory=list)
    rules: dict[str, int] = field(default_factory=dict)
    blocked: list[Blocked] = field(default_factory=list)
    decisions: int = 0
    metrics_unavailable: int = 0


def _align(t: float, step: float) -> float:
    return math.ceil(t / step - 1e-9) * step


def _rendered(status: api.SpecDecodeServiceStatus, config: perfmodel.Config, live_at: float | None = None,
              ready: int | None = None) -> api.SpecDecodeServiceStatus:
    """What the reconcile writes: right after a change the new config's hash (the evaluator
    reconciles at once), and once every replica runs it, live since then."""
    update: dict[str, Any] = {"config_hash": telemetry.config_hash(config)}
    if live_at is not None:
        update.update(live=True, live_since=timestamps.rfc3339(live_at))
    effective = status.speculation.model_copy(update=update)
    return status.model_copy(update={"speculation": effective, "ready_replicas": ready if ready is not None
                                     else status.ready_replicas})


def run_policy(
    scenario: Scenario, settings: PolicySettings | None = None, experiments: bool = True,
    on_evaluation: Callable[[float, evaluation.EvaluationResult], None] | None = None,
) -> PolicyRun:
    """The policy against the scenario (deterministic in the scenario's seed), through the
    production step and its status conversion (`evaluation.evaluate`).

    With ``experiments``, a running record in ``status.experiments`` is a canary: its
    replicas (`CanaryPlan.replicas`) run the candidate beside the main Deployment's, which
    gives as many up when the canary borrows them (capacity-neutral); the canary's pods are
    Ready after the scenario's start-up time, share the traffic per replica and are read
    through their own config-hash label; their long-window observation is the ``canary``
    the step judges. A verdict deletes the canary: a promotion is the step's change (a
    normal rollout), any other end gives the main Deployment its replicas back (their
    start-up again). ``on_evaluation`` sees every evaluation's result as it happens, with the
    simulated time (`specdecode bench trace`)."""
    settings = settings or policy_settings(scenario, experiments=experiments)
    spec = service_spec(scenario, experiments=experiments, schedules=settings.schedules,
                        allow_outages=settings.allow_outages)
    params = scenario.params
    replicas = params.replicas
    scrape = settings.scrape_interval_s
    every = max(1, round(settings.evaluation_interval_s / scrape))
    rollout_s = _align(params.rollout_s, scrape)
    long_scope = QueryScope.of(settings.window_s)
    guard_scope = QueryScope.of(settings.guard_window_s)
    trend_scope = QueryScope.of(settings.trend_window_s, load_only=True)
    fleet = telemetry.Fleet(
        scenario.name, scenario.method, params, scenario.seed,
        telemetry.keep_seconds([settings.window_s, settings.guard_window_s, settings.trend_window_s]),
        scenario.noise.request_acceptance_sd,
    )
    config: perfmodel.Config = settings.configured_k
    for slot in range(replicas):
        fleet.start(slot, config)
    status = _rendered(
        api.SpecDecodeServiceStatus(speculation=api.EffectiveSpeculation(
            enabled=True, method=scenario.method, k=config, since=timestamps.rfc3339(0.0),
            reason="declared in spec", cause="Declared",
            spec_hash=evaluation.cs.declared_speculation_hash(spec),
        )),
        config, 0.0, replicas,
    )
    run = PolicyRun(schedule=[engine.Serving(0.0, config, replicas)], changes=[])
    # (time, slot, "stop"|"start", config, label): pod events still to come.
    transitions: list[tuple[float, int, str, int, str | None]] = []
    live_at: float | None = None
    canary: _Canary | None = None

    def main_ready() -> int:
        return sum(1 for slot in fleet.pods if slot < replicas)

    steps = int(math.floor(scenario.duration / scrape))
    for step in range(steps):
        t0 = step * scrape
        t = t0 + scrape
        truth = scenario.true_conditions(t0)
        if fleet.ready:
            fleet.advance(scrape, truth.workload)
        due = [tr for tr in transitions if tr[0] <= t + 1e-9]
        transitions = [tr for tr in transitions if tr[0] > t + 1e-9]
        for when, slot, what, new_config, label in sorted(due, key=lambda tr: tr[:3]):
            if what == "stop":
                fleet.stop(slot, when)
            else:
                fleet.start(slot, new_config, label)
        if live_at is not None and t >= live_at - 1e-9:
            status = _rendered(status, config, live_at, main_ready())
            live_at = None
        outage = scenario.metrics_outage_at(t)
        if not outage:
            fleet.scrape(t)
        if (step + 1) % every:
            continue

        if status.ready_replicas != main_ready():
            # The main Deployment's Ready pods, as the reconcile reports them (a canary's are not).
            status = status.model_copy(update={"ready_replicas": main_ready()})
        candidate_observation = None
        if outage:
            observed = PolicyObservations.unavailable(
                f"Prometheus at http://prometheus:9090 is unreachable (scenario outage at "
                f"{t / 60:.0f}m)"
            )
            run.metrics_unavailable += 1
        else:
            read = fleet.observe(long_scope, t)
            long = telemetry.current_observation(read, scenario.name, config)
            short = telemetry.current_observation(fleet.observe(guard_scope, t), scenario.name, config)
            trend = service_request_rate(
                obs for key, obs in fleet.observe(trend_scope, t).items() if key.service == scenario.name)
            observed = PolicyObservations.of(long, short, trend)
            if canary is not None:
                candidate_observation = read.get(ConfigKey(telemetry.NAMESPACE, scenario.name, canary.label))
        result = evaluation.evaluate(status, spec, settings, observed, None, _datetime(t), canary=candidate_observation)
        status, decision = result.status, result.decision
        if on_evaluation is not None:
            on_evaluation(t, result)
        run.decisions += 1
        run.rules[decision.rule] = run.rules.get(decision.rule, 0) + 1
        if decision.alpha is not None:
            run.alpha_trace.append((t, decision.alpha))

        record = running_record(status) if experiments else None
        freed: tuple[int, ...] = ()
        if canary is not None and (record is None or record.started_at != canary.started_at):
            # The experiment ended (a verdict, or cancelled): the canary's pods are deleted.
            ended = next((r for r in reversed(status.experiments or []) if r.started_at == canary.started_at), None)
            canary.span.ended = t
            canary.span.verdict = ended.verdict if ended is not None else "Cancelled"
            canary.span.reason = ended.reason if ended is not None else "the record is gone from status"
            transitions = [tr for tr in transitions if tr[1] not in canary.slots]
            run.schedule = [s for s in run.schedule if s.start <= t + 1e-9]
            for slot in canary.slots:
                fleet.stop(slot, t)
            freed = canary.borrowed_slots
            if not result.rerender:
                # The main Deployment scales back: its pods start again at the running config.
                run.schedule.extend(engine.canary_end(t, config, replicas, len(freed), rollout_s))
                for slot in freed:
                    transitions.append((t + rollout_s, slot, "start", config, None))
                freed = ()
            canary = None

        if result.rerender:
            old, new = config, (decision.schedule if decision.schedule is not None else decision.config)
            run.changes.append(Change(t, old, new, decision.rule, decision.reason))
            run.schedule.extend(engine.rollout(t, old, new, replicas, rollout_s))
            # Slots the canary borrowed start first (the Deployment is short of them), then
            # the running pods restart one at a time.
            for slot in freed:
                transitions.append((t + rollout_s, slot, "start", new, None))
            offset = 1 if freed else 0
            running = [slot for slot in range(replicas) if slot not in freed]
            for j, slot in enumerate(running):
                transitions.append((t + (j + offset) * rollout_s, slot, "stop", new, None))
                transitions.append((t + (j + offset + 1) * rollout_s, slot, "start", new, None))
            live_at = t + (len(running) + offset) * rollout_s
            config = new
            status = _rendered(status, config, ready=main_ready())
        elif decision.held is not None:
            run.blocked.append(Blocked(t, decision.wanted or decision.rule, decision.held, decision.reason))

        if record is not None and canary is None:
            # A new experiment: the canary Deployment is created, the main one gives up
            # replicas when the canary borrows them.
            plan = CanaryPlan.from_spec(spec)
            size = plan.replicas
            borrowed_slots = tuple(range(plan.main_replicas(spec), replicas))
            slots = tuple(range(replicas, replicas + size))
            candidate = (record_schedule(record, spec)
                         or (record.candidate_k if record.candidate_enabled and record.candidate_k else OFF))
            for slot in borrowed_slots:
                transitions = [tr for tr in transitions if tr[1] != slot]
                fleet.stop(slot, t)
            for slot in slots:
                transitions.append((t + rollout_s, slot, "start", candidate, record.candidate_hash))
            run.schedule.extend(engine.canary_start(t, config, candidate, replicas, size, len(borrowed_slots), rollout_s))
            span = ExperimentSpan(record.purpose, candidate, config, t, t + rollout_s, len(borrowed_slots), size)
            run.experiments.append(span)
            canary = _Canary(record.started_at, candidate, record.candidate_hash, slots, borrowed_slots, span)
    return run


def _datetime(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


# --- figures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    goodput_tokens_per_s: float
    e2e_mean_s: float
    e2e_p95_s: float
    tpot_mean_s: float
    tpot_p95_s: float
    slo_violation_min: float
    changes: int
    score: float = math.nan
    goodput_ratio: float = math.nan
    latency_ratio: float = math.nan

    @property
    def axes(self) -> engine.Axes:
        return engine.Axes(self.goodput_tokens_per_s, self.e2e_mean_s)

    def with_ratios(self, best: engine.Axes) -> "Figures":
        """The figures scored against the denominators ``best`` (`engine.headline`)."""
        score, good, fast = engine.headline(self.axes, best)
        return replace(self, score=score, goodput_ratio=good, latency_ratio=fast)


mixture_p95 = engine.mixture_p95


def figures(segments: list[engine.Segment], changes: int) -> Figures:
    total = math.fsum(s.duration for s in segments)
    if total <= 0:
        return Figures(0.0, math.nan, math.nan, math.nan, math.nan, 0.0, changes)

    def mean(attr: str) -> float:
        return math.fsum(s.duration * getattr(s, attr) for s in segments) / total

    return Figures(
        goodput_tokens_per_s=mean("goodput_tokens_per_s"),
        e2e_mean_s=mean("e2e_mean_s"),
        e2e_p95_s=mixture_p95([(s.duration, s.e2e_mean_s, s.e2e_p95_s) for s in segments]),
        tpot_mean_s=mean("tpot_mean_s"),
        tpot_p95_s=mixture_p95([(s.duration, s.tpot_mean_s, s.tpot_p95_s) for s in segments]),
        slo_violation_min=math.fsum(s.duration for s in segments if s.slo_violated) / 60.0,
        changes=changes,
    )


# --- experiments and failed probes --------------------------------------------------------

PROBE_MOVES = frozenset({dec.Rule.REPROBE, dec.Rule.TUNE})
"""The moves a canary experiment tests first (issue #15); without experiments they restart
every replica at once, and such a change is the probe."""


@dataclass(frozen=True)
class ProbeCost:
    """What probes that were not kept cost, in replica-seconds.

    A probe is a canary experiment (a Calibrate's one-window measurement too: it is never
    promoted, so its whole cost counts here), or (without one) a change by a re-probe or a
    tune move (`PROBE_MOVES`). It was not kept when the experiment ended without a promotion, or when
    the change was undone (the next change returned to the config it left) within the
    rollout plus the experiments' maximum duration. Its cost:
    - ``served_worse_s``: replica-seconds served at the probe's config while the truth says
      it was slower end to end than the config it was tested against (each replica at its
      share of the traffic, no queue);
    - ``startup_s``: replica-seconds without capacity because of it: the pods it restarted
      (every replica, one at a time, there and back) or the main replicas a capacity-neutral
      canary borrowed (until the canary was Ready, and again when they came back).
    """

    probes: int = 0
    failed: int = 0
    served_worse_s: float = 0.0
    startup_s: float = 0.0

    @property
    def replica_minutes(self) -> float:
        return (self.served_worse_s + self.startup_s) / 60.0


def probe_cost(
    run: PolicyRun, segments: list[engine.Segment], evaluator: engine.SegmentEvaluator, rollout_s: float,
    max_duration_s: float,
) -> ProbeCost:
    """The failed-probe cost of a policy run (`ProbeCost`)."""
    replicas = evaluator.params.replicas
    probes = failed = 0
    worse = startup = 0.0
    for span in run.experiments:
        probes += 1
        if span.ended is None or span.promoted:
            continue
        failed += 1
        startup += span.borrowed * (min(rollout_s, span.ended - span.started) + rollout_s)
        worse += math.fsum(
            s.duration * s.candidate_replicas for s in segments
            if s.candidate_worse and span.ready_at - 1e-9 <= s.start < span.ended
        )
    horizon = replicas * rollout_s + max_duration_s
    for change, following in zip(run.changes, [*run.changes[1:], None]):
        if change.rule not in PROBE_MOVES:
            continue
        probes += 1
        if following is None or following.to_config != change.from_config or following.time - change.time > horizon:
            continue
        failed += 1
        startup += 2 * replicas * rollout_s
        end = following.time + replicas * rollout_s
        for s in segments:
            if change.time <= s.start < end and s.config == change.to_config and s.candidate is None and s.replicas > 0:
                if engine.slower_per_replica(evaluator, s.workload, s.config, change.from_config, s.replicas, s.duration):
                    worse += s.duration * s.replicas
    return ProbeCost(probes, failed, worse, startup)


@dataclass(frozen=True)
class PolicyVariant:
    """The policy with canary experiments on or off, scored against the same yardstick."""

    experiments_enabled: bool
    figures: Figures
    experiments: int
    promotions: int
    aborts: int
    cancelled: int
    probe_cost: ProbeCost
    spans: tuple[ExperimentSpan, ...] = ()
    changes: tuple[Change, ...] = ()

    @property
    def restarts(self) -> int:
        """Rollouts of the main Deployment (every replica restarts); a canary's pod starts are
        not among them, they are priced in the score and in the failed-probe cost."""
        return self.figures.changes


EXPERIMENT_MODES = {"on": (True,), "off": (False,), "compare": (True, False)}
"""``--experiments``: which policy runs; the first is the headline ``policy``."""


def run_variant(
    scenario: Scenario, measure: "Yardstick", experiments: bool, planner: bool = False, allow_outages: bool = True,
) -> tuple[PolicyVariant, PolicyRun, list[engine.Segment], PolicySettings]:
    settings = policy_settings(scenario, experiments=experiments, planner=planner,  # schedules as the API defaults them
                               allow_outages=allow_outages)
    run = run_policy(scenario, settings, experiments=experiments)
    segments = engine.evaluate_schedule(scenario, measure.evaluator, run.schedule)
    raw = figures(segments, len(run.changes))
    best = engine.best_axes(f.axes for f in measure.figures().values())
    plan = CanaryPlan.from_spec(service_spec(scenario, experiments=experiments, allow_outages=allow_outages))
    rollout_s = _align(scenario.params.rollout_s, settings.scrape_interval_s)
    ended = [s for s in run.experiments if s.ended is not None]
    variant = PolicyVariant(
        experiments_enabled=experiments,
        figures=raw.with_ratios(best),
        experiments=len(run.experiments),
        promotions=sum(1 for s in ended if s.promoted),
        aborts=sum(1 for s in ended if s.verdict.startswith("Abort")),
        cancelled=sum(1 for s in ended if s.verdict == "Cancelled"),
        probe_cost=probe_cost(run, segments, measure.evaluator, rollout_s, plan.max_duration_s),
        spans=tuple(run.experiments),
        changes=tuple(run.changes),
    )
    return variant, run, segments, settings


# --- one scenario ----------------------------------------------------------------------------


@dataclass
class ScenarioResult:
    """Everything the report needs about one scenario (picklable)."""

    name: str
    description: str
    path: str
    duration_s: float
    method: str
    slo: dict[str, float | None]
    strategies: dict[str, Figures]
    phases: list[dict[str, Any]]
    events: dict[str, Any]
    timelines: dict[str, list[tuple[float, float, int, float, float]]]
    """Per strategy: (start, end, config, goodput, P95 e2e) of each segment."""
    truth: list[tuple[float, float, float, float]]
    """(start, end, request rate, effective acceptance) of each truth segment."""
    changes: list[Change]
    alpha_trace: list[tuple[float, float]]
    oracle_source: str
    elapsed_s: float
    evaluations: int
    rules: dict[str, int]
    best_static: str = ""
    day_long_stationary: bool = False
    held_back: bool = False
    schedules: "ScheduleView | None" = None
    """The same scenario with per-batch-size schedules in the yardstick (None: not run)."""
    variants: dict[str, PolicyVariant] = field(default_factory=dict)
    """The policy with experiments "on" and/or "off" (``--experiments``); ``strategies``'
    policy is the first mode's."""
    peers: dict[str, Figures] = field(default_factory=dict)
    """Each engine-side mechanism that applies here (`peers`), scored like the policy."""
    peer_notes: dict[str, str] = field(default_factory=dict)
    """Per peer: how it was configured, or why it does not apply."""


@dataclass(frozen=True)
class ScheduleView:
    """What per-batch-size schedules change in a scenario.

    ``strategies`` scores every strategy against the best goodput and latency among the
    oracle with schedules, the oracle without, every static K and every static schedule:
    the policy (which does not choose schedules yet), ``oracle`` (K only),
    ``oracle+sched``, each static K and each schedule of the family chosen once (by its
    label, ``sched[...]``).
    """

    family: tuple[str, ...]
    """Labels of the schedules the oracle may choose (empty: none proposed)."""
    strategies: dict[str, Figures]
    best_static_schedule: str
    """The family's best schedule as a static choice ('' without a family)."""
    oracle_source: str
    oracle_plan: tuple[str, ...]
    """The config of each phase in the oracle+sched plan."""


def _effective_alpha(scenario: Scenario, workload: perfmodel.Workload) -> float:
    return perfmodel.effective_alpha(workload.acceptance, workload.temperature, scenario.params)


def _config_at(run: PolicyRun, t: float, initial: int) -> int:
    """The config the policy has decided on at ``t`` (a rollout in progress counts as done)."""
    config = initial
    for change in run.changes:
        if change.time > t:
            break
        config = change.to_config
    return config




def _events(
    scenario: Scenario, settings: PolicySettings, run: PolicyRun
) -> dict[str, Any]:
    floor = settings.acceptance_floor
    phases = scenario.phases
    collapses, recoveries = [], []
    for i in range(1, len(phases)):
        before = _effective_alpha(scenario, phases[i - 1].workload())
        after = _effective_alpha(scenario, phases[i].workload())
        end = phases[i + 1].at if i + 1 < len(phases) else scenario.duration
        start = phases[i].at
        if before >= floor > after:
            if _config_at(run, start, settings.configured_k) == OFF:
                # Speculation is already off when acceptance collapses: nothing to fall back from.
                collapses.append(
                    {"at_s": start, "fallback_s": None, "fallback_intervals": None, "held": None,
                     "already_off": True}
                )
                continue
            change = next(
                (c for c in run.changes if start <= c.time < end and c.to_config < c.from_config), None
            )
            delay = None if change is None else change.time - start
            held = None
            if change is None:
                # The floor's own hold explains most; the other fallback rules' holds next.
                blocks = [(b.rule not in dec.FLOOR_RULES, b.time, b.held, b.reason)
                          for b in run.blocked
                          if start <= b.time < end and b.rule in dec.FALLBACK_RULES]
                held = {"by": min(blocks)[2], "reason": min(blocks)[3]} if blocks else None
            # Visible with the first scrape after the change, or after an outage hiding it.
            visible = start
            for outage in scenario.metrics_outage:
                if outage.at <= visible < outage.end:
                    visible = outage.end
            visible += settings.scrape_interval_s
            intervals = None if change is None else (change.time - visible) / settings.evaluation_interval_s
            collapses.append(
                {"at_s": start, "fallback_s": delay, "fallback_intervals": intervals, "held": held,
                 "already_off": False}
            )
        elif before < floor <= after:
            if _config_at(run, start, settings.configured_k) != OFF:
                recoveries.append({"at_s": start, "reenable_s": None, "already_on": True})
                continue
            change = next(
                (c for c in run.changes if start <= c.time < end and c.from_config == OFF), None
            )
            recoveries.append({"at_s": start, "reenable_s": None if change is None else change.time - start,
                               "already_on": False})
    settle = (
        settings.warmup_s + settings.window_s + scenario.params.replicas * scenario.params.rollout_s
        + 2 * settings.evaluation_interval_s
    )
    stationary = exploration = 0
    previous: Change | None = None
    for change in run.changes:
        index = scenario.phase_index_at(change.time)
        probing = change.rule in dec.PROBE_RULES or (
            previous is not None and previous.rule is dec.Rule.REPROBE
            and change.to_config < change.from_config
        )
        if change.time - phases[index].at >= settle:
            if probing:
                exploration += 1
            else:
                stationary += 1
        previous = change
    return {
        "collapses": collapses,
        "recoveries": recoveries,
        "stationary_changes": stationary,
        "exploration_changes": exploration,
        "settle_s": settle,
        "metrics_unavailable_evaluations": run.metrics_unavailable,
    }


def _phase_figures(
    scenario: Scenario, by_strategy: dict[str, list[engine.Segment]]
) -> list[dict[str, Any]]:
    out = []
    for i, (start, end, phase) in enumerate(scenario.phase_spans()):
        row: dict[str, Any] = {
            "index": i, "start_s": start, "end_s": end,
            "request_rate": phase.request_rate, "acceptance": phase.acceptance,
            "temperature": phase.temperature, "strategies": {},
        }
        for name, segments in by_strategy.items():
            segs = [s for s in segments if s.phase_index == i]
            if not segs:
                continue
            f = figures(segs, 0)
            configs: dict[int, float] = {}
            for s in segs:
                configs[s.config] = configs.get(s.config, 0.0) + s.duration
            row["strategies"][name] = {
                "config": strategy_name(max(configs, key=configs.get)),
                "goodput_tokens_per_s": f.goodput_tokens_per_s,
                "e2e_mean_s": f.e2e_mean_s, "e2e_p95_s": f.e2e_p95_s,
                "tpot_mean_s": f.tpot_mean_s, "tpot_p95_s": f.tpot_p95_s,
                "slo_violation_min": f.slo_violation_min,
            }
        out.append(row)
    return out


@dataclass(frozen=True)
class Yardstick:
    """What the policy is measured against in one scenario: every static choice and the
    oracle, all starting at the declared config."""

    evaluator: engine.SegmentEvaluator
    configs: tuple[int, ...]
    declared: int
    statics: dict[int, list[engine.Segment]]
    oracle: engine.OraclePlan
    family: tuple[perfmodel.Schedule, ...] = ()
    schedule_statics: dict[perfmodel.Schedule, list[engine.Segment]] = field(default_factory=dict)
    oracle_schedules: engine.OraclePlan | None = None
    """The oracle over the configs and the family (None: not computed)."""

    def figures(self) -> dict[str, Figures]:
        """Unscored figures of every static choice and of the oracle, by strategy name."""
        out = {
            strategy_name(c): figures(self.statics[c], 0 if c == self.declared else 1)
            for c in self.configs
        }
        out[ORACLE] = figures(list(self.oracle.segments), self.oracle.changes)
        return out

    def schedule_figures(self) -> dict[str, Figures]:
        """Unscored figures of each static schedule and of the oracle with schedules."""
        out = {strategy_name(s): figures(segs, 1) for s, segs in self.schedule_statics.items()}
        plan = self.oracle_schedules or self.oracle
        out[ORACLE_SCHEDULES] = figures(list(plan.segments), plan.changes)
        return out


def yardstick(scenario: Scenario, schedules: bool = False) -> Yardstick:
    """Every static choice and the oracle; with ``schedules`` also the scenario's schedule
    family, each as a static choice, and the oracle that may choose them."""
    params = scenario.params
    evaluator = engine.SegmentEvaluator(params, scenario.slo.p95_e2e_s, scenario.slo.p95_tpot_s)
    configs = engine.configs_of(params)
    declared = declared_config(params)
    statics = {
        c: engine.evaluate_schedule(
            scenario, evaluator, engine.static_schedule(c, params.replicas, declared, params.rollout_s)
        )
        for c in configs
    }
    oracle = engine.phase_oracle(scenario, evaluator, configs, declared, statics)
    if not schedules:
        return Yardstick(evaluator, configs, declared, statics, oracle)
    family = engine.schedule_family(scenario, declared)
    schedule_statics = {
        s: engine.evaluate_schedule(
            scenario, evaluator, engine.static_schedule(s, params.replicas, declared, params.rollout_s)
        )
        for s in family
    }
    oracle_schedules = oracle
    if family:
        plan = engine.phase_oracle(
            scenario, evaluator, (*configs, *family), declared, {**statics, **schedule_statics}
        )
        # Its DP ranks paths against its own candidates: keep the K-only plan when that one
        # scores better against the best of everything (the oracle with more choices must
        # not score below the oracle with fewer).
        everything = [engine.axes_of(segs) for segs in (*statics.values(), *schedule_statics.values())]
        everything += [engine.axes_of(plan.segments), engine.axes_of(oracle.segments)]
        best = engine.best_axes(everything)
        if engine.headline(engine.axes_of(plan.segments), best)[0] >= engine.headline(
            engine.axes_of(oracle.segments), best
        )[0]:
            oracle_schedules = plan
    return Yardstick(evaluator, configs, declared, statics, oracle, family, schedule_statics,
                     oracle_schedules)


def scored(raw: dict[str, Figures]) -> dict[str, Figures]:
    """Every strategy scored against the best goodput and the best latency among the oracle
    and every static choice (the policy's own figures never set a denominator)."""
    best = engine.best_axes(f.axes for name, f in raw.items() if name not in (POLICY, POLICY_PLAIN))
    return {name: f.with_ratios(best) for name, f in raw.items()}


def _schedule_view(
    measure: Yardstick, policy_figures: Figures, plain_figures: Figures | None = None
) -> ScheduleView:
    raw = {POLICY: policy_figures, **measure.figures(), **measure.schedule_figures()}
    if plain_figures is not None:
        raw[POLICY_PLAIN] = plain_figures
    strategies = scored(raw)
    names = [strategy_name(s) for s in measure.family]
    best = max(names, key=lambda n: (strategies[n].score, -names.index(n))) if names else ""
    plan = measure.oracle_schedules or measure.oracle
    return ScheduleView(
        family=tuple(names),
        strategies=strategies,
        best_static_schedule=best,
        oracle_source=plan.source,
        oracle_plan=tuple(strategy_name(c) for c in plan.configs),
    )


def run_scenario(
    path: str | Path, schedules: bool = True, experiments: str = "on", planner: bool = False,
    allow_outages: bool = True,
) -> ScenarioResult:
    """Every strategy on one scenario file: the policy (with canary experiments ``on``,
    ``off``, or both: ``compare``; by the rules, or by the planner with ``planner``; with
    autotune.allowOutages ``allow_outages`` unless the scenario sets it), every static
    choice, the oracle (and, with ``schedules``, the schedule family, each static, and the
    oracle with it)."""
    if experiments not in EXPERIMENT_MODES:
        raise ValueError(f"experiments must be one of {', '.join(EXPERIMENT_MODES)}, got {experiments!r}")
    started = time.perf_counter()
    scenario = load_scenario(path)
    measure = yardstick(scenario, schedules)
    evaluator, configs, declared = measure.evaluator, measure.configs, measure.declared
    statics, oracle = measure.statics, measure.oracle
    variants: dict[str, PolicyVariant] = {}
    primary = None
    for enabled in EXPERIMENT_MODES[experiments]:
        variant, variant_run, variant_segments, variant_settings = run_variant(
            scenario, measure, enabled, planner, allow_outages)
        variants["on" if enabled else "off"] = variant
        if primary is None:
            primary = (variant_run, variant_segments, variant_settings)
    run, policy_segments, settings = primary
    plain_figures = None
    if schedules:
        # The policy again with autotune.schedules Off (and the primary variant's experiments).
        with_experiments = EXPERIMENT_MODES[experiments][0]
        plain = run_policy(
            scenario, policy_settings(scenario, experiments=with_experiments, schedules=False, planner=planner,
                                      allow_outages=allow_outages),
            experiments=with_experiments,
        )
        plain_figures = figures(engine.evaluate_schedule(scenario, evaluator, plain.schedule), len(plain.changes))

    policy_figures = figures(policy_segments, len(run.changes))
    strategies = scored({POLICY: policy_figures, **measure.figures()})
    peer_figures, peer_notes = _peer_figures(scenario, measure)
    static_names = [strategy_name(c) for c in configs]
    best_static = max(static_names, key=lambda n: (strategies[n].score, -static_names.index(n)))

    by_strategy = {POLICY: policy_segments, ORACLE: list(oracle.segments)}
    by_strategy.update((strategy_name(c), statics[c]) for c in configs)
    timelines = {
        name: [(s.start, s.end, s.config, s.goodput_tokens_per_s, s.e2e_p95_s) for s in segs]
        for name, segs in ((POLICY, policy_segments), (ORACLE, list(oracle.segments)))
    }
    truth = [
        (s.start, s.end, s.workload.request_rate, _effective_alpha(scenario, s.workload))
        for s in statics[OFF]
    ]
    return ScenarioResult(
        name=scenario.name,
        description=scenario.description,
        path=str(path),
        duration_s=scenario.duration,
        method=scenario.method,
        slo={"p95_e2e_s": scenario.slo.p95_e2e_s, "p95_tpot_s": scenario.slo.p95_tpot_s},
        strategies=strategies,
        phases=_phase_figures(scenario, by_strategy),
        events=_events(scenario, settings, run),
        timelines=timelines,
        truth=truth,
        changes=run.changes,
        alpha_trace=run.alpha_trace,
        oracle_source=oracle.source,
        elapsed_s=time.perf_counter() - started,
        evaluations=evaluator.evaluations,
        rules=run.rules,
        best_static=best_static,
        day_long_stationary=is_day_long_stationary(scenario),
        held_back=scenario.held_back,
        schedules=_schedule_view(measure, policy_figures, plain_figures) if schedules else None,
        variants=variants,
        peers=peer_figures,
        peer_notes=peer_notes,
    )


def _peer_figures(scenario: Scenario, measure: Yardstick) -> tuple[dict[str, Figures], dict[str, str]]:
    """Every peer (`peers.run_peers`) scored like the policy: against the best goodput and
    latency of the static choices and the oracle; a peer never sets a denominator. The notes
    say how each was configured, or why it does not apply."""
    best = engine.best_axes(f.axes for f in measure.figures().values())

    def score(segments) -> float:
        return engine.headline(engine.axes_of(list(segments)), best)[0]

    runs = peers.run_peers(scenario, measure.evaluator, measure.declared, measure.statics, measure.schedule_statics,
                           score)
    scored_peers = {
        name: figures(list(run.segments), 1).with_ratios(best) for name, run in runs.items() if run.applies
    }
    return scored_peers, {name: run.note for name, run in runs.items()}
