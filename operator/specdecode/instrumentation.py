"""The operator's own Prometheus metrics: what it did, how often, and what it runs now."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RECONCILES = Counter(
    "specdecode_reconciles_total", "Reconciles of a SpecDecodeService, by result.", ["result"]
)
ERRORS = Counter("specdecode_errors_total", "Errors by stage (reconcile, apply, status, evaluate).", ["stage"])
API_WRITES = Counter(
    "specdecode_api_writes_total", "Write requests sent to the Kubernetes API, by verb and kind.", ["verb", "kind"]
)
DECISIONS = Counter(
    "specdecode_decisions_total", "Control-loop decisions, by action and mode.", ["action", "mode"]
)
SPECULATIVE_TOKENS = Gauge(
    "specdecode_speculative_tokens", "K in effect per service; 0 when speculation is off.", ["namespace", "service"]
)
SPECULATION_ENABLED = Gauge(
    "specdecode_speculation_enabled", "1 when speculation is on for the service.", ["namespace", "service"]
)
METRICS_AVAILABLE = Gauge(
    "specdecode_metrics_available", "1 when the service's last evaluation had fresh metrics.", ["namespace", "service"]
)
ACCEPTANCE_RATE = Gauge(
    "specdecode_acceptance_rate", "Accepted / drafted tokens of the service's last evaluation.", ["namespace", "service"]
)


def record_speculation(namespace: str, service: str, k: int | None) -> None:
    SPECULATIVE_TOKENS.labels(namespace, service).set(k or 0)
    SPECULATION_ENABLED.labels(namespace, service).set(1 if k else 0)


def forget_service(namespace: str, service: str) -> None:
    """Drop a deleted service's series so dashboards do not show it forever."""
    for gauge in (SPECULATIVE_TOKENS, SPECULATION_ENABLED, METRICS_AVAILABLE, ACCEPTANCE_RATE):
        try:
            gauge.remove(namespace, service)
        except KeyError:
            pass
