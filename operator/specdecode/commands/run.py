"""`specdecode run`: the operator process (kopf inside)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os

from ..cli import UserError, command


@command
def _run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run the operator",
        description="Run the operator against the cluster of $KUBECONFIG, --kubeconfig, or the "
        "pod's service account. Flags override the SPECDECODE_* environment.",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NS",
                   help="watch only this namespace (repeatable); default: the whole cluster")
    p.add_argument("--prometheus-url", help="default Prometheus API base URL")
    p.add_argument("--allowed-prometheus-urls", type=_comma_list, metavar="URL[,URL...]",
                   help="URL prefixes a service may name in spec.metrics.prometheusUrl "
                   "(default: only --prometheus-url)")
    p.add_argument("--reconcile-interval", type=float, help="seconds between level-triggered reconciles")
    p.add_argument("--evaluation-tick", type=float, help="seconds between evaluator passes")
    p.add_argument("--log-format", choices=["text", "json"], help="log format (json for production)")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--liveness-port", type=int, help="port of /healthz (0: off)")
    p.add_argument("--metrics-port", type=int, help="port of the operator's /metrics (0: off)")
    p.add_argument("--model-cache-root", help="where the operator can read the model cache (draft preflight)")
    p.add_argument("--peering-name", help="ClusterKopfPeering object name")
    p.add_argument("--standalone", action="store_true", default=None, help="run without peering")
    p.add_argument("--api-outage-tolerance", type=float, help="seconds to ride out an unreachable API server (default 900)")
    p.add_argument("--max-replicas", type=int, help="most vLLM pods one SpecDecodeService may ask for (default 32)")
    p.set_defaults(func=run_operator)


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


class TemporaryFailuresAsWarnings(logging.Filter):
    """kopf logs a handler's TemporaryError and each retried API request at ERROR; a failure
    that is retried (an API server away, a conflict) needs no human, so it is a WARNING.
    Crashes, and a request kopf gives up on ("escalating"), keep ERROR."""

    RETRIED = ("failed temporarily", "failed; will retry")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and any(marker in str(record.msg) for marker in self.RETRIED):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def run_operator(args: argparse.Namespace) -> int:
    # The kubernetes library (kopf logs in through it) reads $KUBECONFIG once, when it is
    # imported: set it before the first import of kopf or kubernetes.
    if args.kubeconfig:
        if not os.path.exists(args.kubeconfig):
            raise UserError(f"--kubeconfig {args.kubeconfig}: no such file")
        os.environ["KUBECONFIG"] = os.path.abspath(args.kubeconfig)

    import kopf
    from prometheus_client import start_http_server

    from ..shell import settings as settings_module
    from ..redaction import install_log_redaction

    overrides = {
        k: getattr(args, k)
        for k in ("namespaces", "prometheus_url", "allowed_prometheus_urls", "reconcile_interval", "evaluation_tick",
                  "log_format", "log_level", "liveness_port", "metrics_port", "peering_name", "standalone",
                  "model_cache_root", "max_replicas", "api_outage_tolerance")
    }
    try:
        settings = settings_module.load(overrides)
    except settings_module.SettingsError as err:
        raise UserError(str(err)) from None
    settings_module.current = settings

    kopf.configure(
        verbose=settings.log_level == "DEBUG",
        quiet=settings.log_level in ("WARNING", "ERROR"),
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL,
    )
    # Retried failures are warnings: on kopf's object logger (before kopf posts the line as an
    # Event) and on every handler of the root logger (kopf's API retries log elsewhere).
    downgrade = TemporaryFailuresAsWarnings()
    logging.getLogger("kopf.objects").addFilter(downgrade)
    for handler in logging.getLogger().handlers:
        handler.addFilter(downgrade)
    if settings.log_level != "DEBUG":
        # kopf logs every timer run per object at INFO: with two timers per service that
        # drowns what matters. Failures still come through at WARNING and ERROR.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # The metrics reader reports an unreachable Prometheus once per evaluation, in status and
    # in its own log line; urllib3's per-query retry warnings would repeat it twenty times.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    # Log lines quote pod logs, exception texts and HTTP answers: redact them on every
    # handler (the console's and kopf's event poster) before they are written or posted.
    install_log_redaction()
    if settings.metrics_port:
        start_http_server(settings.metrics_port)
    importlib.import_module("specdecode.shell.handlers")  # registers the handlers with kopf
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=settings.standalone,
        peering_name=settings.peering_name,
        liveness_endpoint=f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None,
    )
    return 0
