"""The control loop's shell: read Prometheus once per tick for every service, let the
policy decide for the services that are due, record the decision, re-render on a change.

A per-object kopf timer calls `evaluate_if_due` every `evaluationTick` with the object kopf
last saw and the service's `ServiceMemory`; all services share one batched read per
(Prometheus, window, selector) and tick, so the number of queries does not grow with the
number of services. Running from kopf timers (not a free-running task)
means evaluation pauses with everything else when kopf's peering hands control to another
replica.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping, Optional

from kubernetes.client.exceptions import ApiException

from .. import api
from .. import constants as C
from . import crashpoints, instrumentation, process_memory
from ..control import memo
from ..control import metrics
from ..control import evaluation
from ..control.experiments import running_record
from ..control.decision import Decision
from ..control.settings import PolicySettings, PolicyTuning
from .controller import Clock, Controller, utcnow
from .kube import Kube
from .prometheus import PrometheusReader
from .settings import OperatorSettings

ReaderFactory = Callable[[metrics.PrometheusAccess], PrometheusReader]


@dataclass
class _CachedRead:
    at: float
    """When the read finished: a read of a large fleet takes longer than a tick, and dating
    it by its start left it stale on arrival, so each read served only the evaluations that
    had waited for it (15 a minute at 500 services)."""
    scopes: frozenset[metrics.QueryScope]
    result: metrics.ReadResult


@dataclass
class _Flight:
    """A read in progress: callers that need what it covers wait for it instead of reading."""

    scopes: frozenset[metrics.QueryScope]
    done: threading.Event = field(default_factory=threading.Event)
    result: Optional[metrics.ReadResult] = None


@dataclass
class ServiceMemory:
    """What this process remembers of one service between evaluations; kopf's per-object memo
    holds it (`handlers.Memo.service`), so it goes with the object.

    Status is written only when it says something new (evaluation.status_write_needed), so no
    status field tells when the service was last evaluated. A restarted operator starts with
    an empty memory and evaluates each service at its first tick: the policy's pacing
    (cooldown, change budget, warm-up) comes from status, so that evaluation decides what the
    old process would have decided then, and the operator's per-service metrics come back
    within one tick instead of one evaluationInterval."""

    scheduled_at: Optional[float] = None
    """When this process's last evaluation of the service was due (epoch seconds): the next is
    due one evaluationInterval after it (`next_schedule`)."""
    observations: Optional[api.Observations] = None
    """What that evaluation measured: newer than status.observations, which moves only materially."""
    rule: str = ""
    """The policy rule that decided then: a new rule makes its advice worth a status write."""
    _quiet: Optional[tuple[Optional[int], float]] = field(default=None, repr=False)
    """(generation, until): ticks before `until` return at once while the spec is that generation."""

    def quiet(self, generation: Optional[int], now: float) -> bool:
        """Whether a tick can return without parsing the object (the cheap due-check)."""
        return self._quiet is not None and self._quiet[0] == generation and now < self._quiet[1] - 1e-6

    def quiet_until(self, generation: Optional[int], until: float) -> None:
        self._quiet = (generation, until)

    def remember(self, at: float, observations: Optional[api.Observations], rule: str) -> None:
        self.scheduled_at, self.observations, self.rule = at, observations, rule


class Evaluator:
    def __init__(
        self,
        kube: Kube,
        controller: Controller,
        settings: OperatorSettings,
        clock: Clock = utcnow,
        reader_factory: ReaderFactory = PrometheusReader,
    ):
        self.kube = kube
        self.controller = controller
        self.settings = settings
        self.clock = clock
        self.reader_factory = reader_factory
        self.log = logging.getLogger("specdecode.shell.evaluator")
        # One read per Prometheus and tick, shared by every service (single-flight).
        self._reads: dict[tuple, _CachedRead] = {}
        self._reads_lock = threading.Lock()
        self._flights: dict[tuple, _Flight] = {}

    # ---------------------------------------------------------------------------- evaluation

    def evaluate_if_due(self, body: Mapping[str, Any], memory: ServiceMemory) -> Optional[Decision]:
        """Evaluate the service if its evaluationInterval has passed since this process last
        evaluated it. `body` is the object as kopf last saw it (no API read per tick); a tick
        that is not due returns before parsing it, while the spec's generation is unchanged."""
        now = self.clock()
        body = dict(body)  # one version of the object (kopf's view follows the watch)
        meta = body["metadata"]
        generation = meta.get("generation")
        if memory.quiet(generation, now.timestamp()):
            return None
        namespace, name = meta["namespace"], meta["name"]
        if meta.get("deletionTimestamp"):
            return None
        try:
            spec = api.parse_spec(body.get("spec") or {})
        except api.SpecError:
            memory.quiet_until(generation, float("inf"))  # the reconcile reports InvalidSpec; wait for an edit
            return None
        interval = api.parse_duration(spec.autotune.evaluation_interval)
        status = api.SpecDecodeServiceStatus.model_validate(body.get("status") or {})
        if spec.autotune.mode == api.AutotuneMode.OFF or _first_rollout(status):
            instrumentation.forget_evaluation(namespace, name)
            if spec.autotune.mode == api.AutotuneMode.OFF:  # nothing to do until the spec changes
                memory.quiet_until(generation, now.timestamp() + interval)
            return None
        if memory.scheduled_at is not None and now.timestamp() < memory.scheduled_at + interval - 1e-6:
            memory.quiet_until(generation, memory.scheduled_at + interval)
            return None
        scheduled = next_schedule(memory.scheduled_at, now.timestamp(), interval, self.settings.evaluation_tick)
        with self.controller.lock_for(namespace, name):
            decision = self._evaluate(body, spec, status, memory, now, scheduled)
        memory.quiet_until(generation, scheduled + interval)
        return decision

    def _evaluate(self, body: dict, spec: api.SpecDecodeServiceSpec, status: api.SpecDecodeServiceStatus,
                  memory: ServiceMemory, now: datetime, scheduled: float) -> Decision:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        stored = status
        if memory.observations is not None:
            status = status.model_copy(update={"observations": memory.observations})
        settings = PolicySettings.from_spec(spec, restart_s=evaluation.measured_restart_s(status, spec),
                                            tuning=PolicyTuning(planner=self.settings.policy == "planner"))
        access = self._access_for(spec, namespace, now.timestamp())
        if isinstance(access, metrics.MetricsUnavailable):
            read: metrics.ReadResult = access  # refused before any request
        else:
            read = self._read(access, evaluation.scopes_for(spec, settings), now.timestamp())
        observed = evaluation.observations_for(
            read, spec, namespace, name, status.speculation.config_hash if status.speculation else None, settings
        )
        window = observed.window
        # The running experiment's canary arm, from the same read: its pods carry their own config hash.
        record = running_record(status)
        canary = None
        if record is not None:
            canary = evaluation.observations_for(read, spec, namespace, name, record.candidate_hash, settings).window
        result = evaluation.evaluate(status, spec, settings, observed, meta.get("generation"), now, canary=canary)
        decision = result.decision

        self._log_metric_names(namespace, name, status, result.status)
        instrumentation.EVALUATIONS.labels(namespace, name).inc()
        rule_changed = bool(memory.rule) and memory.rule != decision.rule
        if evaluation.status_write_needed(stored, result.status, rule_changed=rule_changed):
            # A Conflict (the object changed since kopf saw it) leaves the memory as it was:
            # the retry, with the newer object, evaluates again.
            self.kube.replace_status(body, result.status.to_wire())
            instrumentation.record_status(namespace, name, result.status.phase,
                                          ((c.type, c.status, c.reason) for c in result.status.conditions))
            for ended in result.experiments_ended:
                instrumentation.record_experiment(namespace, name, ended.purpose, ended.verdict)
        memory.remember(scheduled, result.status.observations, decision.rule)
        for type_, reason, message in result.events:
            self.kube.post_event(body, type_, reason, message, now)
        self._record(namespace, name, spec, decision, window)
        if result.children_changed:
            # A new config, or a canary to create or delete: the reconcile renders it now.
            crashpoints.reach(crashpoints.DECISION_IN_STATUS)
            self.log.info("%s/%s: %s (%s)", namespace, name, decision.action.value, decision.reason)
            self.controller.reconcile(namespace, name)
        return decision

    def _log_metric_names(self, namespace: str, name: str, before: api.SpecDecodeServiceStatus,
                          after: api.SpecDecodeServiceStatus) -> None:
        """Say once how Prometheus stores the service's vLLM series (and when that changes)."""
        old = before.observations.metric_names if before.observations else None
        new = after.observations.metric_names if after.observations else None
        if new and new != old:
            self.log.info("%s/%s: Prometheus stores vLLM's series as %s... (status.observations.metricNames)",
                          namespace, name, new)

    def _record(self, namespace: str, name: str, spec: api.SpecDecodeServiceSpec,
                decision: Decision, window: Optional[metrics.Observation]) -> None:
        if decision.changes:
            instrumentation.record_decision(namespace, name, decision.action.value, spec.autotune.mode.value)
        instrumentation.METRICS_AVAILABLE.labels(namespace, name).set(1 if decision.metrics_available else 0)
        speculation = window.speculation if window is not None else None
        rate = speculation.acceptance_rate if speculation else None
        if rate is not None:
            instrumentation.ACCEPTANCE_RATE.labels(namespace, name).set(rate)
        # alpha is what the floor is defined on: the acceptance-floor alert compares the two.
        instrumentation.record_acceptance(
            namespace, name, speculation.alpha if speculation else None, spec.acceptance_floor
        )

    # ------------------------------------------------------------------------------ reading

    def _read(self, access: metrics.PrometheusAccess, scopes: tuple[metrics.QueryScope, ...], at: float) -> metrics.ReadResult:
        """One read per Prometheus and tick covering every scope seen so far (single-flight:
        callers that miss while a read is in flight wait for it instead of starting their own)."""
        key = _access_key(access)
        wanted = frozenset(scopes)
        while True:
            with self._reads_lock:
                cached = self._reads.get(key)
                if cached and at - cached.at < self.settings.evaluation_tick and wanted <= cached.scopes:
                    return cached.result
                flight = self._flights.get(key)
                if flight is None:
                    covered = wanted | (cached.scopes if cached else frozenset())
                    flight = self._flights[key] = _Flight(covered)
                    break  # this caller reads
            flight.done.wait()
            if flight.result is not None and wanted <= flight.scopes:
                return flight.result
            # The read failed or did not cover this caller's scopes: look again.
        result: Optional[metrics.ReadResult] = None
        try:
            instrumentation.PROMETHEUS_READS.inc()
            result = self.reader_factory(access).read(flight.scopes, at)
            if isinstance(result, metrics.MetricsUnavailable):
                instrumentation.ERRORS.labels("metrics").inc()
            return result
        finally:
            with self._reads_lock:
                if result is not None:
                    self._reads[key] = _CachedRead(max(at, self.clock().timestamp()), flight.scopes, result)
                    # A new tick: the model's memos of the last one hold fresh measurements
                    # nobody asks for again (control/memo.py); drop them, or they fill to
                    # their bound.
                    memo.clear()
                del self._flights[key]
            flight.result = result
            flight.done.set()
            if result is not None:
                process_memory.release_free()  # the last tick's answer and memos are gone

    def _access_for(
        self, spec: api.SpecDecodeServiceSpec, namespace: str, at: float
    ) -> metrics.PrometheusAccess | metrics.MetricsUnavailable:
        """How to reach the service's Prometheus, or why it must not be contacted.

        The operator's own credentials go only to the operator's own Prometheus (no
        prometheusUrl in spec). A spec's URL must be allowed by the platform
        (allowed_prometheus_urls) and gets only credentials from the service's own namespace.
        """
        m = spec.metrics
        if not m.prometheus_url:
            return metrics.PrometheusAccess(
                url=self.settings.prometheus_url,
                bearer_token_file=self.settings.prometheus_bearer_token_file,
                ca_bundle=self.settings.prometheus_ca_file,
            )
        if not self.settings.allows_prometheus_url(m.prometheus_url):
            return metrics.MetricsUnavailable(
                C.REASON_PROMETHEUS_URL_NOT_ALLOWED,
                f"spec.metrics.prometheusUrl {m.prometheus_url} is not allowed by this operator, so it "
                "is not contacted. Fix: remove it (the operator's own Prometheus is used), or ask the "
                "platform team to add its prefix to the operator setting "
                "SPECDECODE_ALLOWED_PROMETHEUS_URLS (--allowed-prometheus-urls).",
                at,
            )
        auth = m.auth or api.PrometheusAuth()
        try:
            token = self._secret_value(namespace, auth.bearer_token_secret, "bearerTokenSecret")
            ca_file = _pem_file(self._secret_value(namespace, auth.ca_secret, "caSecret"))
        except _CredentialsUnavailable as err:
            return metrics.MetricsUnavailable(C.REASON_PROMETHEUS_CREDENTIALS_UNAVAILABLE, str(err), at)
        return metrics.PrometheusAccess(url=m.prometheus_url, bearer_token=token, ca_bundle=ca_file, headers=dict(auth.headers))

    def _secret_value(self, namespace: str, ref: Optional[api.SecretKeyRef], field: str) -> Optional[str]:
        """A key of a Secret in the service's own namespace: a tenant names only its own
        credentials, never the operator's."""
        if ref is None:
            return None
        where = f"spec.metrics.auth.{field} (Secret {namespace}/{ref.name}, key {ref.key})"
        try:
            secret = self.kube.core.read_namespaced_secret(ref.name, namespace)
        except ApiException as err:
            if err.status == 403:
                raise _CredentialsUnavailable(
                    f"{where} cannot be read: the operator has no access to Secrets in namespace "
                    f"{namespace}. Fix: bind the ClusterRole specdecode-operator-tenant-credentials "
                    f"to the operator's service account with a RoleBinding in {namespace} "
                    "(docs/operations/security.md)."
                ) from None
            if err.status == 404:
                raise _CredentialsUnavailable(
                    f"{where} does not exist. Fix: create the Secret in {namespace} or correct the reference."
                ) from None
            raise _CredentialsUnavailable(f"{where} cannot be read (HTTP {err.status}); retrying.") from None
        data = (secret.data or {}).get(ref.key)
        if not data:
            raise _CredentialsUnavailable(f"{where} has no such key. Fix: correct spec.metrics.auth.{field}.key.")
        return base64.b64decode(data).decode()


