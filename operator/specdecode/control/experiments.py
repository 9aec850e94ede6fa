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
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Optional

from specdecode import api, timestamps
from specdecode.api import ExperimentRecord
from specdecode.control.perfmodel import Schedule, ScheduleError
from specdecode.control.schedule_support import blocked_reason
from specdecode.render import workload

if TYPE_CHECKING:
    from specdecode.control.metrics import Observation


class Verdict(StrEnum):
    CONTINUE = "Continue"
    PROMOTE = "Promote"
    ABORT_WORSE = "AbortWorse"
    ABORT_NO_GAIN = "AbortNoGain"
    ABORT_SLO = "AbortSLO"
    ABORT_TIMEOUT = "AbortTimeout"
    CANCELLED = "Cancelled"
    """Ended from outside the test (never a verdict of `judge`)."""
    MEASURED = "Measured"
    """A Calibrate experiment measured what it ran for, both arms' step times in one window
    (never a verdict of `judge`); nothing changes and nothing is lost."""

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
    alpha: Optional[float] = None
    """Pooled per-token acceptance of the arm's drafts (None: the arm runs no speculation)."""
    alpha_trials: float = 0.0
    """Token positions behind ``alpha`` (its sample size)."""

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
    acceptance_floor: Optional[float] = None
    """autotune.acceptanceFloor: a canary whose acceptance is confidently below it is aborted at
    once, as the collapse guard turns speculation off on the running config (a re-probe into
    an acceptance that has not recovered costs one replica for one window, not the test's
    minimum of windows)."""
    min_drafts: float = 2000.0
    """Drafted tokens a canary window needs before its acceptance is trusted (autotune.minDrafts)."""
    confidence_z: float = 2.0
    overdispersion: float = 4.0
    """As the policy's `PolicyTuning`: tokens of one request are correlated."""


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
class Evidence:
    """What an experiment has measured so far: sufficient statistics of the paired log ratios,
    small enough to live in status, so an operator restarted mid-experiment resumes it."""

    windows: int = 0
    """Windows seen, with or without traffic on both arms."""
    paired: int = 0
    """Windows with traffic on both arms (the test's sample size)."""
    log_ratio_sum: float = 0.0
    log_ratio_sum_squares: float = 0.0
    candidate_requests: float = 0.0
    incumbent_requests: float = 0.0

    def add(self, window: PairedWindow) -> "Evidence":
        usable = window.candidate.usable and window.incumbent.usable
        ratio = math.log(window.candidate.tpot_mean_s / window.incumbent.tpot_mean_s) if usable else 0.0
        return Evidence(
            windows=self.windows + 1,
            paired=self.paired + int(usable),
            log_ratio_sum=self.log_ratio_sum + ratio,
            log_ratio_sum_squares=self.log_ratio_sum_squares + ratio * ratio,
            # Kept at the status's precision, so a restarted operator resumes with the same counts.
            candidate_requests=round(self.candidate_requests + max(0.0, window.candidate.requests), 1),
            incumbent_requests=round(self.incumbent_requests + max(0.0, window.incumbent.requests), 1),
        )

    @property
    def mean(self) -> float:
        return self.log_ratio_sum / self.paired if self.paired else 0.0

    @property
    def variance(self) -> float:
        """The sample variance of the log ratios, inflated by n / (n - 2); infinite below three.

        The sample variance of a handful of windows is often far too small, and the mixture
        test then calls noise a difference; n / (n - 2) (the variance of a Student t with n
        degrees of freedom) keeps the false-verdict rate near alpha from the third window on
        (checked by simulation in tests/unit/test_experiments.py)."""
        n = self.paired
        if n < 3:
            return math.inf
        squares = max(0.0, self.log_ratio_sum_squares - n * self.mean * self.mean)
        return squares / (n - 1) * n / (n - 2)


def mixture_likelihood_ratio(evidence: Evidence, tau: float) -> float:
    """The mSPRT statistic for "mean log ratio is 0" against a N(0, tau^2) mixture."""
    if not math.isfinite(evidence.variance):
        return 1.0
    variance = max(evidence.variance, 1e-12)
    n, tau2, mean = evidence.paired, tau * tau, evidence.mean
    log_ratio = 0.5 * math.log(variance / (variance + n * tau2)) + (
        n * n * tau2 * mean * mean / (2.0 * variance * (variance + n * tau2))
    )
    return math.exp(min(log_ratio, 700.0))


