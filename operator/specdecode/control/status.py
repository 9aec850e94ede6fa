"""Pure status logic: conditions, phase and rollout state from what the operator observes.

Everything here takes the current time as an argument and returns new values; the handlers
compare the result with the stored status and write only when something changed, so a
steady service costs no API writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Optional

from specdecode import api
from specdecode import constants as C
from specdecode.control import disruption
from specdecode.control.settings import PolicySettings
from specdecode.control.state import Cause, declared_speculation_hash
from specdecode.render.workload import SpeculationChoice
from specdecode.timestamps import rfc3339


# ---------------------------------------------------------------------------------------------
# Conditions
# ---------------------------------------------------------------------------------------------


def set_condition(
    conditions: Iterable[api.Condition],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    now: datetime,
    generation: Optional[int],
) -> list[api.Condition]:
    """Conditions with `type_` set; lastTransitionTime moves only when the status flips.

    The order of existing conditions is kept (new types are appended), so an unchanged
    condition set compares equal and causes no write.
    """
    value = status if isinstance(status, str) else ("True" if status else "False")
    out: list[api.Condition] = []
    found = False
    for cond in conditions:
        if cond.type != type_:
            out.append(cond)
            continue
        found = True
        transition = cond.last_transition_time if cond.status == value else rfc3339(now)
        out.append(
            api.Condition(
                type=type_,
                status=value,
                reason=reason,
                message=message,
                last_transition_time=transition,
                observed_generation=generation,
            )
        )
    if not found:
        out.append(
            api.Condition(
                type=type_,
                status=value,
                reason=reason,
                message=message,
                last_transition_time=rfc3339(now),
                observed_generation=generation,
            )
        )
    return out


def get_condition(conditions: Iterable[api.Condition], type_: str) -> Optional[api.Condition]:
    return next((c for c in conditions if c.type == type_), None)


# ---------------------------------------------------------------------------------------------
# Rollout state of the Deployment
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutState:
    """How far the Deployment is in running the config the operator rendered."""

    exists: bool
    desired: int = 0
    replicas: int = 0  # all pods, old and new
    updated: int = 0
    ready: int = 0
    available: int = 0
    observed: bool = False  # the deployment controller has seen the latest template
    config_matches: bool = False  # the live template carries the rendered config hash
    deadline_exceeded: bool = False

    @property
    def live(self) -> bool:
        """Every replica runs the rendered config and is available: its metrics are its own."""
        return (
            self.exists
            and self.observed
            and self.config_matches
            and self.updated == self.desired
            and self.available >= self.desired
            and self.replicas == self.desired
        )

    @property
    def scaling(self) -> bool:
        """Only the replica count moves: every pod runs the rendered config and one at least
        serves, but not yet as many as desired (a canary borrowed or gave back a replica, an
        HPA scaled, a pod is replaced). The config is what it was; its metrics are still its own.
        The deployment controller need not have seen the change yet: a new replica count bumps
        the generation too, and until it is observed every pod counted still runs the config."""
        return (
            self.exists
            and self.config_matches
            and not self.deadline_exceeded
            and self.updated == self.replicas
            and self.available >= 1
            and not self.live
        )


# The conditions whose messages carry a rollout's counts ("1/2 updated, 0 available").
_COUNTING_CONDITIONS = (C.COND_PROGRESSING, C.COND_READY)


def only_rollout_counts_changed(current: api.SpecDecodeServiceStatus, new: api.SpecDecodeServiceStatus) -> bool:
    """Whether `new` differs from `current` in a rollout's counts alone: the replica counts
    and the messages of Progressing and Ready, with the same phase and the same status and
    reason in every condition. False when nothing changed."""

    def without_counts(status: api.SpecDecodeServiceStatus) -> dict[str, Any]:
        wire = dict(status.to_wire())
        wire.pop("replicas", None)
        wire.pop("readyReplicas", None)
        wire["conditions"] = [{k: v for k, v in c.items() if k != "message" or c.get("type") not in _COUNTING_CONDITIONS}
                              for c in wire.get("conditions") or []]
        return wire

    return current.to_wire() != new.to_wire() and without_counts(current) == without_counts(new)


def rollout_state(deployment: Optional[dict[str, Any]], rendered_hash: str) -> RolloutState:
    """Read the Deployment's status the way `kubectl rollout status` does."""
    if deployment is None:
        return RolloutState(exists=False)
    spec = deployment.get("spec", {})
    status = deployment.get("status", {}) or {}
    meta = deployment.get("metadata", {})
    labels = spec.get("template", {}).get("metadata", {}).get("labels", {})
    conditions = status.get("conditions") or []
    deadline = any(
        c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded" for c in conditions
    )
    return RolloutState(
        exists=True,
        desired=int(spec.get("replicas", 1)),
        replicas=int(status.get("replicas", 0) or 0),
        updated=int(status.get("updatedReplicas", 0) or 0),
        ready=int(status.get("readyReplicas", 0) or 0),
        available=int(status.get("availableReplicas", 0) or 0),
        observed=int(status.get("observedGeneration", 0) or 0) >= int(meta.get("generation", 0) or 0),
        config_matches=labels.get(C.LABEL_CONFIG_HASH) == rendered_hash,
        deadline_exceeded=deadline,
    )


