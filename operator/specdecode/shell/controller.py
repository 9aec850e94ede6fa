"""Reconcile one SpecDecodeService: render, apply what differs, read the rollout, write status.

Level-triggered and idempotent: every pass works from the newest version of the object this
process knows (kopf's watch, our own writes: `bodies`; the API when none is known) and of its
children (read, or taken from the Deployment event that called it), so the kopf handlers
(create, update, resume, timer, Deployment events) all call the same `reconcile`.
Nothing is remembered between passes; the operator's own choice of speculation lives in
status, so a restarted operator carries on where it stopped.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from kubernetes.client.exceptions import ApiException

from .. import api
from .. import constants as C
from . import crashpoints, instrumentation
from . import experiments as experiment_shell
from ..control import experiments
from ..control import failures
from ..render import preflight, workload as render
from ..control import fallback
from ..control import state as cs
from ..control import status as st
from .bodies import version_order
from .kube import Conflict, Kube, content_drift

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _api_error_message(err: ApiException) -> str:
    return f"{err.status} {err.reason}: {(err.body or '')[:300]}"


def _resource_version(obj: Optional[dict[str, Any]]) -> Optional[str]:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def _object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


@dataclass(frozen=True)
class Children:
    """Which of a service's children a pass reads (the API traffic of a fleet is mostly these
    reads). Every child by default, with the check for stale ones. `only`: these kinds and the
    Deployment (status reports its rollout), no stale check: a Deployment event says nothing
    about the Service. `new`: a service just created, whose children are taken as absent:
    applied without a read, and none can be stale. `seen`: a child as its watch event
    delivered it, used instead of reading it when it is at least as new as every version of it
    the operator has read or written (an event that waited in kopf's queue may predate a newer
    state, and would turn Serving back into Progressing: that one is read)."""

    only: Optional[frozenset[str]] = None
    new: bool = False
    seen: Optional[dict[str, Any]] = field(default=None, compare=False)

    @classmethod
    def new_service(cls) -> "Children":
        return cls(new=True)

    @classmethod
    def deployment(cls, seen: Optional[dict[str, Any]] = None) -> "Children":
        return cls(only=frozenset({"Deployment"}), seen=seen)


EVERYTHING = Children()


@dataclass(frozen=True)
class LiveChildren:
    """What `_apply_children` found or wrote: the live main and canary Deployments, the kinds
    written and the errors of the writes that failed."""

    deployment: Optional[dict[str, Any]]
    canary: Optional[dict[str, Any]]
    applied: list[str]
    error: Optional[str]


def _experiment_marker(status: api.SpecDecodeServiceStatus) -> str:
    """Names the newest experiment in status ("" before the first): a canary exists only for a
    running one, so once deleted it stays deleted until this changes."""
    newest = status.experiments[-1] if status.experiments else None
    return f"{newest.started_at}/{newest.candidate_hash}" if newest is not None else ""


def _apply_failed(body: dict[str, Any]) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == C.COND_DEGRADED and c.get("reason") == C.REASON_APPLY_FAILED for c in conditions)


def _has_pods(deployment: Optional[dict[str, Any]]) -> bool:
    """Whether the Deployment has pods (its controller counts them in status): a new one has
    none yet, so there is no pod to list for a start-up failure."""
    return bool(((deployment or {}).get("status") or {}).get("replicas"))


def check_replicas(spec: api.SpecDecodeServiceSpec, limit: Optional[int]) -> None:
    """The operator's own ceiling on replicas (each pod holds GPUs): a typo such as 1024 must
    not schedule hundreds of pods."""
    if limit is not None and spec.replicas > limit:
        raise api.SpecError(
            f"spec.replicas: {spec.replicas} is above this operator's limit of {limit}: lower it, "
            "or raise the operator's SPECDECODE_MAX_REPLICAS (--max-replicas)"
        )


# A rollout's counts alone (pods updated, available) are written from a Deployment event at
# most this often per service; the periodic pass writes them whatever their age.
COUNTS_WRITE_INTERVAL_S = 10.0


class Controller:
    """The reconcile shell around the pure render and status functions."""

    def __init__(self, kube: Kube, clock: Clock = utcnow, logger: Optional[logging.Logger] = None,
                 model_cache_root: Optional[Path] = None, max_replicas: Optional[int] = None):
        self.kube = kube
        self.max_replicas = max_replicas
        self.model_cache_root = model_cache_root
        self.clock = clock
        self.log = logger or logging.getLogger("specdecode.shell.controller")
        self._locks: defaultdict[tuple[str, str], threading.RLock] = defaultdict(threading.RLock)
        self._locks_guard = threading.Lock()
        # Services whose canary is known deleted, by (namespace, name): the experiment marker
        # (`_experiment_marker`) status named then.
        self._canary_gone: dict[tuple[str, str], str] = {}
        # Objects whose last apply changed nothing although content_drift saw a difference
        # (the apiserver's own spelling of a value), by (kind, namespace, name): resourceVersion.
        self._noop_applies: dict[tuple[str, str, str], str] = {}
        # The newest version of each child read or written, by (kind, namespace, name): a
        # child a watch event delivered is used unread only when it is not older than this.
        self._child_versions: dict[tuple[str, str, str], int] = {}
        # When each service's status was last written, by (namespace, name): a Deployment
        # event that changes only a rollout's counts is not written within
        # COUNTS_WRITE_INTERVAL_S of it.
        self._status_written: dict[tuple[str, str], datetime] = {}

    def lock_for(self, namespace: str, name: str) -> threading.RLock:
        """One lock per service: reconciles and evaluations of a service never interleave (an
        evaluation that changes speculation reconciles while holding it, hence re-entrant)."""
        with self._locks_guard:
            return self._locks[(namespace, name)]

    # ------------------------------------------------------------------------------ reconcile

    def follow(self, body: Mapping[str, Any]) -> None:
        """Read the service from kopf's view of it (it follows the watch) instead of the API."""
        self.kube.services.follow(body)

    def reconcile(self, namespace: str, name: str, children: Children = EVERYTHING) -> str:
        """One pass; returns its outcome: ok, error (a child could not be written: retry),
        invalid_spec (waits for a spec change) or gone. `children`: which to read (default:
        every one). The service is the newest version this process knows (kopf's watch, our
        own writes) and is read from the API only when none is known, or when a status write
        finds that one stale."""
        with self.lock_for(namespace, name):
            known = self.kube.services.newest(namespace, name)
            try:
                return self._pass(namespace, name, known or self.kube.get(C.API_VERSION, C.KIND, name, namespace),
                                  children)
            except Conflict:
                if known is None:
                    raise
            # Someone wrote the service since the watch showed it: read it and pass again,
            # reading the children too (what the first pass applied is not applied twice).
            return self._pass(namespace, name, self.kube.get(C.API_VERSION, C.KIND, name, namespace),
                              EVERYTHING if children.new else children)

    def _pass(self, namespace: str, name: str, body: Optional[dict[str, Any]], children: Children) -> str:
        if body is None or body["metadata"].get("deletionTimestamp"):
            self._forget(namespace, name)
            return "gone"
        if children.only is not None and _apply_failed(body):
            # A partial pass cannot tell whether the failed child is repaired now: look at all.
            children = EVERYTHING
        try:
            result = self._reconcile(body, children)
        except Conflict:
            raise  # not an error: the pass is made again on a newer version
        except Exception:
            instrumentation.RECONCILES.labels("error").inc()
            instrumentation.ERRORS.labels("reconcile").inc()
            raise
        instrumentation.RECONCILES.labels(result).inc()
        return result

    def _forget(self, namespace: str, name: str) -> None:
        """A service is gone: drop what this process kept of it and its children."""
        self.kube.services.forget(namespace, name)
        instrumentation.forget_service(namespace, name)
        children = {name, render.canary_name(name)}
        with self._locks_guard:
            for kept in (self._child_versions, self._noop_applies):
                for key in [k for k in kept if k[1] == namespace and k[2] in children]:
                    del kept[key]
            self._canary_gone.pop((namespace, name), None)
            self._status_written.pop((namespace, name), None)

    def _reconcile(self, body: dict[str, Any], children: Children = EVERYTHING) -> str:
        now = self.clock()
        meta = body["metadata"]
        generation = meta.get("generation")
        current = api.SpecDecodeServiceStatus.model_validate(body.get("status") or {})

        try:
            service = api.parse_service({k: v for k, v in body.items() if k != "status"})
            check_replicas(service.spec, self.max_replicas)
            # A start-up failure is remembered until the spec changes (or, unclassified, until
            # its retry back-off passes); then the declared speculation is tried again.
            remembered = fallback.forget_stale_failures(current, service.spec, generation, now)
            choice, cause, reason = cs.choose(service.spec, remembered)
            compat = self._preflight(service.spec)
            choice, cause, reason = fallback.preflight_choice(
                service.spec, choice, cause, reason, compat.compatible, compat.message)
            served = self.kube.is_served(render.PODMONITOR_API_VERSION, "PodMonitor")
            config = render.config_hash(service.spec, choice)
            record = experiments.running_record(remembered)
            cancel = None if record is None else experiments.cancel_reason(
                service.spec, experiments.Experiment.from_record(record, service.spec), config,
                cs.excluded_ks(service.spec, remembered.failed_configs))
            canary = experiment_shell.canary_for(service.spec, record) if cancel is None else None
            objects = render.render_all(service, choice, owner_uid=meta["uid"], pod_monitor_served=served, canary=canary)
        except (api.SpecError, render.RenderError) as err:
            # Children stay as they are: a bad edit must not take a serving model down.
            message = str(err)
            outcome = st.ReconcileOutcome(invalid_spec=message)
            new = st.next_status(current, outcome, None, generation, now)
            if self._write_status(body, current, new):
                self.kube.post_event(body, "Warning", C.EVENT_INVALID_SPEC, message, now)
            return "invalid_spec"

        spec = service.spec
        live = self._apply_children(objects, service, body, now, children, _experiment_marker(remembered))
        deployment, applied, apply_error = live.deployment, live.applied, live.error
        if "Deployment" in applied:
            crashpoints.reach(crashpoints.DEPLOYMENT_APPLIED)
        rollout = st.rollout_state(deployment, config)
        # The config's pods, read only while its rollout is not live: why they wait goes into
        # status (Ready's reason and message), and a start-up failure is looked for among them.
        pods = self._config_pods(service, config) if not rollout.live and _has_pods(deployment) else None
        outcome = st.ReconcileOutcome(
            apply_error=apply_error,
            rollout=rollout,
            canary=st.rollout_state(live.canary, render.config_hash(spec, canary.candidate))
            if live.canary is not None and canary is not None else None,
            choice=choice,
            choice_cause=cause,
            choice_reason=reason,
            config_hash=config,
            method=spec.speculation.method.value,
            selector=render.selector_string(service.name),
            pods_waiting=failures.pods_waiting(pods) if pods else None,
        )
        new = st.next_status(remembered, outcome, spec, generation, now)
        draft_message = f"{compat.message} Fix: {compat.fix}" if compat.fix else compat.message
        conditions = st.set_condition(new.conditions, C.COND_DRAFT_COMPATIBLE, compat.status, compat.reason,
                                      draft_message, now, generation)
        if conditions != new.conditions:
            new = new.model_copy(update={"conditions": conditions})
        events: list[tuple[str, str, str]] = []
        rerender = False
        if pods is not None:
            found = self._startup_failure(service, choice, config, now, pods=pods)
            if found is not None:
                result = fallback.apply_startup_failure(new, spec, choice, config, *found, generation, now)
                new, events, rerender = result.status, list(result.events), result.rerender
        if canary is not None and cancel is None and _has_pods(live.canary):
            cancel = self._canary_failure(service, canary.candidate, live.canary, now)
        cancelled = cancel is not None and experiments.running_record(new) is not None
        if cancelled:
            # The one cancel path (it writes this pass's status too); the pass below, without
            # the experiment, deletes the canary and gives the main Deployment its replicas back.
            experiment_shell.cancel_running_experiment(self.kube, body, new, cancel, now)
            self.log.warning("%s/%s: experiment cancelled: %s", service.namespace, service.name, cancel)
        elif children.only is not None and not applied and self._counts_only_and_recent(body, current, new, now):
            # A Deployment event that brings a rollout's counts alone (each Deployment sends 3
            # to 5 as its pods start), soon after the last write. Each written, 500 new
            # services made 2,270 status writes while they came up instead of 1,250, and every
            # one was Serving 30 s later. The next change of phase or condition is written, and
            # the periodic pass writes the counts whatever their age.
            pass
        else:
            self._write_status(body, current, new)
        for type_, reason_, message in events:
            self.kube.post_event(body, type_, reason_, message, now)
        if rerender:
            # The fallback is in status now: count it, then render the service without speculation.
            instrumentation.record_decision(service.namespace, service.name, "fallback", spec.autotune.mode.value)
            self.log.warning("%s/%s: %s", service.namespace, service.name, events[0][2] if events else "fallback")
        if rerender or cancelled:
            return self._reconcile(self.kube.get(C.API_VERSION, C.KIND, service.name, service.namespace),
                                   EVERYTHING if rerender else children)
        if applied:
            described = choice.describe(spec.speculation.method.value)
            self.kube.post_event(
                body, "Normal", C.EVENT_APPLIED, f"applied {', '.join(applied)} for config {config} ({described})", now
            )
        if apply_error:
            self.kube.post_event(body, "Warning", C.REASON_APPLY_FAILED, apply_error, now)
        instrumentation.record_speculation(service.namespace, service.name, choice.k)
        return "error" if apply_error else "ok"

    def _preflight(self, spec: api.SpecDecodeServiceSpec) -> preflight.DraftCompatibility:
        """Draft compatibility from the configs on the model-cache volume, where the operator
        can read it; Unknown otherwise (nothing is fetched from the hub)."""
        if self.model_cache_root is None:
            return preflight.DraftCompatibility(
                "Unknown", preflight.REASON_NOT_CHECKED,
                "preflight off: set SPECDECODE_MODEL_CACHE_ROOT where the operator can read the model cache",
            )
        return preflight.preflight(spec, self.model_cache_root)

    def _canary_failure(self, service: api.SpecDecodeService, candidate: render.SpeculationChoice,
                        canary: Optional[dict[str, Any]], now: datetime) -> Optional[str]:
        """Why the canary's pods cannot start (the start-up failure classification of the main
        Deployment's pods), as a cancel reason; None while they start or run."""
        config = render.config_hash(service.spec, candidate)
        if st.rollout_state(canary, config).live:
            return None
        found = self._startup_failure(service, candidate, config, now, canary=True)
        if found is None:
            return None
        failure, diagnosis = found
        where = f"pod {failure.pod}: {diagnosis.line or failure.detail}"
        return f"the canary's pods cannot start: {diagnosis.cause.value}: {where}. Fix: {diagnosis.fix}"

    def _config_pods(self, service: api.SpecDecodeService, config: str, canary: bool = False) -> list[dict[str, Any]]:
        """The pods of the config: the canary's, or else the main Deployment's (a canary that
        runs the same config is not theirs)."""
        which = f"{C.LABEL_CANARY}=true" if canary else f"!{C.LABEL_CANARY}"
        selector = f"{render.selector_string(service.name)},{which},{C.LABEL_CONFIG_HASH}={config}"
        return self.kube.list("v1", "Pod", service.namespace, label_selector=selector)

    def _startup_failure(
        self, service: api.SpecDecodeService, choice: render.SpeculationChoice, config: str, now: datetime,
        canary: bool = False, pods: Optional[list[dict[str, Any]]] = None,
    ) -> Optional[tuple[failures.PodFailure, failures.Diagnosis]]:
        """The first pod of the config that cannot start, and why (its termination message and
        log tail, read as `kubectl logs [--previous]` would), among ``pods`` (default: the
        config's, `_config_pods`)."""
        spec = service.spec
        if pods is None:
            pods = self._config_pods(service, config, canary)
        deadline_s = api.parse_duration(spec.rollout.startup_timeout)
        failing = failures.pods_failing(pods, config, now, deadline_s)
        if not failing:
            return None
        first = failing[0]
        log_text = self.kube.pod_log(service.namespace, first.pod, first.container, previous=first.previous_log)
        speculation = failures.PodSpeculation.of(spec, enabled=choice.enabled, k=choice.k)
        return first, failures.diagnose_pod_failure(first, log_text, speculation)

    def _apply_children(
        self, objects: list[dict[str, Any]], service: api.SpecDecodeService, body: dict[str, Any], now: datetime,
        children: Children = EVERYTHING, experiment: str = "",
    ) -> "LiveChildren":
        """Apply each rendered object that is missing, was rendered differently (the hash
        annotation) or lacks some of what we render (content drift, whoever caused it); delete
        stale ones. One child failing does not stop the others. `children`: which to read;
        `experiment`: which experiment status last named (`_experiment_marker`).

        Returns the live Deployments (main and canary), the kinds written, and the errors of
        the writes that failed.
        """
        applied: list[str] = []
        errors: list[str] = []
        deployment: Optional[dict[str, Any]] = None
        canary: Optional[dict[str, Any]] = None
        canary_name = render.canary_name(service.name)
        for obj in objects:
            kind = obj["kind"]
            if children.only is not None and kind not in children.only and kind != "Deployment":
                continue
            live: Optional[dict[str, Any]] = None
            try:
                if not children.new:
                    live = self._read_child(obj, service.namespace, children.seen)
                if self._needs_apply(obj, live):
                    result = self._apply_one(obj, live, body, now)
                    if live is None or _resource_version(result) != _resource_version(live):
                        applied.append(kind)
                    else:
                        # Nothing changed: what differs is the apiserver's spelling (a quantity,
                        # say), not drift. Remember it so the next pass does not apply again.
                        self._noop_applies[_object_key(obj)] = _resource_version(result)
                    live = result
                    self._saw_child((kind, service.namespace, obj["metadata"]["name"]), live)
            except ApiException as err:
                instrumentation.ERRORS.labels("apply").inc()
                errors.append(f"applying {kind} failed: {_api_error_message(err)}")
            if kind == "Deployment" and obj["metadata"]["name"] == canary_name:
                canary = live
            elif kind == "Deployment":
                deployment = live
        if not children.new:
            if children.only is None:
                self._delete_stale(objects, service, applied, errors)
            # The canary is a Deployment: its own events (a deletion, a finished one) come as
            # Deployment passes, so those look for a stale one too.
            self._delete_stale_canary(objects, service, applied, errors, experiment)
        return LiveChildren(deployment, canary, applied, "; ".join(errors) or None)

    def _read_child(self, obj: dict[str, Any], namespace: str, seen: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        """The child as its watch event delivered it when that is the newest version known, else
        as the API has it now."""
        key = (obj["kind"], namespace, obj["metadata"]["name"])
        if seen is not None:
            seen_meta = seen.get("metadata") or {}
            order = version_order(seen)
            with self._locks_guard:
                known = self._child_versions.get(key)
            if ((seen.get("kind", obj["kind"]), seen_meta.get("namespace"), seen_meta.get("name")) == key
                    and order is not None and (known is None or order >= known)):
                self._saw_child(key, seen)
                return seen
        live = self.kube.get(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], namespace)
        self._saw_child(key, live)
        return live

    def _saw_child(self, key: tuple[str, str, str], live: Optional[dict[str, Any]]) -> None:
        """Remember the resourceVersion of a child just read or written (not the child)."""
        order = version_order(live)
        if order is not None:
            with self._locks_guard:
                self._child_versions[key] = max(order, self._child_versions.get(key, order))

    def _delete_stale_canary(self, objects: list[dict[str, Any]], service: api.SpecDecodeService,
                             applied: list[str], errors: list[str], experiment: str) -> None:
        """Delete the canary when no experiment runs. Read only until it is known gone for the
        experiment status last named: a service whose experiment ended costs no read per pass
        (a canary appears only with a new experiment, which changes the marker)."""
        name = render.canary_name(service.name)
        key = (service.namespace, service.name)
        if any(o["kind"] == "Deployment" and o["metadata"]["name"] == name for o in objects):
            self._canary_gone.pop(key, None)
            return
        if not experiment or self._canary_gone.get(key) == experiment:
            return  # no experiment ever (status keeps the newest): no canary of ours
        try:
            stale = self.kube.get("apps/v1", "Deployment", name, service.namespace)
            labels = (stale or {}).get("metadata", {}).get("labels") or {}
            if stale and labels.get(C.LABEL_MANAGED_BY) == C.LABEL_MANAGED_BY_VALUE:
                self.kube.delete("apps/v1", "Deployment", name, service.namespace)
                applied.append("deleted canary Deployment")
            self._canary_gone[key] = experiment
        except ApiException as err:
            instrumentation.ERRORS.labels("apply").inc()
            errors.append(f"deleting Deployment {name} failed: {_api_error_message(err)}")

    def _delete_stale(self, objects: list[dict[str, Any]], service: api.SpecDecodeService, applied: list[str],
                      errors: list[str]) -> None:
        """Server-side apply never deletes: delete the optional children no longer rendered."""
        rendered_kinds = {o["kind"] for o in objects}
        for api_version, kind in (("policy/v1", "PodDisruptionBudget"), (render.PODMONITOR_API_VERSION, "PodMonitor")):
            try:
                if kind in rendered_kinds or not self.kube.is_served(api_version, kind):
                    continue
                stale = self.kube.get(api_version, kind, service.name, service.namespace)
                labels = (stale or {}).get("metadata", {}).get("labels") or {}
                if stale and labels.get(C.LABEL_MANAGED_BY) == C.LABEL_MANAGED_BY_VALUE:
                    self.kube.delete(api_version, kind, service.name, service.namespace)
                    applied.append(f"deleted {kind}")
            except ApiException as err:
                instrumentation.ERRORS.labels("apply").inc()
                errors.append(f"deleting {kind} failed: {_api_error_message(err)}")

    def _needs_apply(self, obj: dict[str, Any], live: Optional[dict[str, Any]]) -> bool:
        if live is None:
            return True
        wanted = obj["metadata"]["annotations"][C.ANNOTATION_APPLIED_HASH]
        have = (live.get("metadata", {}).get("annotations") or {}).get(C.ANNOTATION_APPLIED_HASH)
        if have != wanted:
            return True
        drift = content_drift(obj, live)
        if drift is None:
            return False
        if self._noop_applies.get(_object_key(obj)) == _resource_version(live):
            return False
        self.log.info("%s %s/%s drifted at %s: applying it again", obj["kind"], live["metadata"].get("namespace"),
                      obj["metadata"]["name"], drift)
        return True

    def _apply_one(
        self, obj: dict[str, Any], live: Optional[dict[str, Any]], owner: dict[str, Any], now: datetime
    ) -> dict[str, Any]:
        """Server-side apply; when a foreign edit makes the apply itself invalid (422), take the
        fields back by replacing them, else (not for a Deployment: its pods would go) recreate
        the object; either way a Warning Event says what happened."""
        try:
            return self.kube.apply(obj)
        except ApiException as err:
            if err.status != 422 or live is None:
                raise
            refused = _api_error_message(err)
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            self.kube.take_back(obj, live)
            self.kube.post_event(owner, "Warning", C.EVENT_TOOK_BACK,
                                 f"{kind} {name}: a foreign edit made the apply fail ({refused}); "
                                 "replaced the operator's fields with the rendered ones", now)
        except ApiException as second:
            if second.status != 422 or kind == "Deployment":
                raise
            self.kube.delete(obj["apiVersion"], kind, name, live["metadata"].get("namespace"))
            self.kube.post_event(owner, "Warning", C.EVENT_RECREATED,
                                 f"{kind} {name}: a foreign edit made the apply fail ({refused}) and the "
                                 f"fields could not be replaced ({_api_error_message(second)}); recreated it", now)
        return self.kube.apply(obj)

    def _counts_only_and_recent(self, body: dict[str, Any], current: api.SpecDecodeServiceStatus,
                                new: api.SpecDecodeServiceStatus, now: datetime) -> bool:
        meta = body["metadata"]
        written = self._status_written.get((meta.get("namespace"), meta["name"]))
        return (written is not None and (now - written).total_seconds() < COUNTS_WRITE_INTERVAL_S
                and st.only_rollout_counts_changed(current, new))

    def _write_status(
        self, body: dict[str, Any], current: api.SpecDecodeServiceStatus, new: api.SpecDecodeServiceStatus
    ) -> bool:
        """Write status only when it changed; True when written. The phase and condition
        metrics follow what status says either way (an operator restart sets them at once)."""
        meta = body["metadata"]
        instrumentation.record_status(meta.get("namespace", ""), meta["name"], new.phase,
                                      ((c.type, c.status, c.reason) for c in new.conditions))
        if new.to_wire() == current.to_wire():
            return False
        try:
            self.kube.replace_status(body, new.to_wire())
        except ApiException:
            instrumentation.ERRORS.labels("status").inc()
            raise
        self._status_written[(meta.get("namespace"), meta["name"])] = self.clock()
        return True