def confidence_interval(evidence: Evidence, tau: float, alpha: float) -> tuple[float, float]:
    """Always-valid interval for the mean log ratio: the means the mSPRT would not reject."""
    if not math.isfinite(evidence.variance):
        return (-math.inf, math.inf)
    variance = max(evidence.variance, 1e-12)
    n, tau2 = evidence.paired, tau * tau
    half_width = math.sqrt(
        variance * (variance + n * tau2) / (n * n * tau2)
        * (math.log((variance + n * tau2) / variance) + 2.0 * math.log(1.0 / alpha))
    )
    return (evidence.mean - half_width, evidence.mean + half_width)


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


def below_floor(arm: ArmWindow, settings: ExperimentSettings) -> Optional[str]:
    """Why the canary's acceptance is confidently below the floor in this window; None if not.
    Acceptance needs no warm-up and no paired window (it is the draft's, not the latency's):
    the loop checks it at every evaluation of a running canary."""
    # Imported here: estimates imports the policy's settings, which import this module.
    from specdecode.control.estimates import binomial_stderr

    floor = settings.acceptance_floor
    if floor is None or arm.alpha is None or arm.alpha_trials < settings.min_drafts:
        return None
    stderr = binomial_stderr(arm.alpha, arm.alpha_trials, settings.overdispersion)
    if arm.alpha + settings.confidence_z * stderr >= floor:
        return None
    return (f"the canary's acceptance {arm.alpha:.2f} (+/- {stderr:.2f}, {arm.alpha_trials:.0f} drafted "
            f"positions) is below the acceptance floor {floor:.2f}: speculation does not pay there yet")


MAX_LOG_RATIO = math.log(1e6)
"""The largest log time-per-token ratio an outcome reports (`judge`)."""


def judge(
    evidence: Evidence,
    latest: Optional[PairedWindow],
    started_at: float,
    now: float,
    settings: ExperimentSettings,
    predicted: Optional[float] = None,
) -> Outcome:
    """The verdict on ``evidence`` (which already includes ``latest``, the newest window, whose
    SLOs are checked) of an experiment started at ``started_at``.

    ``predicted`` (a schedule's canary): the model's relative change of time per token at
    the load the canary runs. A schedule is chosen for the batches of the last hours, and its
    gain may lie at loads the canary does not see; what the canary can check is the model's
    word where it runs. So its test is one of non-inferiority to that prediction: Promote once
    the interval lies below ``predicted`` + ``min_effect``, AbortWorse once it lies above."""

    def outcome(verdict: Verdict, reason: str) -> Outcome:
        base = Outcome(verdict, reason, evidence.windows, evidence.candidate_requests, evidence.incumbent_requests)
        if not math.isfinite(evidence.variance):
            return base
        low, high = confidence_interval(evidence, settings.tau, settings.alpha)
        # A few windows of wildly different arms (a canary whose pods were still loading) give
        # a log-ratio interval wider than a float's exponent: past a millionfold the bound
        # says nothing more, and status must hold a number.
        low, high = (min(bound, MAX_LOG_RATIO) for bound in (low, high))
        return replace(
            base, effect=math.expm1(min(evidence.mean, MAX_LOG_RATIO)), interval=(math.expm1(low), math.expm1(high)),
            evidence=mixture_likelihood_ratio(evidence, settings.tau),
        )

    timed_out = now - started_at >= settings.max_duration_s
    breach = _slo_breach(latest, settings) if latest is not None else None
    if breach:
        return outcome(Verdict.ABORT_SLO, breach)
    below = below_floor(latest.candidate, settings) if latest is not None else None
    if below:
        return outcome(Verdict.ABORT_WORSE, below)
    if evidence.paired == 0:
        if timed_out:
            return outcome(Verdict.ABORT_TIMEOUT, "no window had traffic on both the canary and the incumbent")
        return outcome(Verdict.CONTINUE, "waiting for traffic on both arms")

    slower_arm = min(evidence.candidate_requests, evidence.incumbent_requests)
    if predicted is not None and evidence.paired >= settings.min_windows and slower_arm >= settings.min_requests:
        low, high = confidence_interval(evidence, settings.tau, settings.alpha)
        bound = math.log1p(predicted) + math.log1p(settings.min_effect)
        measured = f"the canary is {_change(evidence.mean)} per token where the model predicts {_change(math.log1p(predicted))}"
        if high < bound:
            return outcome(Verdict.PROMOTE, f"{measured}: within {settings.min_effect:.0%} of the prediction")
        if low > bound:
            return outcome(Verdict.ABORT_WORSE, f"{measured}: more than {settings.min_effect:.0%} worse than predicted")
    elif evidence.paired >= settings.min_windows and slower_arm >= settings.min_requests:
        low, high = confidence_interval(evidence, settings.tau, settings.alpha)
        threshold = math.log1p(settings.min_effect)
        if mixture_likelihood_ratio(evidence, settings.tau) >= 1.0 / settings.alpha:
            if high < 0 and evidence.mean <= -threshold:
                return outcome(Verdict.PROMOTE, f"the canary is {-math.expm1(evidence.mean):.1%} faster per token")
            if low > 0:
                return outcome(Verdict.ABORT_WORSE, f"the canary is {math.expm1(evidence.mean):.1%} slower per token")
        if -threshold < low and high < threshold:
            return outcome(Verdict.ABORT_NO_GAIN, f"the difference is within ±{settings.min_effect:.0%}: not worth a rollout")
    if timed_out:
        return outcome(Verdict.ABORT_TIMEOUT, "no clear difference within the maximum duration; the incumbent stays")
    if slower_arm < settings.min_requests:
        return outcome(Verdict.CONTINUE, f"{slower_arm:.0f} of {settings.min_requests:.0f} requests on the slower arm")
    return outcome(Verdict.CONTINUE, "the difference is not clear yet")