# ---------------------------------------------------------------------------------------------
# Phase and conditions from a reconcile
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReconcileOutcome:
    """What a reconcile found: either an invalid spec, or the rendered config and its rollout."""

    invalid_spec: Optional[str] = None
    apply_error: Optional[str] = None
    rollout: RolloutState = RolloutState(exists=False)
    canary: Optional[RolloutState] = None
    """The canary Deployment's, while an experiment runs: its pods count in status.replicas."""
    choice: Optional[SpeculationChoice] = None
    choice_cause: Cause = Cause.DECLARED
    choice_reason: str = ""
    config_hash: Optional[str] = None
    method: Optional[str] = None
    selector: Optional[str] = None
    pods_waiting: Optional[tuple[str, str]] = None
    """Why the config's pods that are not ready wait, in their words (`failures.pods_waiting`):
    (reason, message); None when none waits on anything but its start."""


def model_cache_condition(spec: api.SpecDecodeServiceSpec) -> tuple[bool, str, str]:
    """ModelCacheEphemeral: True (a warning) while autotune may restart pods that download
    their weights again at every start."""
    if not spec.downloads_weights_at_start:
        return False, C.REASON_CACHE_PERSISTENT, "pods start from weights that survive restarts"
    if spec.autotune.mode == api.AutotuneMode.OFF:
        return False, C.REASON_AUTOTUNE_OFF, "the cache is an emptyDir, but autotune is Off: the operator restarts no pods"
    return True, C.REASON_CACHE_EMPTY_DIR, (
        "the model cache is an emptyDir: every change of K restarts the pods and downloads the weights "
        "again (the restart price includes it); set spec.modelCache.claimName to a PersistentVolumeClaim "
        "(ReadWriteMany for several nodes) to keep them")


