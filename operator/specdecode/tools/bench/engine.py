"""Scoring a strategy: the serving timeline, its segments, and the phase oracle.

Every strategy (the policy, each static choice, the oracle) is reduced to a *serving
schedule*: piecewise-constant (config, serving replicas) over the scenario. The schedule is
cut into segments wherever the truth (phase, noise period) or the serving changes, and each
segment is evaluated by `perfmodel.evaluate_phase` with the scenario's true engine, the true
workload of that stretch and the queue carried over from the previous segment. The same
evaluator, memoized, scores everyone: differences between strategies come from their
schedules only.

Rollout (a change of config; Kubernetes defaults the operator renders: maxSurge 0,
maxUnavailable 1): replicas restart one at a time, each serving nothing for
``params.rollout_s``; while replica j (0-based) restarts, the R - 1 others serve, j of them
already on the new config. The segment is evaluated at the config most serving replicas run
(ties: the old one), which is exact for two replicas: old config during the first restart,
new during the second. With one replica a rollout is an outage: arrivals wait.

Canary experiment (issue #15): ``Serving.candidate_replicas`` Ready replicas run the
candidate beside the incumbent's; traffic is shared per Ready replica, so each arm is
evaluated at its share of the arrivals (and of the queue entering the segment) and the
segment's figures are the arms' figures mixed by arrivals. A capacity-neutral canary
(maxSurge 0) takes its replicas from the main Deployment: from its creation until it is
Ready (the scenario's ``rollout_s``) those replicas serve nothing, and after an abort the
main Deployment's replacement pods take as long again (`canary_start`, `canary_end`).

Phase oracle (BENCHMARK.md, binding): a dynamic program over phases x configs (off and each K
within the bounds; with schedules, also the scenario's `schedule_family` of per-batch-size K
schedules) that maximises the headline score, starting, like every strategy, at the
service's declared config and paying the same rollout for each change; see `phase_oracle`
for how a per-phase recursion maximises a score that is a min of two whole-scenario ratios.
Static choices start at the declared config too: one that differs switches at time 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Iterable, Sequence

from specdecode.control import perfmodel, planner
from specdecode.control.planner import ORACLE_WEIGHTS, Axes, best_axes, headline
from specdecode.control.perfmodel import OFF, Config, EngineParams, Schedule, Workload
from specdecode.tools.scenario import Scenario


@dataclass(frozen=True)
class Serving:
    """What serves from ``start`` on: ``config`` on ``replicas`` Ready replicas."""

    start: float
    config: Config
    replicas: int
    rolling: bool = False
    candidate: Config | None = None
    """A running canary experiment's config (None: no canary serving)."""
    candidate_replicas: int = 0
    """Ready canary replicas beside the ``replicas`` that run ``config``."""


@dataclass(frozen=True)
class Segment:
    """One stretch of constant truth and serving, evaluated by the performance model."""

    start: float
    end: float
    phase_index: int
    workload: Workload
    config: Config
    replicas: int
    rolling: bool
    arrivals: float
    e2e_mean_s: float
    e2e_p95_s: float
    tpot_mean_s: float
    tpot_p95_s: float
    goodput_tokens_per_s: float
    generation_tokens_per_s: float
    queue_end: float
    slo_violated: bool
    candidate: Config | None = None
    candidate_replicas: int = 0
    candidate_worse: bool = False
    """The canary's arm had a higher mean e2e latency than the incumbent's arm here."""

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class _Eval:
    arrivals: float
    e2e_mean_s: float
    e2e_p95_s: float
    tpot_mean_s: float
    tpot_p95_s: float
    goodput: float
    generation: float
    queue_end: float


