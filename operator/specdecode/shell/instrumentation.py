"""The operator's own Prometheus metrics: what it did, how often, and what it runs now."""

from __future__ import annotations

import threading
from typing import Iterable, Optional

from prometheus_client import Counter, Gauge

from ..constants import PHASE_DEGRADED, PHASE_PENDING, PHASE_PROGRESSING, PHASE_SERVING, PROM_LABEL_SERVICE

# Per-service series carry the SpecDecodeService as `namespace` and `specdecode_service`, the
# labels vLLM's series get from the PodMonitor, so rules join the two on (namespace,
# specdecode_service). The ServiceMonitor's honorLabels keeps this `namespace` (the target's
# own would be the operator's namespace).
SERVICE_LABELS = ["namespace", PROM_LABEL_SERVICE]

RECONCILES = Counter(
    "specdecode_reconciles_total", "Reconciles of a SpecDecodeService, by result.", ["result"]
)
ERRORS = Counter("specdecode_errors_total", "Errors by stage (reconcile, apply, status, evaluate).", ["stage"])
API_WRITES = Counter(
    "specdecode_api_writes_total", "Write requests sent to the Kubernetes API, by verb and kind.", ["verb", "kind"]
)
PROMETHEUS_READS = Counter(
    "specdecode_prometheus_reads_total",
    "Batched Prometheus reads (one plan of queries for every service), single-flight per Prometheus and tick.",
)
EVALUATIONS = Counter(
    "specdecode_evaluations_total", "Evaluations of a service by the control loop (holds included).", SERVICE_LABELS
)
DECISIONS = Counter(
    "specdecode_decisions_total",
    "Decisions that change speculation (set_k, disable, enable; fallback when pods cannot start), by service, action and mode.",
    [*SERVICE_LABELS, "action", "mode"],
)
EXPERIMENTS = Counter(
    "specdecode_experiments_total",
    "Canary experiments that ended, by service, purpose (Reprobe, Change, Control, Calibrate) and outcome (Promote, "
    "AbortWorse, AbortNoGain, AbortSLO, AbortTimeout, Cancelled, Measured); counted once the status saying so is written.",
    [*SERVICE_LABELS, "purpose", "outcome"],
)
SPECULATIVE_TOKENS = Gauge(
    "specdecode_speculative_tokens", "K in effect per service; 0 when speculation is off.", SERVICE_LABELS
)
SPECULATION_ENABLED = Gauge(
    "specdecode_speculation_enabled", "1 when speculation is on for the service.", SERVICE_LABELS
)
METRICS_AVAILABLE = Gauge(
    "specdecode_metrics_available", "1 when the service's last evaluation had fresh metrics.", SERVICE_LABELS
)
ACCEPTANCE_RATE = Gauge(
    "specdecode_acceptance_rate", "Accepted / drafted tokens of the service's last evaluation.", SERVICE_LABELS
)

ACCEPTANCE_ALPHA = Gauge(
    "specdecode_acceptance_alpha",
    "Per-token acceptance (alpha) of the service's last evaluation; absent when that window had no drafts.",
    SERVICE_LABELS,
)
ACCEPTANCE_FLOOR = Gauge(
    "specdecode_acceptance_floor", "The service's acceptance floor: spec.autotune.acceptanceFloor, or its method's default (alpha below it turns speculation off).",
    SERVICE_LABELS,
)

SERVICE_PHASE = Gauge(
    "specdecode_service_phase",
    "1 for the service's phase in status (Pending, Progressing, Serving, Degraded), 0 for the others.",
    [*SERVICE_LABELS, "phase"],
)
SERVICE_CONDITION = Gauge(
    "specdecode_service_condition",
    "1 for each condition in the service's status, by type, status (True, False, Unknown) and reason "
    "(CamelCase, from a fixed set: for example Degraded/True/InvalidSpec or Degraded/True/StartupFailure); "
    "one series per condition type.",
    [*SERVICE_LABELS, "type", "status", "reason"],
)
PHASES = (PHASE_PENDING, PHASE_PROGRESSING, PHASE_SERVING, PHASE_DEGRADED)

PER_SERVICE = (SPECULATIVE_TOKENS, SPECULATION_ENABLED, METRICS_AVAILABLE, ACCEPTANCE_RATE, ACCEPTANCE_ALPHA, ACCEPTANCE_FLOOR)