def _change(log_ratio: float) -> str:
    """A log ratio of time per token as a user reads it: `3.1% faster`, `2.0% slower`."""
    change = math.expm1(log_ratio)
    return f"{-change:.1%} faster" if change < 0 else f"{change:.1%} slower"


# --------------------------------------------------------------------------------------------
# An experiment's life: from the spec's settings, through evaluation windows, to a status record
# --------------------------------------------------------------------------------------------


class Purpose(StrEnum):
    REPROBE = "Reprobe"
    """Speculation is off: does it pay now? (instead of restarting every replica on a guess)"""
    CHANGE = "Change"
    """A new K or schedule the model predicts, before it reaches every replica."""
    CONTROL = "Control"
    """Speculation off against a config that has run for long: does it still pay?"""
    CALIBRATE = "Calibrate"
    """Speculation off beside a running config whose step time is well above the prior's, for
    one window: only a config without the draft tells a costly draft from a slow target."""


@dataclass(frozen=True)
class CanaryPlan:
    """How experiments run: the canary's size and budget and the test's thresholds
    (spec.autotune.experiments, `from_spec`)."""

    enabled: bool = True
    replicas: int = 1
    max_extra_replicas: int = 0
    """Replicas an experiment may add beside the service's (needs rollout.maxSurge > 0); with 0
    the main Deployment gives up as many as the canary has (capacity-neutral)."""
    max_duration_s: float = 1800.0
    min_requests: float = 200.0
    min_effect: float = 0.03
    control_interval_s: Optional[float] = 7 * 86400.0
    """Speculation unchanged this long gets a control experiment (off on the canary); None: never."""

    @classmethod
    def from_spec(cls, spec: "api.SpecDecodeServiceSpec") -> "CanaryPlan":
        e = spec.autotune.experiments
        return cls(
            enabled=e.enabled,
            replicas=e.replicas,
            max_extra_replicas=e.max_extra_replicas,
            max_duration_s=api.parse_duration(e.max_duration),
            min_requests=float(e.min_requests),
            min_effect=e.min_effect,
            control_interval_s=api.parse_duration(e.control_interval) if e.control else None,
        )

    def main_replicas(self, spec: "api.SpecDecodeServiceSpec") -> int:
        """The main Deployment's replicas while an experiment runs: the spec's, less the canary's
        when the canary borrows them (capacity-neutral)."""
        if self.borrows_replicas(spec):
            return max(0, spec.replicas - self.replicas)
        return spec.replicas

    def borrows_replicas(self, spec: "api.SpecDecodeServiceSpec") -> bool:
        """Whether the canary's replicas come from the main Deployment (capacity-neutral)
        rather than from the spec's surge budget."""
        budget = self.max_extra_replicas if spec.rollout.max_surge > 0 else 0
        return self.replicas > budget

    def blocker(self, spec: "api.SpecDecodeServiceSpec") -> Optional[str]:
        """Why this service cannot run an experiment, naming the field to change; None when it can."""
        if not self.enabled:
            return "experiments are turned off"
        if self.borrows_replicas(spec) and spec.replicas <= self.replicas:
            return (
                f"a capacity-neutral canary of {self.replicas} replica(s) needs spec.replicas >= "
                f"{self.replicas + 1} (is {spec.replicas}); or extra canary replicas: "
                f"spec.autotune.experiments.maxExtraReplicas >= {self.replicas} with spec.rollout.maxSurge > 0"
            )
        return None