class SegmentEvaluator:
    """`perfmodel.evaluate_phase` for one scenario's true engine and SLO, memoized.

    The queue entering a segment is rounded to 0.1 requests for the memo key (and used
    rounded), far below what changes a latency.
    """

    def __init__(self, params: EngineParams, slo_e2e_s: float | None, slo_tpot_s: float | None):
        self.params = params
        self.slo_e2e_s = slo_e2e_s
        self.slo_tpot_s = slo_tpot_s
        self._memo: dict[tuple, _Eval] = {}
        self._truths: dict[float, tuple[int, Workload]] = {}
        self.evaluations = 0

    def truth(self, scenario: Scenario, at: float) -> tuple[int, Workload]:
        """(phase index, quantized true workload) at ``at``, memoized: the oracle's DP and
        every strategy cut the timeline at the same points."""
        hit = self._truths.get(at)
        if hit is None:
            conditions = scenario.true_conditions(at)
            hit = (conditions.phase_index, quantized(conditions.workload))
            self._truths[at] = hit
        return hit

    def evaluate(self, workload: Workload, config: Config, duration: float, queue: float, replicas: int) -> _Eval:
        queue = round(max(0.0, queue), 1)
        key = (workload, config, round(duration, 3), queue, replicas)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        self.evaluations += 1
        if replicas <= 0:
            result = self._outage(workload, config, duration, queue)
        else:
            phase = perfmodel.evaluate_phase(
                self.params, workload, config, duration, queue, replicas,
                self.slo_e2e_s, self.slo_tpot_s,
            )
            result = _Eval(
                arrivals=phase.arrivals,
                e2e_mean_s=phase.e2e_mean_s,
                e2e_p95_s=phase.e2e_p95_s,
                tpot_mean_s=phase.tpot_mean_s,
                tpot_p95_s=phase.tpot_p95_s,
                goodput=phase.goodput_tokens_per_s,
                generation=phase.generation_tokens_per_s,
                queue_end=phase.queue_end,
            )
        self._memo[key] = result
        return result

    def evaluate_canary(
        self, workload: Workload, config: Config, replicas: int, candidate: Config, candidate_replicas: int,
        duration: float, queue: float,
    ) -> tuple[_Eval, bool]:
        """Both arms of a canary experiment at their per-replica share of the traffic, mixed by
        arrivals; and whether the canary's arm was slower end to end than the incumbent's."""
        total = replicas + candidate_replicas
        share = candidate_replicas / total
        canary = self.evaluate(_scaled(workload, share), candidate, duration, queue * share, candidate_replicas)
        worse = slower_per_replica(self, workload, candidate, config, total, duration)
        if replicas <= 0:
            return canary, worse
        main = self.evaluate(_scaled(workload, 1.0 - share), config, duration, queue * (1.0 - share), replicas)
        return _mixed(main, canary), worse

    def _outage(self, workload: Workload, config: Config, duration: float, queue: float) -> _Eval:
        """No replica serves (`perfmodel.outage`)."""
        e2e_mean, e2e_p95, queue_end = perfmodel.outage(self.params, workload, config, duration, queue)
        one = perfmodel.steady_state(self.params, workload, config, 1)
        return _Eval(
            arrivals=workload.request_rate * duration,
            e2e_mean_s=e2e_mean,
            e2e_p95_s=e2e_p95,
            tpot_mean_s=one.tpot_s,
            tpot_p95_s=one.tpot_p95_s,
            goodput=0.0,
            generation=0.0,
            queue_end=queue_end,
        )


def slower_per_replica(
    evaluator: SegmentEvaluator, workload: Workload, config: Config, reference: Config, replicas: int,
    duration: float,
) -> bool:
    """Whether one replica at ``config`` serves its share (1 / ``replicas``) of ``workload``
    with a higher mean end-to-end latency than one at ``reference`` would (no queue): the
    truth's verdict on a probe, whatever the policy measured."""
    share = _scaled(workload, 1.0 / max(1, replicas))
    ours = evaluator.evaluate(share, config, duration, 0.0, 1).e2e_mean_s
    theirs = evaluator.evaluate(share, reference, duration, 0.0, 1).e2e_mean_s
    return ours > theirs


def _scaled(workload: Workload, share: float) -> Workload:
    return replace(workload, request_rate=workload.request_rate * share)


