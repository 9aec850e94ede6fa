"""What a change of speculation may do to the service while it rolls out (issue 57: safe by
default). Every change restarts pods; with the API's defaults (one replica, maxSurge 0,
maxUnavailable 1) each one is a full outage for a model load.

Pure: `gate` is the last word of `step.step` on a change the operator would roll out, and
`outage_risk` is the spec-only answer that the OutageRisk condition and `specdecode validate`
give. Imports only settings, decisions and the explain helpers: nothing of the shell.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specdecode.control.decision import Decision, Held, Rule
from specdecode.control.estimates import PolicyObservations
from specdecode.control.explain import fmt_s, label
from specdecode.control.hedge import serving_in_rollout
from specdecode.control.settings import PolicySettings

SAFE_ROLLOUT_FIX = (
    "set spec.rollout.maxSurge: 1 and maxUnavailable: 0 (a spare GPU during each rollout keeps every "
    "replica serving) or run 2 or more replicas"
)


def serving_during_rollout(settings: PolicySettings) -> int:
    """Replicas that keep serving while a change rolls out: all of them when a surge pod starts
    before an old one goes (maxSurge >= 1, maxUnavailable 0), else replicas - maxUnavailable."""
    replicas = max(1, settings.replicas)
    if settings.rollout_keeps_capacity:
        return replicas
    return serving_in_rollout(settings, replicas)


def _target_label(decision: Decision) -> str:
    return decision.schedule.label if decision.enabled and decision.schedule is not None else label(decision.config)


def _why_held(settings: PolicySettings, observed: PolicyObservations, decision: Decision, current: int) -> str | None:
    """Why rolling ``decision`` out now would take the service below what carries its load, or
    None when it would not: no replica left serving, or (by the decision's own predictions)
    those left carry less than the load (of the two configs, the lower capacity) while the
    running config carries it at full strength (a service already past its capacity is not
    made worse by the way out of it)."""
    serving = serving_during_rollout(settings)
    replicas = max(1, settings.replicas)
    if serving == replicas:
        return None
    if serving == 0:
        return (
            f"with {replicas} replica, rollout.maxSurge {settings.max_surge} and maxUnavailable "
            f"{settings.max_unavailable} the restart would take the service fully down for about "
            f"{fmt_s(settings.restart_s)}"
        )
    predicted = {p.k: p for p in decision.predictions}
    now, then = predicted.get(current), predicted.get(decision.config)
    if now is None or then is None or not observed.available or observed.window is None:
        return None
    rate = observed.highest_request_rate(settings)
    if rate > now.capacity_rps:
        return None
    # Carrying is the line: below the capacity of those left the rollout costs latency for
    # a restart's time, which the policy prices (restart_max_rollout_load); at or above it a
    # queue grows without bound until the rollout ends, which no default may risk.
    left = min(now.capacity_rps, then.capacity_rps) * serving / replicas
    if rate < left:
        return None
    return (
        f"at {rate:.2f} req/s the {serving} of {replicas} replicas left serving during the rollout would "
        f"carry {rate / left:.0%} of the {left:.1f} req/s they can"
    )


def gate(settings: PolicySettings, observed: PolicyObservations, decision: Decision, current: int) -> Decision:
    """``decision`` as the operator may act on it: a change that would roll out below what
    carries the load, with spec.autotune.allowOutages false, becomes a recommendation (held
    `Held.OUTAGE`, not applied, the reason saying why and how to let it act). Pass: bounds
    fixes (the spec demands them: the user's own edit restarts the pods) and a canary's
    promotion (rule experiment: the experiment has ended, and `canary._promotion_overloads`
    already waits for a load the replicas left serving carry)."""
    if (settings.allow_outages or not (decision.applied and decision.changes)
            or decision.rule in (Rule.BOUNDS, Rule.EXPERIMENT)):
        return decision
    why = _why_held(settings, observed, decision, current)
    if why is None:
        return decision
    return replace(
        decision,
        applied=False,
        held=Held.OUTAGE,
        wanted=decision.rule,
        reason=(
            f"would move to {_target_label(decision)} ({decision.reason}), but {why}: "
            "spec.autotune.allowOutages is false, so this stays a recommendation until the load allows "
            f"(to let it act: {SAFE_ROLLOUT_FIX}, or set allowOutages: true)"
        ),
    )


@dataclass(frozen=True)
class OutageRisk:
    """Whether a spec lets autotune take the service down (condition OutageRisk), and what
    would keep it up (empty when nothing needs fixing)."""

    status: bool
    reason: str
    what: str
    fix: str = ""

    @property
    def message(self) -> str:
        return f"{self.what}; {self.fix}" if self.fix else self.what


def outage_risk(settings: PolicySettings, acting: bool) -> OutageRisk:
    """The OutageRisk condition of a service with these settings; ``acting``: autotune mode
    Auto (Recommend and Off restart nothing)."""
    serving = serving_during_rollout(settings)
    replicas = max(1, settings.replicas)
    if not acting:
        return OutageRisk(False, "AutotuneNotActing", "autotune does not restart pods in this mode")
    if serving == replicas:
        return OutageRisk(False, "RolloutKeepsCapacity",
                          "a surge pod starts before an old one goes: every replica keeps serving through a change")
    if serving == 0:
        if settings.allow_outages:
            return OutageRisk(True, "OutagesAllowed", (
                f"every change of speculation is a full outage for a model load (about {fmt_s(settings.restart_s)}): "
                f"{replicas} replica, maxSurge {settings.max_surge}, maxUnavailable {settings.max_unavailable} and "
                f"autotune.allowOutages true, up to {settings.max_changes_per_hour} changes an hour"), SAFE_ROLLOUT_FIX)
        return OutageRisk(False, "ChangesAreRecommendations", (
            "no replica would keep serving during a rollout, so autotune's changes stay recommendations "
            "(autotune.allowOutages false)"), f"to let autotune act: {SAFE_ROLLOUT_FIX}")
    if settings.allow_outages:
        return OutageRisk(True, "OverloadAllowed", (
            f"{serving} of {replicas} replicas serve during a rollout and autotune.allowOutages is true: a change may "
            "go ahead while they cannot carry the load (priced, not forbidden)"),
            "set spec.rollout.maxSurge: 1 and maxUnavailable: 0 to keep every replica serving")
    return OutageRisk(False, "ChangesWaitForCapacity", (
        f"{serving} of {replicas} replicas serve during a rollout: a change waits until they carry the load"))
