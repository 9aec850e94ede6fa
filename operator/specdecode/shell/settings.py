"""The operator's own configuration: one typed object, from flags and SPECDECODE_* variables.

Loaded once by `specdecode run`, which registers the handlers with it (kopf reads the timer
intervals at registration) and hands it to them in kopf's memo (`handlers.Memo`).
"""

from __future__ import annotations

import os
from typing import Literal, Optional

from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, Field, ValidationError, field_validator

ENV_PREFIX = "SPECDECODE_"


class OperatorSettings(BaseModel):
    """Settings of one operator process. Every field can be set as SPECDECODE_<FIELD>."""

    prometheus_url: str = Field(
        "http://prometheus-operated.monitoring.svc:9090",
        description="Prometheus API base URL used for services that do not set spec.metrics.prometheusUrl.",
    )
    prometheus_bearer_token_file: Optional[str] = Field(
        None, description="File holding a bearer token for the default Prometheus."
    )
    prometheus_ca_file: Optional[str] = Field(None, description="CA bundle (PEM) for the default Prometheus.")
    allowed_prometheus_urls: list[str] = Field(
        default_factory=list,
        description="URL prefixes a SpecDecodeService may name in spec.metrics.prometheusUrl "
        "(comma-separated in the environment; `http://host:*` allows every port of host). "
        "Empty: only prometheus_url itself. A spec URL "
        "outside them is never contacted (MetricsAvailable=False, PrometheusURLNotAllowed).",
    )
    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to watch (comma-separated in the environment); empty watches the whole cluster.",
    )
    reconcile_interval: float = Field(
        60.0, gt=0, description="Seconds between level-triggered reconciles of each service (drift repair)."
    )
    evaluation_tick: float = Field(
        5.0, gt=0, description="Seconds between passes of the evaluator, which evaluates the services that are due."
    )
    log_format: Literal["text", "json"] = Field("text", description="Log lines as text or as JSON objects.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Least severity logged.")
    policy: Literal["rules", "planner"] = Field(
        "rules",
        description="How autotune tunes K and re-probes: the rules (default) or the receding-horizon planner "
        "(a plan over a forecast of each service's own load, restarts and queues included; status.plan shows "
        "it). The planner is opt-in until it beats the rules on held-back benchmark seeds (docs/planner.md).",
    )
    liveness_port: int = Field(8080, ge=0, le=65535, description="Port of /healthz (0 turns it off).")
    metrics_port: int = Field(8081, ge=0, le=65535, description="Port of the operator's own /metrics (0 turns it off).")
    model_cache_root: Optional[str] = Field(
        None,
        description="Where the operator can read the model-cache volume (for example a read-only "
        "mount of the same PVC): the draft preflight compares target and draft configs found "
        "there. Unset: DraftCompatible stays Unknown.",
    )
    peering_name: str = Field(
        "specdecode-operator",
        description="ClusterKopfPeering object that keeps one replica active at a time.",
    )
    standalone: bool = Field(False, description="Run without peering (a single replica, or tests).")
    api_outage_tolerance: float = Field(
        900.0,
        ge=60,
        description="Seconds the operator rides out an unreachable API server (kopf retries each "
        "of its requests with growing pauses, up to 10 s apart) before it gives up and exits.",
    )
    max_replicas: int = Field(
        32,
        ge=0,
        le=256,
        description="Most vLLM pods one SpecDecodeService may ask for (each holds GPUs). Above it the "
        "service is Degraded, reason InvalidSpec, and its children stay as they are. The CRD's own "
        "ceiling is 256.",
    )

    @field_validator("allowed_prometheus_urls")
    @classmethod
    def _prefixes_are_urls(cls, prefixes: list[str]) -> list[str]:
        for prefix in prefixes:
            if _url_parts(prefix, prefix=True) is None:
                raise ValueError(
                    f"{prefix!r} is not an http(s) URL prefix with a host and no credentials, query "
                    "or '..' (for example http://thanos-query.monitoring.svc:9090)"
                )
        return prefixes

    def allows_prometheus_url(self, url: str) -> bool:
        """Whether a spec may name ``url``: the operator's own Prometheus, or under one of
        allowed_prometheus_urls. Compared parsed (scheme, host, port, then whole path
        segments), so ``http://prom.x`` allows ``http://prom.x/api`` but not
        ``http://prom.x.evil.com`` nor ``http://prom.x@evil.com``."""
        wanted = _url_parts(url)
        if wanted is None:
            return False
        for prefix in (self.prometheus_url, *self.allowed_prometheus_urls):
            allowed = _url_parts(prefix, prefix=True)
            if allowed is None or allowed[:2] != wanted[:2] or allowed[2] not in (ANY_PORT, wanted[2]):
                continue
            path = allowed[3]
            if path == "" or wanted[3] == path or wanted[3].startswith(path + "/"):
                return True
        return False

    @classmethod
    def from_environment(cls, overrides: dict | None = None, environ: dict | None = None) -> "OperatorSettings":
        """Settings from SPECDECODE_* variables, then explicit overrides (command-line flags)."""
        environ = os.environ if environ is None else environ
        values: dict = {}
        for name, field in cls.model_fields.items():
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is None:
                continue
            if name in ("namespaces", "allowed_prometheus_urls"):
                values[name] = [n.strip() for n in raw.split(",") if n.strip()]
            elif field.annotation is bool:
                values[name] = raw.strip().lower() in ("1", "true", "yes", "on")
            else:
                values[name] = raw
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.model_validate(values)