def _mixed(*arms: _Eval) -> _Eval:
    """Arms serving side by side: sums of arrivals, goodput, generation and queue; means and
    P95s of the arrivals-weighted mixture."""
    arrivals = math.fsum(a.arrivals for a in arms)
    weights = [a.arrivals if arrivals > 0 else 1.0 for a in arms]
    total = math.fsum(weights)

    def mean(attr: str) -> float:
        return math.fsum(w * getattr(a, attr) for w, a in zip(weights, arms)) / total

    return _Eval(
        arrivals=arrivals,
        e2e_mean_s=mean("e2e_mean_s"),
        e2e_p95_s=mixture_p95([(w, a.e2e_mean_s, a.e2e_p95_s) for w, a in zip(weights, arms)]),
        tpot_mean_s=mean("tpot_mean_s"),
        tpot_p95_s=mixture_p95([(w, a.tpot_mean_s, a.tpot_p95_s) for w, a in zip(weights, arms)]),
        goodput=math.fsum(a.goodput for a in arms),
        generation=math.fsum(a.generation for a in arms),
        queue_end=math.fsum(a.queue_end for a in arms),
    )


_Z95 = NormalDist().inv_cdf(0.95)


def _sigma(mean: float, p95: float) -> float:
    """Lognormal sigma from mean and P95 (smaller root of s^2/2 - z s + ln(p95/mean) = 0)."""
    if not (mean > 0 and math.isfinite(mean) and math.isfinite(p95)) or p95 <= mean:
        return 0.0
    disc = _Z95 * _Z95 - 2.0 * math.log(p95 / mean)
    return _Z95 - math.sqrt(max(0.0, disc))


def mixture_p95(items: list[tuple[float, float, float]]) -> float:
    """P95 of a weighted mixture of lognormals given as (weight, mean, p95)."""
    total = math.fsum(w for w, _, _ in items)
    if total <= 0:
        return math.nan
    if math.fsum(w for w, m, _ in items if not math.isfinite(m)) > 0.05 * total:
        return math.inf
    parts = []
    for w, mean, p95 in items:
        if not math.isfinite(mean) or mean <= 0:
            continue
        sigma = _sigma(mean, p95)
        parts.append((w / total, math.log(mean) - sigma * sigma / 2.0, sigma, mean))
    norm = NormalDist()

    def cdf(x: float) -> float:
        acc = 0.0
        for w, mu, sigma, mean in parts:
            if sigma <= 0:
                acc += w if x >= mean else 0.0
            else:
                acc += w * norm.cdf((math.log(x) - mu) / sigma)
        return acc

    lo, hi = 0.0, max(p for _, _, p in items if math.isfinite(p)) * 2 + 1e-6
    while cdf(hi) < 0.95 and hi < 1e9:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        if mid <= 0 or cdf(mid) < 0.95:
            lo = mid
        else:
            hi = mid
    return hi


def quantized(workload: Workload) -> Workload:
    """The truth rounded to 0.005 of acceptance and 0.5% of request rate before scoring.

    Noise draws differ in every period; rounding them far below their own spread lets
    strategies and the oracle share evaluations of the same stretch.
    """
    rate = workload.request_rate
    if rate > 0:
        step = math.log1p(0.005)
        rate = math.exp(round(math.log(rate) / step) * step)
    return Workload(
        request_rate=rate,
        prompt_tokens=workload.prompt_tokens,
        output_tokens=workload.output_tokens,
        temperature=workload.temperature,
        acceptance=round(workload.acceptance * 200) / 200,
    )


def truth_breaks(scenario: Scenario) -> list[float]:
    """Times where the true conditions may change: phase starts and noise periods."""
    breaks = {0.0, scenario.duration}
    breaks.update(p.at for p in scenario.phases)
    noise = scenario.noise
    if noise.wanders:
        n = int(math.floor(scenario.duration / noise.period))
        breaks.update(i * noise.period for i in range(1, n + 1) if i * noise.period < scenario.duration)
    return sorted(b for b in breaks if 0.0 <= b <= scenario.duration)


def rollout(start: float, old: Config, new: Config, replicas: int, rollout_s: float) -> list[Serving]:
    """The serving schedule of a change at ``start``: the planner's rollout (maxSurge 0,
    maxUnavailable 1, as the benchmark's services declare), one replica at a time."""
    pieces = planner.rollout_pieces(old, new, planner.RolloutShape(replicas, 0, 1, rollout_s))
    last = len(pieces) - 1
    return [Serving(start + p.offset, p.config, p.serving, i < last) for i, p in enumerate(pieces)]


