"""The policy's plan: the planner (`planner.plan`) fed with what the policy can really have.

- **The model**: the performance model calibrated on this window's metrics
  (`estimates.Calibration`), at the acceptance the window measured.
- **The future**: the service's own load history (`forecast`), over ``SLOTS``.
- **The present**: the queue the window saw as the first slot's backlog, and the load that
  arrives (past capacity, the finished rate is only what the replicas manage to serve).
- **The transitions**: the spec's rollout (maxSurge, maxUnavailable) and the measured restart
  price (`planner.rollout_pieces`); a replica that restarts serves nothing meanwhile.

What the plan decides is only its first slot (receding horizon: the next evaluation plans
again on newer metrics); the rest of it is what makes the first slot's choice right: a peak
the forecast sees in an hour is met prepared by a move at the calm, and a config that cannot
carry its load pays a queue that grows for as long as it runs.

Pure: time comes in as ``now``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from specdecode.control import planner
from specdecode.control.decision import PlanSummary
from specdecode.control.estimates import Calibration, Estimate, phase, workload_of
from specdecode.control.forecast import Forecast
from specdecode.control.perfmodel import Config, config_label, outage, steady_state
from specdecode.control.settings import PolicySettings

SLOTS = (900.0, 900.0, 1800.0, 3600.0, 3600.0)
"""The planning horizon: three hours, finer near the present (where the plan acts) than at
its end (where it only values what the first slot leads to)."""

WEIGHTS = (0.1, 1.0, 10.0)
"""The goodput weights of the policy's DPs: latency first, balanced, goodput first (the
oracle searches more; three cover the plans that differ at a policy's resolution)."""

SHORTLIST = 3
"""Configs kept per slot for the search, by the model's steady latency at that slot's load
(plus off and the running config): a full search over 9 configs costs ten times as much and
finds the same first move."""


@dataclass(frozen=True)
class PolicyPlan:
    """A plan in the policy's words."""

    plan: planner.Plan
    forecast: Forecast
    configs: tuple[Config, ...]
    """The configs searched."""

    @property
    def first(self) -> Config:
        return self.plan.first

    def move_gain(self, target: Config) -> float:
        """How much moving to ``target`` now and keeping it scores above keeping the running
        config, relative (< 0: it loses): what the move is worth should this plan's future
        come instead of the one the move was planned for."""
        stay = self.plan.stay_score
        moved = next((score for path, score in self.plan.candidates
                      if path.source.startswith("static:") and path.configs[0] == target), None)
        if moved is None:
            return 0.0
        if stay <= 0:
            return math.inf if moved > 0 else 0.0
        return moved / stay - 1.0

    def summary(self, current: Config) -> PlanSummary:
        """The plan as status shows it."""
        gain = self.plan.gain if self.first != current else 0.0
        return PlanSummary(
            configs=tuple(config_label(c) for c in self.plan.chosen.configs),
            slot_s=SLOTS,
            forecast_rps=self.forecast.rates,
            forecast_method=self.forecast.method,
            period_s=self.forecast.period_s,
            gain=gain,
        )

    def describe(self, current: Config) -> str:
        """The plan for a reason: what runs when, and what it expects against staying."""
        chosen = self.plan.chosen
        steps, at, prev = [], 0.0, None
        for c, duration in zip(chosen.configs, SLOTS):
            if c != prev:
                steps.append(f"{config_label(c)} {'now' if at == 0 else f'at +{at / 60:.0f}m'}")
            prev = c
            at += duration
        rates = "/".join(f"{r:.3g}" for r in self.forecast.rates)
        how = self.forecast.method
        if self.forecast.period_s:
            how += f", period {self.forecast.period_s / 3600:.3g}h"
        text = f"plan {', '.join(steps)} over {sum(SLOTS) / 3600:.0f}h (forecast {rates} req/s, {how})"
        if chosen.configs[0] != current:
            text += f"; {self.plan.gain:+.1%} on the headline score against keeping {config_label(current)} now"
        return text


def plan_now(
    calibration: Calibration,
    est: Estimate,
    settings: PolicySettings,
    current: Config,
    configs: Sequence[Config],
    forecast: Forecast,
    alpha: float | None = None,
) -> PolicyPlan:
    """The plan from ``current`` over ``forecast`` (its rates: what arrives), with the
    calibrated model at ``alpha`` (default: the window's), the window's queue as the first
    slot's backlog."""
    alpha = est.alpha if alpha is None else alpha
    workloads = [
        workload_of(est, alpha, rate_factor=(rate / est.request_rate) if est.request_rate > 0 else 0.0)
        for rate in forecast.rates
    ]
    replicas = max(1, calibration.on.replicas)
    shape = planner.RolloutShape(replicas, settings.max_surge, settings.max_unavailable, settings.restart_s)
    slo = (settings.slo_e2e_s, settings.slo_tpot_s)
    runs: dict[tuple, planner.SlotRun] = {}

    def piece(config: Config, workload, seconds: float, queue: float, serving: int):
        params, engine_config = calibration.params_for(config), calibration.config(config)
        if serving <= 0:
            e2e, _, queue_end = outage(params, workload, engine_config, seconds, queue)
            return seconds * e2e, 0.0, queue_end
        result = phase(params, workload, engine_config, seconds, round(queue, 1), serving, *slo)
        return seconds * result.e2e_mean_s, seconds * result.goodput_tokens_per_s, result.queue_end

    def run_slot(i: int, prev: Config, c: Config, queue: float) -> planner.SlotRun:
        key = (i, prev, c, round(queue, 1))
        hit = runs.get(key)
        if hit is not None:
            return hit
        duration, workload = SLOTS[i], workloads[i]
        pieces = planner.rollout_pieces(prev, c, shape) if prev != c else (planner.Piece(0.0, c, replicas),)
        latency = good = 0.0
        for j, p in enumerate(pieces):
            if p.offset >= duration:
                break
            end = pieces[j + 1].offset if j + 1 < len(pieces) else duration
            seconds = min(end, duration) - p.offset
            if seconds <= 0:
                continue
            lat, gd, queue = piece(p.config, workload, seconds, queue, p.serving)
            latency += lat
            good += gd
        hit = planner.SlotRun(latency, good, queue)
        runs[key] = hit
        return hit

    searched = _shortlist(calibration, workloads, current, configs, replicas)
    result = planner.plan(SLOTS, searched, current, run_slot, WEIGHTS)
    return PolicyPlan(result, forecast, tuple(searched))


def _shortlist(
    calibration: Calibration, workloads, current: Config, configs: Sequence[Config], replicas: int,
) -> tuple[Config, ...]:
    """Off, the running config, and the ``SHORTLIST`` configs with the lowest steady latency
    at each distinct load of the forecast."""
    keep = {current}
    if 0 in configs:
        keep.add(0)
    seen = set()
    for workload in workloads:
        if workload in seen:
            continue
        seen.add(workload)
        ranked = sorted(configs, key=lambda c: (_steady_rank(calibration, workload, c, replicas), c))
        keep.update(ranked[:SHORTLIST])
    return tuple(c for c in configs if c in keep) + ((current,) if current not in configs else ())


def _steady_rank(calibration: Calibration, workload, c: Config, replicas: int) -> tuple[float, float]:
    """Steady mean e2e latency, and for configs that cannot carry the load, their shortfall."""
    state = steady_state(calibration.params_for(c), workload, calibration.config(c), replicas)
    if state.capacity_rps > workload.request_rate and math.isfinite(state.e2e_s):
        return 0.0, state.e2e_s
    return 1.0, -state.capacity_rps
