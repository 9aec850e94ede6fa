"""The Prometheus reader: runs the control core's fixed query plan (`control/metrics`) over
HTTP (prometheus-api-client) and turns the answers into observations with the core's pure
functions. The only module of the operator that talks to Prometheus."""

from __future__ import annotations

import concurrent.futures
import re
from typing import Any, Callable, Iterable

from specdecode import constants
from specdecode.control.metrics import (
    MetricsSnapshot, MetricsUnavailable, PlannedQuery, PrometheusAccess, PrometheusQueryError, QueryScope,
    ReadResult, VectorSample, build_observations, build_query_plan, parse_vector,
)


def _default_connect(access: PrometheusAccess) -> Any:
    """A PrometheusConnect with our auth, TLS, timeout and a short retry budget."""
    import requests
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    session = requests.Session()
    if access.insecure_skip_verify:
        session.verify = False
    elif access.ca_bundle:
        session.verify = access.ca_bundle
    retry = Retry(total=1, backoff_factor=0.2, status_forcelist=[502, 503, 504])
    return PrometheusConnect(
        url=access.url.rstrip("/"),
        headers=access.request_headers(),
        disable_ssl=access.insecure_skip_verify,
        retry=retry,
        session=session,
        timeout=access.timeout_s,
    )


_HTTP_STATUS = re.compile(r"HTTP Status Code (\d{3})")


def describe_failure(err: BaseException, url: str) -> str:
    """One line saying why Prometheus did not answer: a classified cause and the HTTP status.

    Never the answer's body nor the exception's text: the URL may be a tenant's, and whatever
    it answered would be reflected into status and Events, which the tenant can read (a
    server-side request forgery relay). No tokens or headers either."""
    import requests
    from prometheus_api_client.exceptions import PrometheusApiClientException

    if isinstance(err, requests.exceptions.Timeout):
        return f"Prometheus at {url} timed out"
    if isinstance(err, requests.exceptions.SSLError):
        return f"TLS to Prometheus at {url} failed: {type(err).__name__}"
    if isinstance(err, requests.exceptions.ConnectionError):
        return f"Prometheus at {url} is unreachable (connection failed)"
    if isinstance(err, PrometheusApiClientException):
        found = _HTTP_STATUS.search(str(err))
        if found is None:
            return f"Prometheus at {url} answered with an error"
        code = int(found.group(1))
        if code in (401, 403):
            cause = "refused the credentials (check spec.metrics.auth)"
        elif code == 404:
            cause = "has no Prometheus query API at this URL (check spec.metrics.prometheusUrl)"
        elif code in (400, 422):
            cause = "rejected a query"
        elif code == 429:
            cause = "is rate limiting the operator"
        elif code >= 500:
            cause = "failed on its side"
        else:
            cause = "answered with an error"
        return f"Prometheus at {url} {cause} (HTTP {code})"
    if isinstance(err, PrometheusQueryError):
        return f"Prometheus at {url} sent an answer that is not a Prometheus vector"
    return f"Prometheus at {url} failed: {type(err).__name__}"


class PrometheusReader:
    """Runs the query plan against Prometheus; never raises into the caller.

    ``connect`` builds the client (a `PrometheusConnect` by default; tests pass fakes).
    Queries of one read run concurrently on a small thread pool and are all evaluated at
    the same instant ``at``.
    """

    def __init__(
        self,
        access: PrometheusAccess,
        *,
        connect: Callable[[PrometheusAccess], Any] = _default_connect,
        max_workers: int = 4,
    ) -> None:
        self._access = access
        self._connect = connect
        self._max_workers = max_workers

    @property
    def access(self) -> PrometheusAccess:
        return self._access

    def read(self, scopes: Iterable[QueryScope], at: float) -> ReadResult:
        """Evaluate every scope's plan at ``at`` (seconds since the epoch)."""
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        unique = sorted(set(scopes), key=lambda s: (s.window_s, s.matchers, s.load_only))
        planned = [query for scope in unique for query in build_query_plan(scope)]
        at = round(at, 3)
        try:
            client = self._connect(self._access)
        except (OSError, ValueError) as err:
            return MetricsUnavailable(
                constants.REASON_METRICS_MISSING,
                f"cannot set up the Prometheus client for {self._access.url}: {err}",
                at,
            )

        def run(query: PlannedQuery) -> list[VectorSample]:
            return parse_vector(client.custom_query(query.text, params={"time": f"{at:.3f}"}))

        results: dict[QueryScope, dict[str, list[VectorSample]]] = {s: {} for s in unique}
        try:
            with concurrent.futures.ThreadPoolExecutor(self._max_workers) as pool:
                futures = {pool.submit(run, query): query for query in planned}
                for future in concurrent.futures.as_completed(futures):
                    query = futures[future]
                    results[query.scope][query.spec.name] = future.result()
        except (
            requests.exceptions.RequestException,
            PrometheusApiClientException,
            PrometheusQueryError,
            ValueError,
            KeyError,
            OSError,
        ) as err:
            return MetricsUnavailable(
                constants.REASON_METRICS_MISSING, describe_failure(err, self._access.url), at
            )
        finally:
            close = getattr(client, "close", None)
            if callable(close):
                close()

        observations = {
            scope: build_observations(results[scope], window_s=scope.window_s, evaluated_at=at)
            for scope in unique
        }
        return MetricsSnapshot(evaluated_at=at, observations=observations, queries=len(planned))