_DEFAULT_PORTS = {"http": 80, "https": 443}
ANY_PORT = -1  # an allowlist entry `http://host:*`: every port of that host


def _url_parts(url: str, *, prefix: bool = False) -> Optional[tuple[str, str, int, str]]:
    """(scheme, host, port, path without trailing slash) of an http(s) URL, or None when the
    URL carries what a prefix comparison cannot vouch for: credentials, a query, a fragment,
    dot segments, or no host. A `prefix` may give its port as `*` (any port)."""
    url = url.strip()
    any_port = False
    if prefix:
        head, sep, tail = url.partition("://")
        netloc, slash, rest = tail.partition("/")
        if sep and netloc.endswith(":*"):
            any_port = True
            url = f"{head}://{netloc[:-2]}{slash}{rest}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None:
        return None
    if parts.query or parts.fragment or "@" in parts.netloc:
        return None
    path = unquote(parts.path)
    if any(segment in (".", "..") for segment in path.split("/")) or "\\" in path:
        return None
    port = ANY_PORT if any_port else port or _DEFAULT_PORTS[scheme]
    return scheme, parts.hostname.lower().rstrip("."), port, path.rstrip("/")


def api_retry_backoffs(tolerance_s: float) -> tuple[float, ...]:
    """Pauses between retries of one API request: quick at first, then every 10 s (so the
    watches resume soon after the API server returns), adding up to at least `tolerance_s`
    (kopf's default, about 54 s in all, made the operator exit when the API server was away
    for longer than about 80 s)."""
    pauses = [1.0, 2.0, 4.0, 8.0]
    while sum(pauses) < tolerance_s:
        pauses.append(10.0)
    return tuple(pauses)


def retry_delay(retry: int) -> float:
    """Delay before retry number `retry` (0 first) of a failed reconcile: 1, 2, 4 ... 60 s."""
    return float(min(60, 2 ** min(retry, 6)))


class SettingsError(ValueError):
    """Invalid operator configuration: names the variable or flag."""


def load(overrides: dict | None = None) -> OperatorSettings:
    try:
        return OperatorSettings.from_environment(overrides)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        field = str(first["loc"][0]) if first["loc"] else "settings"
        raise SettingsError(
            f"{ENV_PREFIX}{field.upper()} / --{field.replace('_', '-')}: {first['msg']}"
        ) from None