def next_schedule(last: Optional[float], now: float, interval: float, tick: float) -> float:
    """When an evaluation running at `now` counts as due, the last one having been due at
    `last`: evaluations run at a fixed rate, one evaluationInterval apart on average.

    A kopf timer fires a tick after the last handler ended, and an evaluation may queue
    for a thread, so the tick that finds a service due comes up to a tick (and a bit) late.
    Dated from when it ran, each interval grew by that lateness: at 500 services, 753
    evaluations a minute of the 1,000 due. Dated from when it was due, a late one is followed
    by an earlier one, never by less than half an interval (rules that count evaluations,
    like the after-rollout check, see about the time they were written for). Later than two
    ticks or half an interval (the first evaluation, a paused or restarted process) starts
    the schedule again from now, so evaluations never come in a burst to catch up."""
    if last is None:
        return now
    due = last + interval
    return due if now - due <= min(2 * tick, interval / 2) else now


def _first_rollout(status: api.SpecDecodeServiceStatus) -> bool:
    """Whether the service has not yet run at all: no speculation in status, or its first
    config still rolling out and nothing ever observed. Nothing can be measured or decided
    then (the policy's answer is a hold for the rollout), and at fleet scale those
    evaluations were two status writes per new service (conflicting with the reconcile's
    Serving write) while the API server was busiest: the first evaluation waits for the pods."""
    effective = status.speculation
    return effective is None or (not effective.live and effective.live_since is None and status.observations is None)


class _CredentialsUnavailable(Exception):
    """A Secret named in spec.metrics.auth cannot be used; the message names field and fix."""


def _access_key(access: metrics.PrometheusAccess) -> tuple:
    token = hashlib.sha256((access.bearer_token or "").encode()).hexdigest()
    return (access.url, token, access.bearer_token_file, access.ca_bundle, tuple(sorted(access.headers.items())))


def _pem_file(pem: Optional[str]) -> Optional[str]:
    """requests verifies against a file: keep each distinct CA bundle in one temp file."""
    if not pem:
        return None
    digest = hashlib.sha256(pem.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"specdecode-ca-{digest}.pem")
    if not os.path.exists(path):
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(pem)
        os.replace(path + ".tmp", path)
    return path