def canary_start(
    start: float, incumbent: Config, candidate: Config, replicas: int, canary_replicas: int, borrowed: int,
    rollout_s: float,
) -> list[Serving]:
    """The serving schedule of a canary created at ``start``: the main Deployment gives up
    ``borrowed`` replicas at once (capacity-neutral; 0 when the canary is extra, within the
    surge budget), and the canary's ``canary_replicas`` serve once Ready, ``rollout_s`` later."""
    main = replicas - borrowed
    return [
        Serving(start, incumbent, main, rolling=borrowed > 0),
        Serving(start + rollout_s, incumbent, main, candidate=candidate, candidate_replicas=canary_replicas),
    ]


def canary_end(start: float, incumbent: Config, replicas: int, borrowed: int, rollout_s: float) -> list[Serving]:
    """The serving schedule after a canary is deleted without a promotion: the main
    Deployment's ``borrowed`` replicas start again and serve ``rollout_s`` later."""
    if borrowed <= 0:
        return [Serving(start, incumbent, replicas)]
    return [Serving(start, incumbent, replicas - borrowed, rolling=True), Serving(start + rollout_s, incumbent, replicas)]


def evaluate_schedule(
    scenario: Scenario,
    evaluator: SegmentEvaluator,
    schedule: Sequence[Serving],
    start: float = 0.0,
    end: float | None = None,
    queue: float = 0.0,
    breaks: Sequence[float] | None = None,
) -> list[Segment]:
    """Segments of ``schedule`` over [start, end), carrying the queue from ``queue``."""
    end = scenario.duration if end is None else end
    breaks = truth_breaks(scenario) if breaks is None else breaks
    cuts = {start, end}
    cuts.update(b for b in breaks if start < b < end)
    cuts.update(s.start for s in schedule if start < s.start < end)
    times = sorted(cuts)
    segments: list[Segment] = []
    index = 0
    for a, b in zip(times, times[1:]):
        while index + 1 < len(schedule) and schedule[index + 1].start <= a:
            index += 1
        serving = schedule[index]
        phase_index, workload = evaluator.truth(scenario, a)
        candidate_worse = False
        if serving.candidate is not None and serving.candidate_replicas > 0:
            r, candidate_worse = evaluator.evaluate_canary(
                workload, serving.config, serving.replicas, serving.candidate, serving.candidate_replicas, b - a, queue,
            )
        else:
            r = evaluator.evaluate(workload, serving.config, b - a, queue, serving.replicas)
        violated = (
            (scenario.slo.p95_e2e_s is not None and r.e2e_p95_s > scenario.slo.p95_e2e_s)
            or (scenario.slo.p95_tpot_s is not None and r.tpot_p95_s > scenario.slo.p95_tpot_s)
        )
        segments.append(
            Segment(
                start=a, end=b, phase_index=phase_index, workload=workload,
                config=serving.config, replicas=serving.replicas, rolling=serving.rolling,
                arrivals=r.arrivals, e2e_mean_s=r.e2e_mean_s, e2e_p95_s=r.e2e_p95_s,
                tpot_mean_s=r.tpot_mean_s, tpot_p95_s=r.tpot_p95_s,
                goodput_tokens_per_s=r.goodput, generation_tokens_per_s=r.generation,
                queue_end=r.queue_end, slo_violated=bool(violated),
                candidate=serving.candidate if serving.candidate_replicas > 0 else None,
                candidate_replicas=serving.candidate_replicas, candidate_worse=candidate_worse,
            )
        )
        queue = r.queue_end
    return segments


def static_schedule(
    config: Config, replicas: int, declared: Config | None = None, rollout_s: float = 0.0
) -> list[Serving]:
    """A static choice: ``config`` all along; a service declared at another config switches
    to it at the start and pays the rollout like any other strategy."""
    if declared is None or declared == config:
        return [Serving(0.0, config, replicas)]
    return rollout(0.0, declared, config, replicas, rollout_s)


def latency_integral(segments: Iterable[Segment]) -> float:
    """Time-integrated mean e2e latency (lower is better)."""
    return math.fsum(s.duration * s.e2e_mean_s for s in segments)


