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

Phase oracle (BENCHMARK.md, binding): a dynamic program over phases x configs (off and each K
within the bounds). The value of (phase i, config c) is the least time-integrated mean e2e
latency up to the end of phase i when phase i runs c; a switch at a phase start pays the
rollout above inside that phase (a rollout longer than the phase is cut at its end), and the
queue is carried along the best path. The oracle's schedule is the DP's best path, or a
static schedule when one scores better (the DP carries one queue per state, so it is exact
only where queues drain within phases; taking the best of both keeps the oracle at least as
good as every static choice, which a test checks). Minimising the mean latency maximises the
headline score: the oracle scores 1 by definition and any strategy slower than it scores
below 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from specdecode import perfmodel
from specdecode.perfmodel import OFF, EngineParams, Workload
from specdecode.scenario import Scenario


@dataclass(frozen=True)
class Serving:
    """What serves from ``start`` on: ``config`` on ``replicas`` Ready replicas."""

    start: float
    config: int
    replicas: int
    rolling: bool = False


@dataclass(frozen=True)
class Segment:
    """One stretch of constant truth and serving, evaluated by the performance model."""

    start: float
    end: float
    phase_index: int
    workload: Workload
    config: int
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

    def evaluate(self, workload: Workload, config: int, duration: float, queue: float, replicas: int) -> _Eval:
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

    def _outage(self, workload: Workload, config: int, duration: float, queue: float) -> _Eval:
        """No replica serves: arrivals wait (half the outage on average, plus the backlog
        ahead of them at one replica's capacity), then get the one-replica service time."""
        one = perfmodel.steady_state(self.params, workload, config, 1)
        service = one.service_s if math.isfinite(one.service_s) else 0.0
        drain = queue / one.capacity_rps if one.capacity_rps > 0 else duration
        wait = duration / 2.0 + drain
        return _Eval(
            arrivals=workload.request_rate * duration,
            e2e_mean_s=wait + service,
            e2e_p95_s=duration + drain + service,
            tpot_mean_s=one.tpot_s,
            tpot_p95_s=one.tpot_p95_s,
            goodput=0.0,
            generation=0.0,
            queue_end=queue + workload.request_rate * duration,
        )


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
    if noise is not None and (noise.acceptance_sd > 0 or noise.request_rate_cv > 0):
        n = int(math.floor(scenario.duration / noise.period))
        breaks.update(i * noise.period for i in range(1, n + 1) if i * noise.period < scenario.duration)
    return sorted(b for b in breaks if 0.0 <= b <= scenario.duration)


def rollout(start: float, old: int, new: int, replicas: int, rollout_s: float) -> list[Serving]:
    """The serving schedule of a change at ``start``: one replica at a time restarts."""
    if replicas <= 1:
        return [Serving(start, new, 0, True), Serving(start + rollout_s, new, max(replicas, 1))]
    out = []
    for j in range(replicas):
        serving = replicas - 1
        on_new = j
        config = new if on_new * 2 > serving else old
        out.append(Serving(start + j * rollout_s, config, serving, True))
    out.append(Serving(start + replicas * rollout_s, new, replicas))
    return out


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
            )
        )
        queue = r.queue_end
    return segments


def static_schedule(config: int, replicas: int) -> list[Serving]:
    return [Serving(0.0, config, replicas)]


def latency_integral(segments: Iterable[Segment]) -> float:
    """Time-integrated mean e2e latency: the oracle's objective (lower is better)."""
    return math.fsum(s.duration * s.e2e_mean_s for s in segments)


@dataclass(frozen=True)
class OraclePlan:
    """The oracle's choice: one config per phase, its schedule and its segments."""

    configs: tuple[int, ...]
    schedule: tuple[Serving, ...]
    segments: tuple[Segment, ...]
    changes: int
    source: str
    """"dp" or "static:<config>" when a static schedule beat the DP's path."""


def phase_oracle(
    scenario: Scenario,
    evaluator: SegmentEvaluator,
    configs: Sequence[int],
    static_segments: dict[int, list[Segment]] | None = None,
) -> OraclePlan:
    """The DP over phases x configs (see the module doc)."""
    params = evaluator.params
    replicas = params.replicas
    breaks = truth_breaks(scenario)
    spans = list(scenario.phase_spans())
    # value[c] = (cost, queue, path, segments) of the best path ending with config c.
    value: dict[int, tuple[float, float, tuple[int, ...], tuple[Segment, ...]]] = {}
    for i, (start, end, _) in enumerate(spans):
        new_value = {}
        for c in configs:
            best = None
            candidates = [(None, 0.0, 0.0, (), ())] if i == 0 else [
                (p, *value[p]) for p in configs
            ]
            for prev, cost, queue, path, segs in candidates:
                if prev is None or prev == c:
                    schedule = [Serving(start, c, replicas)]
                else:
                    schedule = [
                        s for s in rollout(start, prev, c, replicas, params.rollout_s) if s.start < end
                    ]
                phase_segments = evaluate_schedule(scenario, evaluator, schedule, start, end, queue, breaks)
                total = cost + latency_integral(phase_segments)
                if best is None or total < best[0]:
                    best = (total, phase_segments[-1].queue_end, path + (c,), segs + tuple(phase_segments))
            new_value[c] = best  # type: ignore[assignment]
        value = new_value
    best_c = min(value, key=lambda c: (value[c][0], c))
    total, _, path, segments = value[best_c]
    schedule: list[Serving] = []
    changes = 0
    for i, (start, _end, _) in enumerate(spans):
        c = path[i]
        if i == 0:
            schedule.append(Serving(0.0, c, replicas))
        elif c != path[i - 1]:
            changes += 1
            schedule.extend(rollout(start, path[i - 1], c, replicas, params.rollout_s))
    plan = OraclePlan(tuple(path), tuple(schedule), tuple(segments), changes, "dp")
    for config, segs in (static_segments or {}).items():
        if latency_integral(segs) < total:
            total = latency_integral(segs)
            plan = OraclePlan(
                tuple(config for _ in spans), tuple(static_schedule(config, replicas)),
                tuple(segs), 0, f"static:{config}",
            )
    return plan


def configs_of(params: EngineParams) -> tuple[int, ...]:
    """Off and every K within the scenario's bounds."""
    return (OFF, *range(params.min_k, params.max_k + 1))