@dataclass(frozen=True)
class ExperimentPolicy:
    """What the control loop needs of the spec to run experiments: the plan, what blocks it,
    the test's thresholds, and the config hash of each candidate (the label its canary pods
    carry, which keeps the two arms apart in the metrics)."""

    spec: "api.SpecDecodeServiceSpec"
    plan: CanaryPlan
    blocker: Optional[str]
    """`CanaryPlan.blocker` for this spec; None when an experiment can run."""
    test: ExperimentSettings

    @classmethod
    def from_spec(cls, spec: "api.SpecDecodeServiceSpec") -> "ExperimentPolicy":
        plan = CanaryPlan.from_spec(spec)
        return cls(spec=spec, plan=plan, blocker=plan.blocker(spec), test=settings_from_spec(spec, plan))

    @property
    def runs(self) -> bool:
        """Experiments are on and their plan can run: a canaried move starts one."""
        return self.plan.enabled and self.blocker is None

    def config_hash(self, candidate_k: Optional[int], schedule: Optional[Schedule] = None) -> str:
        """The engine config hash of the canary running ``candidate_k`` (None: speculation off),
        under ``schedule`` when one is given (its largest K is ``candidate_k``)."""
        return workload.config_hash(self.spec, candidate_choice(candidate_k, schedule))

    def describe(self, candidate_k: Optional[int], schedule: Optional[Schedule] = None) -> str:
        """The candidate as status names configs (`ngram K=5`, `off`, `eagle 1-32:K6,33+:K3`)."""
        method = self.spec.speculation.method.value
        if schedule is not None:
            return f"{method} {schedule.label}"
        return workload.SpeculationChoice(k=candidate_k).describe(method)


def candidate_choice(candidate_k: Optional[int], schedule: Optional[Schedule] = None) -> workload.SpeculationChoice:
    """What a canary runs: ``candidate_k`` (None: speculation off), under ``schedule`` if given.
    The one place a candidate becomes an engine config (its hash, the canary's render)."""
    if schedule is None or candidate_k is None:
        return workload.SpeculationChoice(k=candidate_k)
    return workload.SpeculationChoice(k=candidate_k, per_batch_size=schedule.rows())


def rendered_schedule(label: str, spec: Optional["api.SpecDecodeServiceSpec"] = None) -> Schedule:
    """The schedule ``label`` names (status' form) as the pods render it: its open last range
    ends at the engine's maxNumSeqs (1024 when not declared). A schedule is kept in status by
    its label, so every engine config built from one (the main Deployment's, a canary's) goes
    through here and hashes alike. Raises `ScheduleError` for a label that does not parse."""
    last_end = (spec.engine.max_num_seqs if spec is not None else None) or 1024
    return Schedule.from_label(label, last_end)


def record_schedule(record: ExperimentRecord, spec: Optional["api.SpecDecodeServiceSpec"] = None) -> Optional[Schedule]:
    """The schedule a record's canary runs (None: plain K or off; a label that no longer
    parses reads as none, and its hash then no longer matches: `cancel_reason` ends it)."""
    if not record.candidate_schedule or not record.candidate_enabled:
        return None
    try:
        return rendered_schedule(record.candidate_schedule, spec)
    except ScheduleError:
        return None