def goodput_integral(segments: Iterable[Segment]) -> float:
    """Time-integrated goodput: good output tokens (higher is better)."""
    return math.fsum(s.duration * s.goodput_tokens_per_s for s in segments)


def axes_of(segments: Sequence[Segment]) -> Axes:
    """A strategy's two headline axes over the scenario (`planner.Axes`)."""
    total = math.fsum(s.duration for s in segments)
    if total <= 0:
        return Axes(0.0, math.inf)
    return Axes(goodput_integral(segments) / total, latency_integral(segments) / total)


@dataclass(frozen=True)
class OraclePlan:
    """The oracle's choice: one config per phase, its schedule and its segments."""

    configs: tuple[Config, ...]
    schedule: tuple[Serving, ...]
    segments: tuple[Segment, ...]
    changes: int
    source: str
    """"dp:mu=<weight>" (the scalarised DP that scored best) or "static:<config>"."""


def phase_oracle(
    scenario: Scenario,
    evaluator: SegmentEvaluator,
    configs: Sequence[Config],
    declared: Config,
    static_segments: dict[Config, list[Segment]],
) -> OraclePlan:
    """The plan over phases x configs that maximises the headline score: the policy's
    planner (`planner.plan`) fed with the truth (this scenario's evaluator, cut at every
    noise period) and the real future (the scenario's phases as slots), from the declared
    config, every change paying the same rollout inside its phase."""
    params = evaluator.params
    replicas = params.replicas
    breaks = truth_breaks(scenario)
    spans = list(scenario.phase_spans())
    runs: dict[tuple, planner.SlotRun] = {}

    def phase_run(i: int, prev: Config, c: Config, queue: float) -> planner.SlotRun:
        key = (i, prev, c, round(queue, 1))
        hit = runs.get(key)
        if hit is None:
            start, end, _ = spans[i]
            if prev == c:
                schedule = [Serving(start, c, replicas)]
            else:
                schedule = [s for s in rollout(start, prev, c, replicas, params.rollout_s) if s.start < end]
            segs = tuple(evaluate_schedule(scenario, evaluator, schedule, start, end, queue, breaks))
            hit = planner.SlotRun(latency_integral(segs), goodput_integral(segs), segs[-1].queue_end, segs)
            runs[key] = hit
        return hit

    statics = {
        c: planner.Path(
            tuple(c for _ in spans), _static_runs(segs, spans), f"static:{strategy_label(c)}"
        )
        for c, segs in static_segments.items()
    }
    chosen = planner.plan(
        [end - start for start, end, _ in spans], list(configs), declared, phase_run, ORACLE_WEIGHTS, statics,
    ).chosen
    path = chosen.configs
    segments = tuple(seg for run in chosen.runs for seg in run.detail)
    schedule: list[Serving] = []
    for i, (start, _end, _) in enumerate(spans):
        prev = declared if i == 0 else path[i - 1]
        if path[i] != prev:
            schedule.extend(rollout(start, prev, path[i], replicas, params.rollout_s))
        elif i == 0:
            schedule.append(Serving(0.0, path[i], replicas))
    return OraclePlan(tuple(path), tuple(schedule), segments, _changes(path, declared), chosen.source)


def _static_runs(segments: Sequence[Segment], spans) -> tuple[planner.SlotRun, ...]:
    """A static strategy's segments cut into the phases' slots."""
    out = []
    for start, end, _ in spans:
        segs = tuple(s for s in segments if start <= s.start < end)
        queue = segs[-1].queue_end if segs else 0.0
        out.append(planner.SlotRun(latency_integral(segs), goodput_integral(segs), queue, segs))
    return tuple(out)


def _changes(path: Sequence[Config], declared: Config) -> int:
    return sum(1 for prev, c in zip((declared, *path), path) if prev != c)


def strategy_label(config: Config) -> str:
    """``off``, ``K=<k>`` or ``sched[...]``: a config's name in reports."""
    return perfmodel.config_label(config)


def configs_of(params: EngineParams) -> tuple[int, ...]:
    """Off and every K within the scenario's bounds."""
    return params.configs()


