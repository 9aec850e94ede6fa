"""Canary experiments, the measuring half: is the candidate config better than the incumbent?

A canary replica runs the candidate config behind the same Service as the incumbent's
replicas, so both see the same traffic in the same windows. Each evaluation window gives one
paired sample per arm (per replica: the mean time per output token, the throughput, the P95
latencies). This module turns those pairs into a verdict, and nothing else: it reads no
clock and does no I/O, so the benchmark and the operator run the same test.

The test is sequential and always valid: it may be looked at after every window without
inflating the false-verdict rate. It is a mixture sequential probability ratio test (mSPRT,
Johari et al., "Always valid inference", 2017) on the paired log ratios
``d = log(tpot_candidate / tpot_incumbent)``, with a normal mixing distribution of scale
``tau`` and the variance estimated from the pairs themselves. A log ratio is the right scale:
a 5 % change means the same at 8 ms and at 40 ms per token, and the ratio of two means is
roughly normal once each arm has served a few hundred requests (the minimum enforced here).

Verdicts:
- ``PROMOTE``: the candidate is faster per token by a clear margin (the test rejects "no
  difference" and the estimate is below ``-min_effect``), and it broke no SLO.
- ``ABORT_WORSE``: clearly slower.
- ``ABORT_NO_GAIN``: the confidence interval lies inside ``±min_effect``: no difference worth a
  rollout (a restart of every replica is not free).
- ``ABORT_SLO``: the candidate broke a latency SLO that the incumbent kept in the same window;
  at once, whatever the statistics say.
- ``ABORT_TIMEOUT``: the maximum duration passed without a clear answer; the incumbent stays.
- ``CONTINUE``: not yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Optional, Sequence


class Verdict(StrEnum):
    CONTINUE = "Continue"
    PROMOTE = "Promote"
    ABORT_WORSE = "AbortWorse"
    ABORT_NO_GAIN = "AbortNoGain"
    ABORT_SLO = "AbortSLO"
    ABORT_TIMEOUT = "AbortTimeout"

    @property
    def final(self) -> bool:
        return self is not Verdict.CONTINUE


@dataclass(frozen=True)
class ArmWindow:
    """One arm of one evaluation window, per replica."""

    requests: float
    """Requests finished in the window (the arm's sample count)."""
    tpot_mean_s: Optional[float]
    tpot_p95_s: Optional[float] = None
    e2e_p95_s: Optional[float] = None
    generation_tps: Optional[float] = None

    @property
    def usable(self) -> bool:
        return self.requests > 0 and self.tpot_mean_s is not None and self.tpot_mean_s > 0


@dataclass(frozen=True)
class PairedWindow:
    at: float
    """End of the window, seconds since the epoch."""
    candidate: ArmWindow
    incumbent: ArmWindow


@dataclass(frozen=True)
class ExperimentSettings:
    alpha: float = 0.05
    """The test's level: the chance of promoting a candidate that is no faster (simulated with
    noisy windows: 1-3 % at alpha 0.05; a clear verdict either way under no difference: 4-7 %,
    the price of estimating the variance from the windows themselves)."""
    min_effect: float = 0.03
    """Smallest change of time per token worth a rollout (0.03: 3 %)."""
    tau: float = 0.05
    """Scale of the effects the test is tuned to find (log ratio); 0.05 ~ a 5 % change."""
    min_requests: float = 200.0
    """Requests each arm must have served before any statistical verdict."""
    min_windows: int = 3
    """Paired windows before the variance is trusted."""
    max_duration_s: float = 1800.0
    tpot_p95_slo_s: Optional[float] = None
    e2e_p95_slo_s: Optional[float] = None


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str
    windows: int
    candidate_requests: float
    incumbent_requests: float
    effect: Optional[float] = None
    """Estimated relative change of time per output token (candidate vs incumbent): -0.08 is
    8 % faster. None before three usable windows."""
    interval: Optional[tuple[float, float]] = None
    """Always-valid (1 - alpha) confidence interval of ``effect``."""
    evidence: Optional[float] = None
    """The mixture likelihood ratio; a clear verdict needs ``1 / alpha``."""


@dataclass(frozen=True)
class _Summary:
    n: int
    mean: float
    variance: float


def _summary(log_ratios: Sequence[float]) -> _Summary:
    n = len(log_ratios)
    mean = sum(log_ratios) / n
    if n < 3:
        return _Summary(n, mean, math.inf)
    # The sample variance of a handful of windows is often far too small, and the mixture
    # test then calls noise a difference; inflating it by n / (n - 2) (the variance of a
    # Student t with n degrees of freedom) keeps the false-verdict rate near alpha from the
    # third window on (checked by simulation in tests/unit/test_experiments.py).
    variance = sum((x - mean) ** 2 for x in log_ratios) / (n - 1) * n / (n - 2)
    return _Summary(n, mean, variance)


def mixture_likelihood_ratio(summary: _Summary, tau: float) -> float:
    """The mSPRT statistic for "mean log ratio is 0" against a N(0, tau^2) mixture."""
    if not math.isfinite(summary.variance):
        return 1.0
    variance = max(summary.variance, 1e-12)
    n, tau2 = summary.n, tau * tau
    log_ratio = 0.5 * math.log(variance / (variance + n * tau2)) + (
        n * n * tau2 * summary.mean * summary.mean / (2.0 * variance * (variance + n * tau2))
    )
    return math.exp(min(log_ratio, 700.0))


def confidence_interval(summary: _Summary, tau: float, alpha: float) -> tuple[float, float]:
    """Always-valid interval for the mean log ratio: the means the mSPRT would not reject."""
    if not math.isfinite(summary.variance):
        return (-math.inf, math.inf)
    variance = max(summary.variance, 1e-12)
    n, tau2 = summary.n, tau * tau
    half_width = math.sqrt(
        variance * (variance + n * tau2) / (n * n * tau2)
        * (math.log((variance + n * tau2) / variance) + 2.0 * math.log(1.0 / alpha))
    )
    return (summary.mean - half_width, summary.mean + half_width)


def _slo_breach(window: PairedWindow, settings: ExperimentSettings) -> Optional[str]:
    checks = (
        ("P95 time per output token", settings.tpot_p95_slo_s, "tpot_p95_s"),
        ("P95 end-to-end latency", settings.e2e_p95_slo_s, "e2e_p95_s"),
    )
    for label, slo, attribute in checks:
        if slo is None:
            continue
        candidate = getattr(window.candidate, attribute)
        incumbent = getattr(window.incumbent, attribute)
        if candidate is not None and candidate > slo and not (incumbent is not None and incumbent > slo):
            return f"{label} {candidate * 1000:.0f} ms on the canary against the SLO of {slo * 1000:.0f} ms, which the incumbent kept"
    return None


def judge(windows: Sequence[PairedWindow], started_at: float, now: float, settings: ExperimentSettings) -> Outcome:
    """The verdict after ``windows`` (oldest first) of an experiment started at ``started_at``."""
    usable = [w for w in windows if w.candidate.usable and w.incumbent.usable]
    candidate_requests = sum(w.candidate.requests for w in windows)
    incumbent_requests = sum(w.incumbent.requests for w in windows)

    def outcome(verdict: Verdict, reason: str, summary: Optional[_Summary] = None) -> Outcome:
        if summary is None or not math.isfinite(summary.variance):
            return Outcome(verdict, reason, len(windows), candidate_requests, incumbent_requests)
        low, high = confidence_interval(summary, settings.tau, settings.alpha)
        return Outcome(
            verdict, reason, len(windows), candidate_requests, incumbent_requests,
            effect=math.expm1(summary.mean), interval=(math.expm1(low), math.expm1(high)),
            evidence=mixture_likelihood_ratio(summary, settings.tau),
        )

    if windows:
        breach = _slo_breach(windows[-1], settings)
        if breach:
            return outcome(Verdict.ABORT_SLO, breach, _summary(_log_ratios(usable)) if usable else None)
    if not usable:
        if now - started_at >= settings.max_duration_s:
            return outcome(Verdict.ABORT_TIMEOUT, "no window had traffic on both the canary and the incumbent")
        return outcome(Verdict.CONTINUE, "waiting for traffic on both arms")

    summary = _summary(_log_ratios(usable))
    enough = (
        summary.n >= settings.min_windows
        and candidate_requests >= settings.min_requests
        and incumbent_requests >= settings.min_requests
    )
    if enough:
        low, high = confidence_interval(summary, settings.tau, settings.alpha)
        threshold = math.log1p(settings.min_effect)
        if mixture_likelihood_ratio(summary, settings.tau) >= 1.0 / settings.alpha:
            if high < 0 and summary.mean <= -threshold:
                return outcome(Verdict.PROMOTE, f"the canary is {-math.expm1(summary.mean):.1%} faster per token", summary)
            if low > 0:
                return outcome(Verdict.ABORT_WORSE, f"the canary is {math.expm1(summary.mean):.1%} slower per token", summary)
        if -threshold < low and high < threshold:
            return outcome(
                Verdict.ABORT_NO_GAIN,
                f"the difference is within ±{settings.min_effect:.0%}: not worth a rollout", summary,
            )
    if now - started_at >= settings.max_duration_s:
        return outcome(Verdict.ABORT_TIMEOUT, "no clear difference within the maximum duration; the incumbent stays", summary)
    if candidate_requests < settings.min_requests or incumbent_requests < settings.min_requests:
        return outcome(
            Verdict.CONTINUE,
            f"{min(candidate_requests, incumbent_requests):.0f} of {settings.min_requests:.0f} requests on the slower arm",
            summary,
        )
    return outcome(Verdict.CONTINUE, "the difference is not clear yet", summary)


def _log_ratios(windows: Sequence[PairedWindow]) -> list[float]:
    return [math.log(w.candidate.tpot_mean_s / w.incumbent.tpot_mean_s) for w in windows]
