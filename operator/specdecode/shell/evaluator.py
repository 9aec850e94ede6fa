"""The control loop's shell: read Prometheus once per tick for every service, let the
policy decide for the services that are due, record the decision, re-render on a change.

A per-object kopf timer calls `evaluate_if_due` every `evaluationTick`; all services share
one batched read per (Prometheus, window, selector) and tick, so the number of queries does
not grow with the number of services. Running from kopf timers (not a free-running task)
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
from typing import Callable, Optional

from kubernetes.client.exceptions import ApiException

from .. import api
from .. import constants as C
from . import crashpoints, instrumentation
from .. import evaluation, policy
from ..control import metrics
from .. import status as st
from .controller import Clock, Controller, utcnow
from .kube import Kube
from .settings import OperatorSettings
from .. import timestamps

ReaderFactory = Callable[[metrics.PrometheusAccess], metrics.PrometheusReader]


@dataclass
class _CachedRead:
    at: float
    scopes: frozenset[metrics.QueryScope]
    result: metrics.ReadResult


@dataclass
class _Flight:
    """A read in progress: callers that need what it covers wait for it instead of reading."""

    scopes: frozenset[metrics.QueryScope]
    done: threading.Event = field(default_factory=threading.Event)
    result: Optional[metrics.ReadResult] = None


class Evaluator:
    def __init__(
        self,
        kube: Kube,
        controller: Controller,
        settings: OperatorSettings,
        clock: Clock = utcnow,
        reader_factory: ReaderFactory = metrics.PrometheusReader,
    ):
        self.kube = kube
        self.controller = controller
        self.settings = settings
        self.clock = clock
        self.reader_factory = reader_factory
        self.log = logging.getLogger("specdecode.shell.evaluator")
        self._reads: dict[tuple, _CachedRead] = {}
        self._reads_lock = threading.Lock()
        self._flights: dict[tuple, _Flight] = {}
        self._last_evaluated: dict[tuple[str, str], float] = {}
        # What the last evaluation measured and which rule decided, kept in memory: status is
        # written only when it says something new (evaluation.status_write_needed), so the
        # stored observations may be older than the last evaluation's.
        self._memory: dict[tuple[str, str], tuple[Optional[api.Observations], str]] = {}
        # When each service is due next, and the generation whose interval says so.
        self._next_due: dict[tuple[str, str], tuple[float, Optional[int]]] = {}

    # ---------------------------------------------------------------------------- evaluation

    def evaluate_if_due(self, namespace: str, name: str, generation: Optional[int] = None) -> Optional[policy.Decision]:
        """Evaluate the service if its evaluationInterval has passed. `generation` (the
        watched object's) lets a tick that is not due return without reading the service
        from the API: the interval of the last evaluation holds while the spec is unchanged."""
        now = self.clock()
        due_at = self._next_due.get((namespace, name))
        if generation is not None and due_at is not None and due_at[1] == generation \
                and now.timestamp() < due_at[0] - 1e-6:
            return None
        with self.controller.lock_for(namespace, name):
            body = self.kube.get(C.API_VERSION, C.KIND, name, namespace)
            if body is None or body["metadata"].get("deletionTimestamp"):
                self._last_evaluated.pop((namespace, name), None)
                self._memory.pop((namespace, name), None)
                self._next_due.pop((namespace, name), None)
                return None
            try:
                spec = api.parse_spec(body.get("spec") or {})
            except api.SpecError:
                return None  # the reconcile reports InvalidSpec; nothing to evaluate
            status = api.SpecDecodeServiceStatus.model_validate(body.get("status") or {})
            if spec.autotune.mode == api.AutotuneMode.OFF or status.speculation is None:
                instrumentation.forget_evaluation(namespace, name)
                if spec.autotune.mode == api.AutotuneMode.OFF:  # nothing to do until the spec changes
                    interval = api.parse_duration(spec.autotune.evaluation_interval)
                    self._next_due[(namespace, name)] = (now.timestamp() + interval, body["metadata"].get("generation"))
                return None
            if not self._due(namespace, name, spec, status, now):
                return None
            return self._evaluate(body, spec, status, now)

    def _due(self, namespace: str, name: str, spec: api.SpecDecodeServiceSpec,
             status: api.SpecDecodeServiceStatus, now: datetime) -> bool:
        interval = api.parse_duration(spec.autotune.evaluation_interval)
        last = self._last_evaluated.get((namespace, name))
        if last is None:
            # After a restart: the last evaluation that status recorded (status is written
            # only when it changes, so this may be older: one early evaluation, no harm).
            times = [t for t in (status.recommendation.at if status.recommendation else None,
                                 status.observations.observed_at if status.observations else None) if t]
            last = max(timestamps.epoch_seconds(t) for t in times) if times else None
        return last is None or now.timestamp() - last >= interval - 1e-6

    def _evaluate(self, body: dict, spec: api.SpecDecodeServiceSpec,
                  status: api.SpecDecodeServiceStatus, now: datetime) -> policy.Decision:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        stored = status
        remembered_obs, last_rule = self._memory.get((namespace, name), (status.observations, ""))
        if remembered_obs is not None:
            status = status.model_copy(update={"observations": remembered_obs})
        settings = policy.PolicySettings.from_spec(spec, restart_s=evaluation.measured_restart_s(status, spec))
        access = self._access_for(spec, namespace, now.timestamp())
        if isinstance(access, metrics.MetricsUnavailable):
            read: metrics.ReadResult = access  # refused before any request
        else:
            read = self._read(access, evaluation.scopes_for(spec, settings), now.timestamp())
        observed, window = evaluation.observations_for(
            read, spec, namespace, name, status.speculation.config_hash if status.speculation else None, settings
        )
        state = evaluation.policy_state(status, spec, now, meta.get("generation"))
        history = policy.history_from_status([r.to_wire() for r in status.history])
        decision = policy.decide(settings, state, observed, history, now.timestamp())
        result = evaluation.apply_decision(status, spec, decision, state, window, meta.get("generation"), now)
        self._last_evaluated[(namespace, name)] = now.timestamp()
        self._memory[(namespace, name)] = (result.status.observations, decision.rule)
        interval = api.parse_duration(spec.autotune.evaluation_interval)
        self._next_due[(namespace, name)] = (now.timestamp() + interval, meta.get("generation"))

        self._log_metric_names(namespace, name, status, result.status)
        instrumentation.EVALUATIONS.labels(namespace, name).inc()
        if evaluation.status_write_needed(stored, result.status, rule_changed=bool(last_rule) and last_rule != decision.rule):
            self.kube.replace_status(body, result.status.to_wire())
        for type_, reason, message in result.events:
            self.kube.post_event(body, type_, reason, message, now)
        self._record(namespace, name, spec, decision, window)
        if result.rerender:
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
                decision: policy.Decision, window: Optional[metrics.Observation]) -> None:
        if decision.changes:
            instrumentation.record_decision(namespace, name, decision.action.value, spec.autotune.mode.value)
        instrumentation.METRICS_AVAILABLE.labels(namespace, name).set(1 if decision.metrics_available else 0)
        speculation = window.speculation if window is not None else None
        rate = speculation.acceptance_rate if speculation else None
        if rate is not None:
            instrumentation.ACCEPTANCE_RATE.labels(namespace, name).set(rate)
        # alpha is what the floor is defined on: the acceptance-floor alert compares the two.
        instrumentation.record_acceptance(
            namespace, name, speculation.alpha if speculation else None, spec.autotune.acceptance_floor
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
                    self._reads[key] = _CachedRead(at, flight.scopes, result)
                del self._flights[key]
            flight.result = result
            flight.done.set()

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
                    "(README: Security)."
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
