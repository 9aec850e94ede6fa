"""The capacity hedge (a rollout that takes replicas away: maxSurge 0, or maxUnavailable >= 1,
`PolicySettings.rollout_keeps_capacity`): it serves on the replicas left, so near their
capacity every restart is an overload and the running config is locked in; the hedge
insures against the load rising there."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable

from specdecode.control import memo
from specdecode.control import perfmodel
from specdecode.control.estimates import (
    Calibration, Estimate, phase, round_rel, switch_outlook, workload_of,
)
from specdecode.control.settings import PolicySettings
from specdecode.control.perfmodel import EngineParams, Workload


@dataclass(frozen=True)
class HedgeOutlook:
    """Switching from ``current`` to ``target`` now as insurance against a rising load.

    A rollout that does not keep capacity serves on the replicas left (R - maxUnavailable);
    once the load passes what they carry, any restart is an overload and the running config is
    locked in.
    The hedge compares two futures over the payback horizon: the load stays (the premium:
    what the switch costs today, restart included) or it rises to ``future_rate`` (the
    current config's capacity x ``hedge_overload``), where the target is faster by
    ``benefit``."""

    current: int
    target: int
    rollout_capacity_rps: float
    """What the replicas left serving during the rollout carry (the lower of both configs)."""
    future_rate: float
    horizon_s: float
    stay_future_s: float
    """Mean e2e latency of the current config at the future rate, over the horizon."""
    hedge_future_s: float
    premium: float
    """Relative latency lost by switching now if the load stays (restart included, >= 0)."""
    premium_s: float
    """The same in seconds of mean e2e latency over the payback horizon."""
    benefit: float
    """Relative latency saved at the future rate (1 - hedge / stay)."""

    @property
    def benefit_s(self) -> float:
        """Seconds of mean e2e latency saved at the future rate."""
        if not math.isfinite(self.stay_future_s):
            return math.inf if math.isfinite(self.hedge_future_s) else 0.0
        return self.stay_future_s - self.hedge_future_s

    def value(self, prior: float) -> float:
        """Expected mean-latency saving in seconds: > 0 means the insurance is worth its
        premium."""
        return prior * self.benefit_s - (1.0 - prior) * self.premium_s


def serving_in_rollout(settings: PolicySettings, replicas: int) -> int:
    """Replicas that keep serving while a rollout that takes replicas away restarts the others."""
    return replicas - max(1, min(settings.max_unavailable, replicas))


def rollout_capacity_of(
    calibration: Calibration,
    est: Estimate,
    configs: Iterable[perfmodel.Config],
    settings: PolicySettings,
    alpha: float | None = None,
) -> float | None:
    """What the replicas left serving during a rollout carry (the lowest over ``configs``);
    None where the rollout keeps capacity (`PolicySettings.rollout_keeps_capacity`) or with
    a single replica."""
    replicas = max(1, calibration.on.replicas)
    serving = serving_in_rollout(settings, replicas)
    if settings.rollout_keeps_capacity or serving < 1:
        return None
    return min(config_capacity(calibration, est, k, serving, alpha) for k in configs)


def config_capacity(
    calibration: Calibration, est: Estimate, k: perfmodel.Config, replicas: int, alpha: float | None = None
) -> float:
    """What ``replicas`` replicas at config ``k`` carry (requests/s) by ``calibration``, at the
    estimate's workload and acceptance ``alpha`` (default the estimate's): the capacity
    `estimates.predict` reports, without the latency figures around it."""
    workload = workload_of(est, est.alpha if alpha is None else alpha)
    return _capacity(calibration.params_for(k), workload, calibration.config(k), replicas)


def overloading_rollout(
    calibration: Calibration,
    est: Estimate,
    configs: Iterable[perfmodel.Config],
    settings: PolicySettings,
    rate: float,
    alpha: float | None = None,
) -> float | None:
    """The rollout capacity (`rollout_capacity_of`) when ``rate`` reaches
    ``restart_max_rollout_load`` of it: a restart now would overload the replicas left
    serving. None when it would not (or where the rollout keeps capacity, or with a single
    replica)."""
    capacity = rollout_capacity_of(calibration, est, configs, settings, alpha)
    if capacity is None or rate < settings.tuning.restart_max_rollout_load * capacity:
        return None
    return capacity


@memo.memoized(maxsize=8192)
def _capacity(params: EngineParams, workload: Workload, k: perfmodel.Config, replicas: int) -> float:
    """Capacity (requests/s) of ``replicas`` replicas at config k, memoized."""
    return perfmodel.steady_state(params, workload, k, replicas).capacity_rps


def hedge_outlook(
    calibration: Calibration,
    est: Estimate,
    current: int,
    target: int,
    settings: PolicySettings,
    rate: float | None = None,
    zone: float = 0.0,
    peak_rate: float | None = None,
    alpha: float | None = None,
) -> HedgeOutlook | None:
    """The hedge from ``current`` to ``target``; None when it does not apply: a rollout that
    keeps capacity, a single replica, a target without ``hedge_min_capacity_gain`` more
    capacity, ``rate`` (default: the estimate's) below ``zone`` x the rollout's capacity, or
    ``peak_rate`` (when given) at or above it (too late: the rollout itself would overload)."""
    t = settings.tuning
    replicas = max(1, calibration.on.replicas)
    serving = serving_in_rollout(settings, replicas)
    if settings.rollout_keeps_capacity or serving < 1:
        return None
    horizon = t.payback_horizon_s
    slo = (settings.slo_e2e_s, settings.slo_tpot_s)
    workload = workload_of(est, est.alpha if alpha is None else alpha)

    def at(k: int, load: Workload, n: int) -> perfmodel.PhaseResult:
        return phase(calibration.params_for(k), load, calibration.config(k), horizon, 0.0, n, *slo)

    def capacity(k: int, n: int) -> float:
        return _capacity(calibration.params_for(k), workload, calibration.config(k), n)

    cap_current = capacity(current, replicas)
    if not capacity(target, replicas) >= cap_current * (1.0 + t.hedge_min_capacity_gain):
        return None
    rollout_capacity = min(capacity(current, serving), capacity(target, serving))
    rate = est.request_rate if rate is None else rate
    if rate < zone * rollout_capacity:
        return None
    if peak_rate is not None and peak_rate >= rollout_capacity:
        return None
    future_rate = round_rel(cap_current * t.hedge_overload, 0.01)
    future = replace(workload, request_rate=future_rate)
    stay = at(current, future, replicas).e2e_mean_s
    hedge = at(target, future, replicas).e2e_mean_s
    if not math.isfinite(hedge):
        benefit = 0.0
    elif not math.isfinite(stay) or stay <= 0:
        benefit = 1.0
    else:
        benefit = 1.0 - hedge / stay
    premium = premium_s = 0.0
    if benefit >= t.hedge_min_benefit:
        outlook = switch_outlook(calibration, est, current, target, settings, alpha)
        saving = outlook.saving
        premium = max(0.0, -saving) if math.isfinite(saving) else math.inf
        arrivals = workload.request_rate * t.payback_horizon_s
        if not math.isfinite(outlook.switch_request_s):
            premium_s = math.inf
        elif arrivals > 0:
            premium_s = max(0.0, outlook.switch_request_s - outlook.stay_request_s) / arrivals
    return HedgeOutlook(
        current=current,
        target=target,
        rollout_capacity_rps=rollout_capacity,
        future_rate=future_rate,
        horizon_s=horizon,
        stay_future_s=stay,
        hedge_future_s=hedge,
        premium=premium,
        premium_s=premium_s,
        benefit=benefit,
    )


def best_hedge(
    calibration: Calibration,
    est: Estimate,
    current: int,
    candidates: Iterable[int],
    settings: PolicySettings,
    rate: float,
    zone: float,
    peak_rate: float | None = None,
    alpha: float | None = None,
) -> HedgeOutlook | None:
    """The most valuable hedge from ``current`` at load ``rate`` (``peak_rate``: the highest
    recent load) with the zone threshold ``zone``, or None when none is worth its premium."""
    t = settings.tuning
    best: HedgeOutlook | None = None
    for target in candidates:
        if target == current:
            continue
        outlook = hedge_outlook(
            calibration, est, current, target, settings, rate, zone, peak_rate, alpha
        )
        if outlook is None or outlook.benefit < t.hedge_min_benefit:
            continue
        value = outlook.value(t.hedge_rise_prior)
        if value > 0 and (best is None or value > best.value(t.hedge_rise_prior)):
            best = outlook
    return best
