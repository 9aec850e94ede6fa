"""Canary experiments, the shell's side: the canary the reconcile runs, and the one way the
shell ends an experiment from outside its test.

The evaluator ends experiments by their test (promote, abort) in the control loop's status
write. The shell ends one when the canary cannot run what the record says: its pods cannot
start, or the spec no longer allows the experiment (`control.experiments.cancel_reason`, the
control step's check too: checked before anything is applied, so a canary never runs a
config its record does not name and the main Deployment never lends a replica it does not
have). Every such end goes through `cancel_running_experiment`: one status write (the
record ended Cancelled with the reason), one Warning Event, the experiments counter.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from .. import api
from .. import constants as C
from .. import timestamps
from ..control import evaluation, experiments
from ..render import workload as render
from . import instrumentation
from .kube import Kube


def candidate_of(record: api.ExperimentRecord, spec: api.SpecDecodeServiceSpec) -> render.SpeculationChoice:
    """What the record's canary runs: its K (or speculation off), under its schedule if any."""
    k = record.candidate_k if record.candidate_enabled else None
    return experiments.candidate_choice(k, experiments.record_schedule(record, spec))


def canary_for(spec: api.SpecDecodeServiceSpec, record: Optional[api.ExperimentRecord]) -> Optional[render.Canary]:
    """The canary to render for a running experiment (None when none runs)."""
    if record is None:
        return None
    plan = experiments.CanaryPlan.from_spec(spec)
    return render.Canary(candidate=candidate_of(record, spec), replicas=plan.replicas, main_replicas=plan.main_replicas(spec))


def cancelled(status: api.SpecDecodeServiceStatus, reason: str, now: datetime,
              generation: Optional[int]) -> Optional[api.SpecDecodeServiceStatus]:
    """`status` with its running experiment ended Cancelled for `reason` (None: none runs)."""
    record = experiments.running_record(status)
    if record is None:
        return None
    ended = record.model_copy(update={"verdict": experiments.Verdict.CANCELLED.value,
                                      "ended_at": timestamps.rfc3339(now), "reason": reason[:512]})
    conditions = evaluation.experimenting_condition(status.conditions, ended, now, generation)
    return status.model_copy(update={"experiments": [*status.experiments[:-1], ended], "conditions": conditions})


def cancel_running_experiment(kube: Kube, body: dict[str, Any], status: api.SpecDecodeServiceStatus, reason: str,
                              now: datetime) -> Optional[api.SpecDecodeServiceStatus]:
    """End the running experiment Cancelled: write `status` (the caller's new status, or the
    object's own) with the record ended, post a Warning Event and count the outcome. Returns
    the status written, None when no experiment was running (nothing written). The status
    write is guarded by the object's resourceVersion: a Conflict leaves the experiment running
    for the retry to judge again."""
    meta = body["metadata"]
    record = experiments.running_record(status)
    new = cancelled(status, reason, now, meta.get("generation"))
    if record is None or new is None:
        return None
    kube.replace_status(body, new.to_wire())
    instrumentation.record_experiment(meta["namespace"], meta["name"], record.purpose, experiments.Verdict.CANCELLED.value)
    kube.post_event(body, "Warning", C.EVENT_EXPERIMENT_CANCELLED,
                    f"{record.purpose} experiment with {record.candidate} cancelled: {reason}", now)
    return new
