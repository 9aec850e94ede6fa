"""What a tenant's spec.metrics can reach: allowed Prometheus URLs, credentials from its own
namespace only, the operator's own credentials for the operator's own Prometheus only."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest
from kubernetes.client.exceptions import ApiException

from specdecode import api, constants as C
from specdecode.control import metrics
from specdecode.shell import settings as settings_module
from specdecode.shell.evaluator import Evaluator
from specdecode.shell.settings import OperatorSettings

OWN = "http://prometheus-operated.monitoring.svc:9090"


def _settings(*allowed: str, **extra) -> OperatorSettings:
    return OperatorSettings(prometheus_url=OWN, allowed_prometheus_urls=list(allowed), **extra)


@pytest.mark.parametrize(
    "url, allowed",
    [
        (OWN, True),
        (OWN + "/", True),
        ("HTTP://Prometheus-Operated.monitoring.svc:9090", True),
        ("http://prometheus-operated.monitoring.svc:9091", False),
        ("https://prometheus-operated.monitoring.svc:9090", False),
        ("http://prometheus-operated.monitoring.svc.evil.com:9090", False),
        ("http://prometheus-operated.monitoring.svc:9090@evil.com", False),
        ("http://user:pass@prometheus-operated.monitoring.svc:9090", False),
        ("http://127.0.0.1:8080", False),
        ("http://thanos.monitoring.svc:10902", True),
        ("http://thanos.monitoring.svc:10902/", True),
        ("http://mimir.x/prometheus", True),
        ("http://mimir.x/prometheus/", True),
        ("http://mimir.x/prometheus-admin", False),
        ("http://mimir.x/prometheus/../admin", False),
        ("http://mimir.x/prometheus/%2e%2e/admin", False),
        ("http://mimir.x/prometheus?x=1", False),
        ("http://mimir.x", False),
        ("http://mimir.x.evil.com/prometheus", False),
        ("ftp://thanos.monitoring.svc:10902", False),
        ("http://[::1", False),
    ],
)
def test_allowed_prometheus_urls_match_parsed_prefixes(url, allowed):
    got = _settings("http://thanos.monitoring.svc:10902", "http://mimir.x/prometheus/")
    assert got.allows_prometheus_url(url) is allowed


@pytest.mark.parametrize(
    "url, allowed",
    [
        ("http://127.0.0.1:9090", True),
        ("http://127.0.0.1:1/api", True),
        ("http://127.0.0.1", True),
        ("https://127.0.0.1:9090", False),
        ("http://127.0.0.2:9090", False),
        ("http://127.0.0.1.evil.com:9090", False),
    ],
)
def test_a_prefix_may_allow_every_port_of_one_host(url, allowed):
    assert _settings("http://127.0.0.1:*").allows_prometheus_url(url) is allowed


def test_by_default_only_the_operators_own_prometheus():
    assert _settings().allows_prometheus_url(OWN + "/")
    assert not _settings().allows_prometheus_url("http://thanos.monitoring.svc:10902")


def test_allowlist_from_the_environment_and_bad_entries_name_the_variable(monkeypatch):
    env = {"SPECDECODE_ALLOWED_PROMETHEUS_URLS": "http://a:1, https://b/prom"}
    assert OperatorSettings.from_environment(environ=env).allowed_prometheus_urls == ["http://a:1", "https://b/prom"]
    monkeypatch.setenv("SPECDECODE_ALLOWED_PROMETHEUS_URLS", "http://u:p@a:1")
    with pytest.raises(settings_module.SettingsError, match="SPECDECODE_ALLOWED_PROMETHEUS_URLS / --allowed-prometheus-urls"):
        settings_module.load()


class _Core:
    """The one API call `_access_for` makes: reads of Secrets, recorded by namespace."""

    def __init__(self, secrets: dict[tuple[str, str], dict[str, str]], forbidden: set[str] = frozenset()):
        self.secrets = secrets
        self.forbidden = forbidden
        self.reads: list[tuple[str, str]] = []

    def read_namespaced_secret(self, name, namespace):
        self.reads.append((namespace, name))
        if namespace in self.forbidden:
            raise ApiException(status=403, reason="Forbidden")
        if (namespace, name) not in self.secrets:
            raise ApiException(status=404, reason="Not Found")
        data = {k: base64.b64encode(v.encode()).decode() for k, v in self.secrets[(namespace, name)].items()}
        return SimpleNamespace(data=data)


def _evaluator(core: _Core, settings: OperatorSettings) -> Evaluator:
    return Evaluator(SimpleNamespace(core=core), controller=None, settings=settings)


def _spec(metrics_spec: dict) -> api.SpecDecodeServiceSpec:
    return api.parse_spec({"model": {"name": "m"}, "speculation": {"method": "ngram"}, "metrics": metrics_spec})


AUTH = {"bearerTokenSecret": {"name": "prom-creds", "key": "token"}, "headers": {"X-Scope-OrgID": "team-b"}}
SECRETS = {
    ("specdecode-system", "prom-creds"): {"token": "ADMIN-TOKEN"},
    ("team-a", "prom-creds"): {"token": "TEAM-A-TOKEN"},
}


def test_a_tenant_secret_is_read_from_the_services_namespace_only(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("OPERATOR-TOKEN")
    core = _Core(SECRETS)
    ev = _evaluator(core, _settings("http://thanos.x:9090", prometheus_bearer_token_file=str(token_file)))
    access = ev._access_for(_spec({"prometheusUrl": "http://thanos.x:9090", "auth": AUTH}), "team-a", 0.0)
    assert isinstance(access, metrics.PrometheusAccess)
    assert core.reads == [("team-a", "prom-creds")]
    assert access.request_headers()["Authorization"] == "Bearer TEAM-A-TOKEN"
    assert access.bearer_token_file is None  # the operator's own token never goes to a spec's URL


def test_the_operators_credentials_go_to_its_own_prometheus_only(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("OPERATOR-TOKEN")
    settings = _settings(prometheus_bearer_token_file=str(token_file))
    ev = _evaluator(_Core(SECRETS), settings)
    own = ev._access_for(_spec({}), "team-a", 0.0)
    assert own.url == OWN and own.request_headers()["Authorization"] == "Bearer OPERATOR-TOKEN"
    # Naming the operator's own URL in spec does not borrow the operator's token either.
    named = ev._access_for(_spec({"prometheusUrl": OWN, "auth": {"headers": {"X-Scope-OrgID": "team-b"}}}), "team-a", 0.0)
    assert "Authorization" not in named.request_headers()


def test_a_url_outside_the_allowlist_is_refused_before_any_request():
    core = _Core(SECRETS)
    ev = _evaluator(core, _settings())
    refused = ev._access_for(_spec({"prometheusUrl": "http://127.0.0.1:9999", "auth": AUTH}), "team-a", 5.0)
    assert isinstance(refused, metrics.MetricsUnavailable)
    assert refused.reason == C.REASON_PROMETHEUS_URL_NOT_ALLOWED
    assert "spec.metrics.prometheusUrl" in refused.message and "SPECDECODE_ALLOWED_PROMETHEUS_URLS" in refused.message
    assert core.reads == []  # not even its Secret is read


@pytest.mark.parametrize(
    "forbidden, secrets, words",
    [
        ({"team-a"}, SECRETS, ["spec.metrics.auth.bearerTokenSecret", "specdecode-operator-tenant-credentials", "team-a"]),
        (set(), {}, ["spec.metrics.auth.bearerTokenSecret", "does not exist"]),
        (set(), {("team-a", "prom-creds"): {"other": "x"}}, ["spec.metrics.auth.bearerTokenSecret.key"]),
    ],
)
def test_credentials_that_cannot_be_read_say_which_field_and_the_fix(forbidden, secrets, words):
    ev = _evaluator(_Core(secrets, forbidden), _settings("http://thanos.x:9090"))
    got = ev._access_for(_spec({"prometheusUrl": "http://thanos.x:9090", "auth": AUTH}), "team-a", 5.0)
    assert isinstance(got, metrics.MetricsUnavailable)
    assert got.reason == C.REASON_PROMETHEUS_CREDENTIALS_UNAVAILABLE
    for word in words:
        assert word in got.message
    assert "TEAM-A-TOKEN" not in got.message
