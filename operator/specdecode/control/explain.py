"""Explanations: how decisions put configs, durations, ratios and acceptance into words.
Only reasons and messages use these; no rule reads them back."""

from __future__ import annotations

import math
from typing import Iterable, Mapping

from specdecode.control.decision import ConfigPrediction
from specdecode.control.estimates import Estimate
from specdecode.control.hedge import HedgeOutlook


def label(k: int | None) -> str:
    return "off" if not k else f"K={k}"


def shut_way_out(rate: float, capacity: float, floor: float, exit_config: int) -> str:
    """Why a config would shut the acceptance floor's way out: should acceptance fall to the
    floor, the rollout to ``exit_config`` would load the replicas left serving past what a
    restart may (see `rules._exit_closed`)."""
    return (
        f"it would shut the acceptance floor's way out (should acceptance fall to {floor:.2f}, a rollout "
        f"to {label(exit_config)} would load the replicas left serving to {rate / capacity:.0%} of the "
        f"{capacity:.1f} req/s they carry)"
    )


def fmt_s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "inf"
    if seconds < 1:
        return f"{seconds * 1000:.1f}ms"
    if seconds < 120:
        return f"{seconds:.2f}s"
    return f"{seconds / 60:.1f}min"


def fmt_pct(value: float) -> str:
    return "inf" if not math.isfinite(value) else f"{value:.0%}"


def fmt_x(value: float) -> str:
    return "inf" if not math.isfinite(value) else f"{value:.2f}x"


def summary(preds: Mapping[int, ConfigPrediction], first: Iterable[int]) -> str:
    """'off 1.00x, K=3 0.82x' for the named configs (speedups vs the current config; a K that
    runs as the schedule in effect by the schedule's label)."""
    seen: list[int] = []
    for k in first:
        if k in preds and k not in seen:
            seen.append(k)
    return ", ".join(f"{preds[k].schedule or label(k)} {fmt_x(preds[k].speedup)}" for k in seen)


def fmt_alpha(est: Estimate) -> str:
    if est.alpha_pooled is None:
        return "unknown"
    return f"{est.alpha_pooled:.2f}+-{(est.alpha_stderr or 0.0):.2f}"


def describe_hedge(h: HedgeOutlook, rate: float) -> str:
    return (
        f"{rate:.2f} req/s is near the {h.rollout_capacity_rps:.1f} req/s the replicas left "
        f"serving during a rollout carry; if the load rises to {h.future_rate:.1f} req/s "
        f"({label(h.current)}'s capacity) {label(h.current)} is locked in, at "
        f"{fmt_s(h.stay_future_s)} mean e2e vs {fmt_s(h.hedge_future_s)} for "
        f"{label(h.target)} ({fmt_pct(h.benefit)} faster); switching now costs "
        f"{fmt_pct(h.premium)} of latency ({fmt_s(h.premium_s)} mean e2e over "
        f"{fmt_s(h.horizon_s)}, restart included) if the load stays"
    )