def next_status(
    current: api.SpecDecodeServiceStatus,
    outcome: ReconcileOutcome,
    spec: Optional[api.SpecDecodeServiceSpec],
    generation: Optional[int],
    now: datetime,
) -> api.SpecDecodeServiceStatus:
    """The status after a reconcile. Fields owned by the control loop (observations,
    recommendation, history) are carried over untouched."""
    conds = list(current.conditions)
    if outcome.invalid_spec is not None:
        conds = set_condition(conds, C.COND_DEGRADED, True, C.REASON_INVALID_SPEC, outcome.invalid_spec, now, generation)
        return current.model_copy(update={"phase": C.PHASE_DEGRADED, "conditions": conds, "observed_generation": generation})

    r = outcome.rollout
    assert outcome.choice is not None and spec is not None
    described = outcome.choice.describe(outcome.method or "")
    config = f"config {outcome.config_hash} ({described})"

    if outcome.apply_error is not None:
        conds = set_condition(conds, C.COND_DEGRADED, True, C.REASON_APPLY_FAILED, outcome.apply_error, now, generation)
    elif r.deadline_exceeded and not r.live:
        conds = set_condition(
            conds, C.COND_DEGRADED, True, "ProgressDeadlineExceeded",
            f"the rollout of {config} exceeded its deadline: {r.updated}/{r.desired} pods updated, "
            f"{r.available} available", now, generation,
        )
    else:
        conds = set_condition(conds, C.COND_DEGRADED, False, "AsExpected", "", now, generation)

    earlier = current.speculation
    choice = outcome.choice
    same_choice = earlier is not None and earlier.enabled == choice.enabled and earlier.k == choice.k
    same_config = same_choice and earlier.config_hash == outcome.config_hash
    # A config that was live stays live while only the replica count moves: a canary
    # experiment's start and end scale the main Deployment, and GitOps health must stay
    # Healthy then (no Progressing, no new warm-up: no pod changed its config).
    live = r.live or (r.scaling and same_config and bool(earlier.live_since))

    if not r.exists:
        conds = set_condition(conds, C.COND_PROGRESSING, True, C.REASON_DEPLOYMENT_MISSING, f"creating the Deployment for {config}", now, generation)
    elif r.live:
        conds = set_condition(conds, C.COND_PROGRESSING, False, C.REASON_ROLLOUT_COMPLETE, f"all {r.desired} replicas run {config}", now, generation)
    elif live:
        conds = set_condition(
            conds, C.COND_PROGRESSING, False, C.REASON_SCALING,
            f"scaling to {r.desired} replicas of {config}: {r.available} available", now, generation,
        )
    else:
        conds = set_condition(
            conds, C.COND_PROGRESSING, True, C.REASON_ROLLING_OUT,
            f"rolling out {config}: {r.updated}/{r.desired} updated, {r.available} available", now, generation,
        )

    if r.available >= 1:
        conds = set_condition(conds, C.COND_READY, True, C.REASON_AVAILABLE, f"{r.available}/{r.desired} replicas available", now, generation)
    else:
        reason = "ScaledToZero" if r.exists and r.desired == 0 else C.REASON_UNAVAILABLE
        message = f"{r.available}/{r.desired} replicas available"
        if outcome.pods_waiting is not None and reason == C.REASON_UNAVAILABLE:
            reason, why = outcome.pods_waiting
            message = f"{message}: {why}"
        conds = set_condition(conds, C.COND_READY, False, reason, message, now, generation)

    if outcome.choice.enabled:
        spec_cond = (True, C.REASON_SPECULATION_ON, f"{described} {'running' if live else 'rolling out'}")
    elif spec.autotune.mode == api.AutotuneMode.OFF:
        spec_cond = (False, C.REASON_DISABLED_BY_USER, "speculation off")
    else:
        spec_cond = (False, C.REASON_SPECULATION_OFF, outcome.choice_reason)
    existing = get_condition(conds, C.COND_SPECULATION_EFFECTIVE)
    # The control loop writes SpeculationEffective with its numbers; keep its message while the
    # status (on/off) agrees with the choice, so reconcile and evaluation do not fight. This
    # pass's own "rolling out" is not the loop's: once the config runs it says so.
    ours_outdated = existing is not None and existing.message == f"{described} rolling out"
    if existing is None or (existing.status == "True") != spec_cond[0] or ours_outdated:
        conds = set_condition(conds, C.COND_SPECULATION_EFFECTIVE, *spec_cond, now, generation)

    conds = set_condition(conds, C.COND_MODEL_CACHE_EPHEMERAL, *model_cache_condition(spec), now, generation)
    risk = disruption.outage_risk(PolicySettings.from_spec(spec), spec.autotune.mode == api.AutotuneMode.AUTO)
    conds = set_condition(conds, C.COND_OUTAGE_RISK, risk.status, risk.reason, risk.message, now, generation)

    if outcome.apply_error is not None or (r.deadline_exceeded and not r.live):
        phase = C.PHASE_DEGRADED
    elif not r.exists or not live:
        phase = C.PHASE_PROGRESSING
    elif r.desired == 0:
        phase = C.PHASE_PENDING
    else:
        phase = C.PHASE_SERVING

    c = outcome.canary
    since = earlier.since if same_choice and earlier.since else rfc3339(now)
    # Warm-up and attribution count from the moment every replica ran this config.
    if not live:
        live_since = None
    elif same_config and earlier.live_since:
        live_since = earlier.live_since
    else:
        live_since = rfc3339(now)
    # The schedule fields are the control loop's: a reconcile renders the schedule status
    # holds (`state.choose`) and must not drop it, or the next reconcile renders plain K (a
    # restart) and the loop forgets the schedule it adopted.
    loop_fields: dict = {}
    if earlier is not None:
        loop_fields["schedule_reason"] = earlier.schedule_reason
        if choice.per_batch_size and earlier.schedule and not spec.speculation.per_batch_size_k:
            loop_fields.update(schedule=earlier.schedule, schedule_replaced_k=earlier.schedule_replaced_k,
                            schedule_step_scale=earlier.schedule_step_scale)
    # So is the collapse guard's evidence (when the running config's acceptance was first seen
    # below the floor): a reconcile that dropped it would restart the guard's confirmation
    # every pass, and a collapse would never be confirmed (seen end to end: the field set by
    # each evaluation and cleared by the reconcile a second later, speculation left on).
    if earlier is not None and same_config:
        loop_fields["below_floor_since"] = earlier.below_floor_since
    effective = api.EffectiveSpeculation(
        enabled=choice.enabled,
        method=outcome.method,
        k=choice.k,
        since=since,
        reason=outcome.choice_reason,
        cause=outcome.choice_cause.value,
        config_hash=outcome.config_hash,
        live=live,
        live_since=live_since,
        spec_hash=declared_speculation_hash(spec),
        **loop_fields,
    )
    return current.model_copy(
        update={
            "phase": phase,
            "conditions": conds,
            "observed_generation": generation,
            # Every vLLM pod behind the Service counts, a canary's too: status.selector (the
            # scale subresource's, which an HPA reads) matches them, they serve their share of
            # the traffic, and with a capacity-neutral canary main + canary = spec.replicas.
            # Phase, Ready and Progressing describe the main Deployment alone.
            "replicas": (r.replicas if r.exists else 0) + (c.replicas if c is not None and c.exists else 0),
            "ready_replicas": (r.ready if r.exists else 0) + (c.ready if c is not None and c.exists else 0),
            "selector": outcome.selector,
            "speculation": effective,
        }
    )
