"""The operator's own configuration: one typed object, from flags and SPECDECODE_* variables.

Loaded once by `specdecode run` before the handlers module is imported, because kopf reads
timer intervals when its decorators run.
"""

from __future__ import annotations

import os
from typing import Literal, Optional

from pydantic import BaseModel, Field, ValidationError

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

    @classmethod
    def from_environment(cls, overrides: dict | None = None, environ: dict | None = None) -> "OperatorSettings":
        """Settings from SPECDECODE_* variables, then explicit overrides (command-line flags)."""
        environ = os.environ if environ is None else environ
        values: dict = {}
        for name, field in cls.model_fields.items():
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is None:
                continue
            if name == "namespaces":
                values[name] = [n.strip() for n in raw.split(",") if n.strip()]
            elif field.annotation is bool:
                values[name] = raw.strip().lower() in ("1", "true", "yes", "on")
            else:
                values[name] = raw
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.model_validate(values)


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


# The settings of this process, set by `specdecode run` before the handlers are imported.
current: OperatorSettings = OperatorSettings()