def cancel_reason(
    spec: "api.SpecDecodeServiceSpec", running: "Experiment", running_hash: Optional[str],
    excluded_ks: frozenset[int] = frozenset(),
) -> Optional[str]:
    """Why the spec no longer allows the running experiment (None: it goes on). The one check
    of the control step (`control.canary`) and of the reconcile (`shell.experiments`), which
    runs it before anything is applied, so a canary never runs a config its record does not
    name and the main Deployment never lends a replica it does not have.

    ``running_hash`` is the config hash of the main Deployment's config (None: not known
    yet); ``excluded_ks``, the Ks whose pods could not start (`state.excluded_ks`)."""
    mode = spec.autotune.mode
    if mode != api.AutotuneMode.AUTO:
        return f"spec.autotune.mode is {mode.value}: experiments run in Auto mode only"
    blocker = CanaryPlan.from_spec(spec).blocker(spec)
    if blocker is not None:
        return f"the canary cannot run: {blocker}"
    if workload.config_hash(spec, candidate_choice(running.candidate_k, running.candidate_schedule)) != running.candidate_hash:
        return "the spec changed the candidate's engine config: what was measured no longer applies"
    if running_hash is not None and running_hash != running.incumbent_hash:
        return (f"the running config changed (config hash {running.incumbent_hash} -> {running_hash}): "
                "the canary no longer runs beside the config it was compared with")
    speculation = spec.speculation
    if running.candidate_k is None:
        allowed = speculation.allow_disable
    else:
        allowed = (speculation.min_k <= running.candidate_k <= speculation.max_k
                   and running.candidate_k not in excluded_ks)
    if not allowed:
        return f"spec.speculation no longer allows {running.candidate}"
    if running.candidate_schedule is not None:
        return blocked_reason(spec)
    return None


def settings_from_spec(spec: "api.SpecDecodeServiceSpec", plan: CanaryPlan = CanaryPlan()) -> ExperimentSettings:
    """The test's settings: the plan's thresholds and the spec's latency SLOs."""
    slo = spec.autotune.slo
    return ExperimentSettings(
        min_effect=plan.min_effect,
        min_requests=plan.min_requests,
        max_duration_s=plan.max_duration_s,
        tpot_p95_slo_s=api.parse_duration(slo.p95_time_per_output_token) if slo.p95_time_per_output_token else None,
        e2e_p95_slo_s=api.parse_duration(slo.p95_end_to_end) if slo.p95_end_to_end else None,
        acceptance_floor=spec.acceptance_floor,
        min_drafts=float(spec.autotune.min_drafts),
    )


TRAFFIC_SKEW = 0.25
"""Finished requests per replica of the two arms of one window may differ this much (beyond
their counts' noise, `traffic_skew`) and still count as the same traffic."""


def traffic_skew(candidate: Optional["Observation"], incumbent: Optional["Observation"]) -> Optional[str]:
    """Why one window's arms did not serve the same traffic, or None. The Service spreads
    requests evenly over the canary's pods and the running config's, so at one load both
    finish as many per replica. One that finishes far more is draining a backlog, or has just
    met one: its time per token and its step time belong to another load than the other
    arm's, and the window compares nothing. (Traced: a canary of speculation off at a peak
    its K=1 incumbent could not carry measured the same step scale as it on six windows; in
    the window where the load fell, the incumbent finished 4.5 times the canary's requests
    per replica from its backlog, and its step scale came out 35 % below the canary's. The
    model carried that ratio to speculation off for the rest of the day, at a quarter less
    capacity than it has.) The gap must exceed ``TRAFFIC_SKEW`` and three standard deviations
    of two Poisson counts, so a quiet window's noise is no skew."""
    if candidate is None or incumbent is None:
        return None
    if not (candidate.requests_counted and incumbent.requests_counted):
        return None
    if min(candidate.pods, incumbent.pods) <= 0 or min(candidate.requests, incumbent.requests) <= 0:
        return None
    canary, running = candidate.requests / candidate.pods, incumbent.requests / incumbent.pods
    gap = abs(math.log(canary / running))
    noise = 3.0 * math.sqrt(1.0 / candidate.requests + 1.0 / incumbent.requests)
    if gap <= max(math.log1p(TRAFFIC_SKEW), noise):
        return None
    return (f"its arms served different traffic ({canary:.0f} requests per replica on the canary, "
            f"{running:.0f} on the running config: a backlog drained on one of them)")


