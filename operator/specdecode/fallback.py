"""What to do when the pods of the running config cannot start (pure).

The most common way speculation breaks production is pods that never start: a draft whose
vocabulary differs from the target's, a draft that pushes the GPU out of memory, a method
the vLLM version lacks. The controller finds the failing pods and their diagnosis
(`specdecode.control.failures`); this module decides: fall back to no speculation (Auto mode, when
the user allows it), report only (Recommend and Off modes), or report Degraded (speculation
may not be turned off, or the failure has nothing to do with speculation).

A failed speculative config is remembered in status.failedConfigs: while it is remembered no
speculative config is tried again (the known causes fail for every K), until the spec
changes, or, for causes we cannot classify, until autotune.startupFailureRetry has passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Optional

from . import api
from . import constants as C
from . import status as st
from .control.failures import Diagnosis, PodFailure
from .render.workload import SpeculationChoice
from . import timestamps

STARTUP_FAILURE_PREFIX = "startup failure: "


class Verdict(str, Enum):
    FALLBACK = "fallback"  # re-render without speculation
    REPORT = "report"  # say so, change nothing (Recommend / Off mode)
    DEGRADED = "degraded"  # no fallback possible or not a speculation problem


def verdict(spec: api.SpecDecodeServiceSpec, choice: SpeculationChoice, diagnosis: Diagnosis) -> Verdict:
    if not choice.enabled or not diagnosis.speculation_related:
        return Verdict.DEGRADED
    if spec.autotune.mode != api.AutotuneMode.AUTO:
        return Verdict.REPORT
    if not spec.speculation.allow_disable:
        return Verdict.DEGRADED
    return Verdict.FALLBACK


def active_failures(
    status: api.SpecDecodeServiceStatus, spec: api.SpecDecodeServiceSpec, generation: Optional[int], now: datetime
) -> list[api.FailedConfig]:
    """Failed configs still remembered: same spec generation, and for unclassified causes
    within the retry back-off."""
    retry_s = api.parse_duration(spec.autotune.startup_failure_retry)
    keep = []
    for failed in status.failed_configs:
        if failed.spec_generation != generation:
            continue  # the spec changed: the user may have fixed it
        if not failed.classified and (now - timestamps.parse_rfc3339(failed.at)).total_seconds() >= retry_s:
            continue
        keep.append(failed)
    return keep


def forget_stale_failures(
    status: api.SpecDecodeServiceStatus, spec: api.SpecDecodeServiceSpec, generation: Optional[int], now: datetime
) -> api.SpecDecodeServiceStatus:
    """Status without the failures no longer remembered; a fallback they caused is undone,
    so the next render starts again from the declared speculation."""
    keep = active_failures(status, spec, generation, now)
    if len(keep) == len(status.failed_configs):
        return status
    effective = status.speculation
    if effective is not None and not effective.enabled and (effective.reason or "").startswith(STARTUP_FAILURE_PREFIX) and not keep:
        effective = None
    return status.model_copy(update={"failed_configs": keep, "speculation": effective})


@dataclass(frozen=True)
class StartupOutcome:
    status: api.SpecDecodeServiceStatus
    events: tuple[tuple[str, str, str], ...]
    rerender: bool


def apply_startup_failure(
    status: api.SpecDecodeServiceStatus,
    spec: api.SpecDecodeServiceSpec,
    choice: SpeculationChoice,
    config_hash: str,
    failure: PodFailure,
    diagnosis: Diagnosis,
    generation: Optional[int],
    now: datetime,
) -> StartupOutcome:
    """The status after pods of `config_hash` failed to start for `diagnosis`."""
    decided = verdict(spec, choice, diagnosis)
    cause = diagnosis.cause.value
    where = f"pod {failure.pod}: {diagnosis.line or failure.detail}"
    message = f"{cause}: {where}. Fix: {diagnosis.fix}"[:4000]
    conds = list(status.conditions)
    updates: dict = {}
    events: list[tuple[str, str, str]] = []
    already = any(f.config_hash == config_hash for f in status.failed_configs)

    if choice.enabled and diagnosis.speculation_related and not already:
        record = api.FailedConfig(
            config_hash=config_hash, k=choice.k, spec_generation=generation or 0, cause=cause,
            message=(diagnosis.line or failure.detail)[:2048], at=timestamps.rfc3339(now), classified=diagnosis.classified,
        )
        updates["failed_configs"] = [*status.failed_configs, record][-16:]

    if decided is Verdict.FALLBACK:
        conds = st.set_condition(conds, C.COND_SPECULATION_EFFECTIVE, False, C.REASON_STARTUP_FAILURE, message, now, generation)
        conds = st.set_condition(conds, C.COND_DEGRADED, False, "AsExpected", "", now, generation)
        updates["speculation"] = api.EffectiveSpeculation(
            enabled=False, method=spec.speculation.method.value, since=timestamps.rfc3339(now),
            reason=f"{STARTUP_FAILURE_PREFIX}{cause}"[:1024], live=False, spec_hash=st.declared_speculation_hash(spec),
        )
        history = [*status.history, api.DecisionRecord(
            time=timestamps.rfc3339(now), action="fallback", from_k=choice.k, to_k=None, applied=True,
            reason=f"pods of {choice.describe(spec.speculation.method.value)} cannot start: {cause}"[:1024],
        )]
        updates["history"] = history[-C.MAX_DECISION_HISTORY:]
        events.append(("Warning", C.REASON_STARTUP_FAILURE, f"speculation turned off: {message}"))
    else:
        conds = st.set_condition(conds, C.COND_DEGRADED, True, C.REASON_STARTUP_FAILURE, message, now, generation)
        if decided is Verdict.REPORT:
            conds = st.set_condition(conds, C.COND_SPECULATION_EFFECTIVE, False, C.REASON_STARTUP_FAILURE, message, now, generation)
        if st.get_condition(status.conditions, C.COND_DEGRADED) != st.get_condition(conds, C.COND_DEGRADED):
            events.append(("Warning", C.REASON_STARTUP_FAILURE, message))
    new = status.model_copy(update={"conditions": conds, **updates})
    return StartupOutcome(new, tuple(events), decided is Verdict.FALLBACK)


DRAFT_INCOMPATIBLE_PREFIX = "draft incompatible: "


def preflight_choice(
    spec: api.SpecDecodeServiceSpec,
    choice: SpeculationChoice,
    reason: str,
    compatible: Optional[bool],
    message: str,
) -> tuple[SpeculationChoice, str]:
    """The speculation to render given the draft preflight: in Auto mode a draft known to be
    incompatible is not rolled out (its pods would crash-loop); once the preflight passes, a
    choice made because of it gives way to the declared speculation."""
    may_disable = spec.autotune.mode == api.AutotuneMode.AUTO and spec.speculation.allow_disable
    if compatible is False and choice.enabled and may_disable:
        return SpeculationChoice.off(), f"{DRAFT_INCOMPATIBLE_PREFIX}{message}"[:1024]
    if compatible is not False and not choice.enabled and reason.startswith(DRAFT_INCOMPATIBLE_PREFIX):
        return SpeculationChoice(k=spec.speculation.num_speculative_tokens), "declared in spec (draft preflight passed)"
    return choice, reason