SCHEDULE_FAMILY_MAX = 4
"""At most this many schedules join the oracle's configs (each one adds a row and a column
to its DP and a static strategy): the run stays cheap."""


def schedule_family(scenario: Scenario, declared: int) -> tuple[Schedule, ...]:
    """The schedules the oracle may choose in this scenario: what `perfmodel.propose_schedule`
    (the function the policy is to call on its observations) proposes from the truth.

    Inputs per phase: the true per-position acceptance at the phase's temperature and the
    mean running batch of the phase under speculation off and under the ``declared`` config
    (weighted by the phase's duration); over the whole scenario, every phase's batches and
    the duration-weighted acceptance; prompt and output lengths so each step carries its
    prefill. Candidates, in this order: the proposal over the whole
    scenario with every K; then, for each K that is some phase's best plain K (most common
    first), the proposal over the whole scenario with K bounded to {0, K}
    (speculate at K below an edge, K 0 above it: the schedule that follows a load swing) and
    the same with its edge one grid step (a factor 2) higher: the proposal's criterion holds
    the batch fixed, while at a given load speculation holds a smaller batch than K 0 does,
    so the edge that serves a load best can sit above the per-step crossover; then one proposal
    per phase (longest first). A proposal with one range is a plain K that pays a schedule's
    cost, never better than that K, so it is dropped; so are duplicates; at most
    ``SCHEDULE_FAMILY_MAX``.
    """
    params = scenario.params
    decay = params.acceptance_decay
    per_phase = []
    for start, end, phase in scenario.phase_spans():
        workload = phase.workload()
        alpha = perfmodel.effective_alpha(workload.acceptance, workload.temperature, params)
        weight = (end - start) / 2.0
        batches = [
            (perfmodel.steady_state(params, workload, c).batch, weight) for c in (OFF, declared)
        ]
        per_phase.append((end - start, alpha, batches, (workload.prompt_tokens, workload.output_tokens)))
    total = math.fsum(d for d, *_ in per_phase)
    alpha_all = math.fsum(d * a for d, a, *_ in per_phase) / total
    lengths_all = tuple(math.fsum(d * n[i] for d, _, _, n in per_phase) / total for i in (0, 1))
    batches_all = [b for *_, bs, _ in per_phase for b in bs]

    def proposal(alpha: float, batches, lengths: tuple[float, float], ks=None):
        prompt, output = lengths
        acceptance = [alpha * decay**i for i in range(params.max_k)]
        return perfmodel.propose_schedule(
            params, acceptance, batches, prompt + output / 2.0, ks,
            prompt_tokens=prompt, output_tokens=output,
        )

    phase_ks: dict[int, float] = {}
    for duration, alpha, batches, lengths in per_phase:
        k = proposal(alpha, batches, lengths).static_k
        if k > 0:
            phase_ks[k] = phase_ks.get(k, 0.0) + duration
    candidates = [lambda: proposal(alpha_all, batches_all, lengths_all).schedule]
    for k in sorted(phase_ks, key=lambda k: (-phase_ks[k], k)):
        candidates.append(lambda k=k: proposal(alpha_all, batches_all, lengths_all, (OFF, k)).schedule)
        candidates.append(
            lambda k=k: _edge_doubled(proposal(alpha_all, batches_all, lengths_all, (OFF, k)).schedule)
        )
    candidates += [
        (lambda a=a, bs=bs, n=n: proposal(a, bs, n).schedule)
        for _, a, bs, n in sorted(per_phase, key=lambda p: -p[0])
    ]
    family: list[Schedule] = []
    for make in candidates:
        schedule = make()
        if len(schedule.bands) > 1 and schedule not in family:
            family.append(schedule)
        if len(family) >= SCHEDULE_FAMILY_MAX:
            break
    return tuple(family)


def _edge_doubled(schedule: Schedule) -> Schedule:
    """A two-range schedule with its edge a factor 2 higher (a one-range one unchanged)."""
    if len(schedule.bands) != 2:
        return schedule
    (_, edge, k_low), (_, end, k_high) = schedule.bands
    edge = 2 * edge
    return Schedule(((1, edge, k_low), (edge + 1, max(end, edge + 1), k_high)))