def arm_window(observation: Optional["Observation"]) -> ArmWindow:
    """One arm of a window from the metrics of its config hash (an empty arm when absent)."""
    if observation is None:
        return ArmWindow(requests=0.0, tpot_mean_s=None)
    speculation = observation.speculation
    return ArmWindow(
        requests=observation.requests,
        tpot_mean_s=observation.tpot_mean_s,
        tpot_p95_s=observation.tpot_p95_s,
        e2e_p95_s=observation.e2e_p95_s,
        generation_tps=observation.generation_tps,
        alpha=speculation.alpha if speculation is not None else None,
        alpha_trials=speculation.alpha_trials if speculation is not None else 0.0,
    )


@dataclass(frozen=True)
class Experiment:
    """A running or finished experiment; `to_record`/`from_record` carry it through status."""

    purpose: Purpose
    candidate: str
    candidate_hash: str
    incumbent_hash: str
    started_at: float
    evidence: Evidence = Evidence()
    outcome: Optional[Outcome] = None
    ended_at: Optional[float] = None
    candidate_k: Optional[int] = None
    """K on the canary; None: the canary runs speculation off."""
    candidate_schedule: Optional[Schedule] = None
    """The per-batch-size K schedule on the canary (``candidate_k`` is its largest K); None:
    plain K or off."""
    predicted_effect: Optional[float] = None
    """A schedule's: the model's relative change of time per token against the running config
    at the load it was chosen (`judge`'s non-inferiority test); None: the superiority test."""
    last_window_at: Optional[float] = None
    """End of the last window measured (the next one starts there: windows never overlap)."""
    candidate_step_scale: Optional[float] = None
    """The canary's measured step time over the prior's at its batch, in the last window that
    measured both arms (`canary.step_scales`)."""
    incumbent_step_scale: Optional[float] = None
    """The running config's in the same window: the pair's ratio is what one kind of config
    (speculation off, or on) costs against the other on the same traffic (`memory.off_per_on`)."""
    promotion_waits_since: Optional[float] = None
    """When the test reached Promote and the rollout had to wait for a load the replicas left
    serving carry (`canary._promotion_overloads`); None: it has not. The verdict then stands:
    later windows are checked for SLOs and the time limit but not added to its evidence."""

    @property
    def candidate_enabled(self) -> bool:
        return self.candidate_k is not None

    @property
    def running(self) -> bool:
        return self.ended_at is None

    def observe(self, candidate: Optional["Observation"], incumbent: Optional["Observation"], now: float,
                settings: ExperimentSettings) -> "Experiment":
        """Add one evaluation window of both arms and judge; a final verdict ends it at ``now``.
        A window whose arms did not serve the same traffic (`traffic_skew`) is judged for its
        SLOs and the time limit but adds nothing to the evidence; nor does any window once a
        Promote waits for the load (``promotion_waits_since``): the verdict was reached at the
        load the candidate is promoted for, and windows at another (the calm after the peak
        where speculation off was measured 35 % faster) would judge a different question."""
        if not self.running:
            return self
        window = PairedWindow(at=now, candidate=arm_window(candidate), incumbent=arm_window(incumbent))
        skew = traffic_skew(candidate, incumbent)
        counted = skew is None and self.promotion_waits_since is None
        evidence = self.evidence.add(window) if counted else self.evidence
        outcome = judge(evidence, window, self.started_at, now, settings, self.predicted_effect)
        if skew is not None and not outcome.verdict.final:
            outcome = replace(outcome, reason=f"{outcome.reason}; the last window is not counted: {skew}")
        return replace(self, evidence=evidence, outcome=outcome, last_window_at=now,
                       ended_at=now if outcome.verdict.final else None)

    def cancel(self, reason: str, now: float) -> "Experiment":
        """Ended from outside the test (the spec changed, autotune turned off, the canary failed)."""
        return self.end(Verdict.CANCELLED, reason, now)

    def end(self, verdict: Verdict, reason: str, now: float) -> "Experiment":
        """Ended at ``now`` with ``verdict`` before its next window (a cancel, or a canary
        whose acceptance is already below the floor: `below_floor`)."""
        if not self.running:
            return self
        ended = Outcome(verdict, reason, self.evidence.windows,
                        self.evidence.candidate_requests, self.evidence.incumbent_requests)
        return replace(self, outcome=ended, ended_at=now)

    @property
    def status_verdict(self) -> str:
        return "Running" if self.running or self.outcome is None else self.outcome.verdict.value

    def to_record(self) -> "ExperimentRecord":
        outcome = self.outcome
        interval = outcome.interval if outcome and outcome.interval else (None, None)
        finite = [v if v is not None and math.isfinite(v) else None for v in interval]
        return ExperimentRecord(
            purpose=self.purpose.value,
            candidate=self.candidate,
            candidate_enabled=self.candidate_enabled,
            candidate_k=self.candidate_k,
            candidate_schedule=self.candidate_schedule.label if self.candidate_schedule is not None else None,
            predicted_effect=self.predicted_effect,
            candidate_hash=self.candidate_hash,
            incumbent_hash=self.incumbent_hash,
            started_at=timestamps.rfc3339(self.started_at),
            ended_at=timestamps.rfc3339(self.ended_at) if self.ended_at is not None else None,
            verdict=self.status_verdict,
            reason=outcome.reason[:512] if outcome else "",
            effect=round(outcome.effect, 4) if outcome and outcome.effect is not None else None,
            effect_low=round(finite[0], 4) if finite[0] is not None else None,
            effect_high=round(finite[1], 4) if finite[1] is not None else None,
            windows=self.evidence.windows,
            requests=round(self.evidence.candidate_requests, 1),
            incumbent_requests=round(self.evidence.incumbent_requests, 1),
            paired_windows=self.evidence.paired,
            log_ratio_sum=self.evidence.log_ratio_sum,
            log_ratio_sum_squares=self.evidence.log_ratio_sum_squares,
            last_window_at=timestamps.rfc3339(self.last_window_at) if self.last_window_at is not None else None,
            candidate_step_scale=self.candidate_step_scale,
            incumbent_step_scale=self.incumbent_step_scale,
            promotion_waits_since=(timestamps.rfc3339(self.promotion_waits_since)
                                   if self.promotion_waits_since is not None else None),
        )

    @classmethod
    def from_record(cls, record: "ExperimentRecord", spec: Optional["api.SpecDecodeServiceSpec"] = None) -> "Experiment":
        """What a restarted operator resumes from (a running experiment keeps its evidence)."""
        evidence = Evidence(
            windows=record.windows,
            paired=record.paired_windows,
            log_ratio_sum=record.log_ratio_sum,
            log_ratio_sum_squares=record.log_ratio_sum_squares,
            candidate_requests=record.requests or 0.0,
            incumbent_requests=record.incumbent_requests or 0.0,
        )
        verdict = Verdict.CONTINUE if record.verdict == "Running" else Verdict(record.verdict)
        interval = None
        if record.effect_low is not None and record.effect_high is not None:
            interval = (record.effect_low, record.effect_high)
        return cls(
            purpose=Purpose(record.purpose),
            candidate=record.candidate,
            candidate_hash=record.candidate_hash,
            incumbent_hash=record.incumbent_hash,
            started_at=timestamps.epoch_seconds(record.started_at),
            evidence=evidence,
            outcome=Outcome(verdict, record.reason, record.windows, evidence.candidate_requests,
                            evidence.incumbent_requests, effect=record.effect, interval=interval)
            if record.reason or verdict.final or record.effect is not None or interval is not None else None,
            ended_at=timestamps.epoch_seconds_or_none(record.ended_at),
            candidate_k=record.candidate_k if record.candidate_enabled else None,
            candidate_schedule=record_schedule(record, spec),
            predicted_effect=record.predicted_effect,
            last_window_at=timestamps.epoch_seconds_or_none(record.last_window_at),
            candidate_step_scale=record.candidate_step_scale,
            incumbent_step_scale=record.incumbent_step_scale,
            promotion_waits_since=timestamps.epoch_seconds_or_none(record.promotion_waits_since),
        )


def running_record(status: Optional["api.SpecDecodeServiceStatus"]) -> Optional[ExperimentRecord]:
    """The experiment running now: the last of status.experiments while its verdict is Running
    (the one way the controller, the evaluator and the benchmark ask)."""
    if status is None or not status.experiments:
        return None
    last = status.experiments[-1]
    return last if last.running else None