# The (namespace, service, action, mode) of every DECISIONS series, kept beside it:
# prometheus_client lists a metric's children only through private attributes, and a deleted
# service's series must be removed by their full labels.
_decision_series: set[tuple[str, str, str, str]] = set()
_decision_series_lock = threading.Lock()


def record_decision(namespace: str, service: str, action: str, mode: str) -> None:
    with _decision_series_lock:
        _decision_series.add((namespace, service, action, mode))
        DECISIONS.labels(namespace, service, action, mode).inc()


# Likewise for EXPERIMENTS: (namespace, service, purpose, outcome).
_experiment_series: set[tuple[str, str, str, str]] = set()


def record_experiment(namespace: str, service: str, purpose: str, outcome: str) -> None:
    """One experiment ended (outcome: its verdict)."""
    with _decision_series_lock:
        _experiment_series.add((namespace, service, purpose, outcome))
        EXPERIMENTS.labels(namespace, service, purpose, outcome).inc()


def record_acceptance(namespace: str, service: str, alpha: Optional[float], floor: float) -> None:
    """The floor always; alpha only when the last evaluation measured it (a stale alpha would
    keep the acceptance-floor alert firing after speculation was turned off or traffic stopped)."""
    ACCEPTANCE_FLOOR.labels(namespace, service).set(floor)
    if alpha is not None:
        ACCEPTANCE_ALPHA.labels(namespace, service).set(alpha)
    else:
        _remove(ACCEPTANCE_ALPHA, namespace, service)


# The (status, reason) each service's condition series carries now, by (namespace, service,
# type): a condition that changes reason must lose its old series, or both would read 1.
_condition_series: dict[tuple[str, str, str], tuple[str, str]] = {}


def record_status(namespace: str, service: str, phase: Optional[str],
                  conditions: Iterable[tuple[str, str, str]]) -> None:
    """The service's phase and conditions ((type, status, reason) each) as status has them:
    what alerts on an invalid spec, a start-up failure or a broken SLO read."""
    for known in PHASES:
        SERVICE_PHASE.labels(namespace, service, known).set(1 if known == phase else 0)
    with _decision_series_lock:
        for type_, status, reason in conditions:
            key = (namespace, service, type_)
            previous = _condition_series.get(key)
            if previous is not None and previous != (status, reason):
                _remove(SERVICE_CONDITION, namespace, service, type_, *previous)
            _condition_series[key] = (status, reason)
            SERVICE_CONDITION.labels(namespace, service, type_, status, reason).set(1)


def record_speculation(namespace: str, service: str, k: int | None) -> None:
    SPECULATIVE_TOKENS.labels(namespace, service).set(k or 0)
    SPECULATION_ENABLED.labels(namespace, service).set(1 if k else 0)


def forget_evaluation(namespace: str, service: str) -> None:
    """Drop what the evaluator records once it stops evaluating the service (autotune mode Off):
    kept, the last values would hold the per-service alerts firing on a past evaluation."""
    for gauge in (METRICS_AVAILABLE, ACCEPTANCE_RATE, ACCEPTANCE_ALPHA, ACCEPTANCE_FLOOR):
        _remove(gauge, namespace, service)


def forget_service(namespace: str, service: str) -> None:
    """Drop a deleted service's series so dashboards do not show it forever, and its decision
    and experiment counts so deleted services do not add up."""
    for gauge in PER_SERVICE:
        _remove(gauge, namespace, service)
    for known in PHASES:
        _remove(SERVICE_PHASE, namespace, service, known)
    _remove(EVALUATIONS, namespace, service)
    with _decision_series_lock:
        counted = {labels for labels in _decision_series if labels[:2] == (namespace, service)}
        _decision_series.difference_update(counted)
        for labels in counted:
            _remove(DECISIONS, *labels)
        for key in [key for key in _condition_series if key[:2] == (namespace, service)]:
            _remove(SERVICE_CONDITION, *key, *_condition_series.pop(key))
        ended = {labels for labels in _experiment_series if labels[:2] == (namespace, service)}
        _experiment_series.difference_update(ended)
        for labels in ended:
            _remove(EXPERIMENTS, *labels)


def _remove(metric: Gauge | Counter, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass  # never set for this service
