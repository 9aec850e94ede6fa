"""The metrics reader: query plan, observation core, emulated evaluation, and the shell."""

from __future__ import annotations

import json
import math
import socket

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_api_client.exceptions import PrometheusApiClientException

from specdecode import constants
from specdecode import metricnames as N
from specdecode.control import metrics, promql
from specdecode.shell import prometheus
from specdecode.shell.prometheus import PrometheusReader
from specdecode.control.metrics import (
    ConfigKey,
    MetricsSnapshot,
    MetricsUnavailable,
    PrometheusAccess,
    QueryScope,
    RawSeries,
    SpeculationCounts,
    VectorSample,
    build_observations,
    build_query_plan,
)

SVC = constants.PROM_LABEL_SERVICE
HASH = constants.PROM_LABEL_CONFIG_HASH
KEY = ConfigKey("ns", "llama", "abc123")
E2E_BOUNDS = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960]
TPOT_BOUNDS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5]


def labels(key: ConfigKey = KEY, **extra: str) -> dict[str, str]:
    return {"namespace": key.namespace, SVC: key.service, HASH: key.config_hash, **extra}


def vec(value: float, key: ConfigKey = KEY, **extra: str) -> list[VectorSample]:
    return [VectorSample(labels(key, **extra), value)]


def bucket_samples(bounds, counts, key: ConfigKey = KEY) -> list[VectorSample]:
    """Cumulative bucket samples from per-bucket counts (last count is the +Inf excess)."""
    out, total = [], 0.0
    for bound, count in zip(list(bounds) + [math.inf], counts):
        total += count
        le = "+Inf" if math.isinf(bound) else repr(float(bound))
        out.append(VectorSample(labels(key, le=le), total))
    return out


def full_results(alpha: float = 0.8, k: int = 3, drafts: float = 1000.0) -> dict:
    per_pos = [drafts * alpha ** (i + 1) for i in range(k)]
    e2e_counts = [0] * (len(E2E_BOUNDS) + 1)
    e2e_counts[3] = 80  # (0.8, 1]
    e2e_counts[4] = 20  # (1, 1.5]
    tpot_counts = [0] * (len(TPOT_BOUNDS) + 1)
    tpot_counts[0] = 100
    return {
        "drafts": vec(drafts),
        "draft_tokens": vec(drafts * k),
        "accepted_tokens": vec(sum(per_pos)),
        "accepted_per_position": [
            VectorSample(labels(position=str(i)), v) for i, v in enumerate(per_pos)
        ],
        "e2e_buckets": bucket_samples(E2E_BOUNDS, e2e_counts),
        "e2e_sum": vec(100.0),
        "e2e_count": vec(100.0),
        "tpot_buckets": bucket_samples(TPOT_BOUNDS, tpot_counts),
        "tpot_sum": vec(0.6),
        "tpot_count": vec(100.0),
        "itl_sum": vec(30.0),
        "itl_count": vec(2000.0),
        "generation_tokens": vec(20000.0),
        "prompt_tokens": vec(50000.0),
        "preemptions": vec(3.0),
        "running_sum": vec(720.0),  # 120 samples of the two pods, 6 running in each
        "running_samples": vec(120.0),
        "waiting": vec(0.5),
        "kv_cache_usage": vec(0.4),
        "newest_sample": vec(995.0),
        "pods": vec(2.0, __name__=N.RUNNING),
    }


class TestQueryPlan:
    def test_plan_size_is_fixed_whatever_the_number_of_services(self):
        plan = build_query_plan(QueryScope.of(300))
        assert len(plan) == len(metrics.QUERY_SPECS)
        assert len({q.spec.name for q in plan}) == len(plan)

    def test_a_load_only_scope_reads_finished_requests_alone(self):
        """The trend window costs one counter query per scope, not the whole plan; it is a
        scope of its own even when a long window has the same length."""
        scope = QueryScope.of(1800, {"cluster": "eu-1"}, load_only=True)
        (query,) = build_query_plan(scope)
        assert query.text == (
            f"sum by (namespace, {SVC}, {HASH}) "
            f'(increase(vllm:e2e_request_latency_seconds_count{{{SVC}!="", cluster="eu-1"}}[1800s])'
            f' or increase(vllm_e2e_request_latency_seconds_count{{{SVC}!="", cluster="eu-1"}}[1800s]))'
        )
        assert scope != QueryScope.of(1800, {"cluster": "eu-1"})

    def test_every_query_groups_by_service_and_config_hash(self):
        for query in build_query_plan(QueryScope.of(300)):
            assert f"by (namespace, {SVC}, {HASH}" in query.text
            assert f'{SVC}!=""' in query.text

    def test_rendered_counter_query(self):
        scope = QueryScope.of(300, {"cluster": "eu-1"})
        spec = next(s for s in metrics.QUERY_SPECS if s.name == "accepted_per_position")
        assert spec.promql(scope) == (
            f"sum by (namespace, {SVC}, {HASH}, position) "
            "(increase(vllm:spec_decode_num_accepted_tokens_per_pos_total"
            f'{{{SVC}!="", cluster="eu-1"}}[300s])'
            " or increase(vllm_spec_decode_num_accepted_tokens_per_pos_total"
            f'{{{SVC}!="", cluster="eu-1"}}[300s]))'
        )

    def test_rendered_gauge_and_timestamp_queries(self):
        scope = QueryScope.of(7.5)
        texts = {q.spec.name: q.text for q in build_query_plan(scope)}
        assert texts["running_sum"] == (
            f"sum by (namespace, {SVC}, {HASH}) "
            f'(sum_over_time(vllm:num_requests_running{{{SVC}!=""}}[7500ms])'
            f' or sum_over_time(vllm_num_requests_running{{{SVC}!=""}}[7500ms]))'
        )
        assert texts["running_samples"].startswith(f"sum by (namespace, {SVC}, {HASH}) (count_over_time(")
        assert texts["newest_sample"].startswith("max by (")
        assert "timestamp(vllm:num_requests_running" in texts["newest_sample"]
        assert " or timestamp(vllm_num_requests_running" in texts["newest_sample"]
        assert texts["pods"] == (
            f"count by (namespace, {SVC}, {HASH}, __name__) "
            f'(vllm:num_requests_running{{{SVC}!=""}} or vllm_num_requests_running{{{SVC}!=""}})'
        )

    def test_every_vllm_query_reads_both_spellings_in_one_expression(self):
        for query in build_query_plan(QueryScope.of(60)):
            colon = query.spec.metric
            assert colon.startswith("vllm:")
            assert colon in query.text and "vllm_" + colon[5:] in query.text

    def test_matcher_values_are_escaped(self):
        text = metrics.render_matchers([("team", 'a"b\\c')])
        assert text.endswith('team="a\\"b\\\\c"')

    @pytest.mark.parametrize("name", ["1abc", "a-b", "__name__", ""])
    def test_bad_selector_labels_are_refused(self, name):
        with pytest.raises(ValueError):
            QueryScope.of(60, {name: "x"})

    @pytest.mark.parametrize("window", [0, -5, math.inf])
    def test_bad_windows_are_refused(self, window):
        with pytest.raises(ValueError):
            QueryScope.of(window)

    def test_scope_ignores_selector_order(self):
        assert QueryScope.of(60, {"a": "1", "b": "2"}) == QueryScope.of(60, {"b": "2", "a": "1"})

    @pytest.mark.parametrize(
        "window, scrape, expected", [(300, 15, 75), (60, 15, 60), (120, 5, 30), (20, 10, 20)]
    )
    def test_guard_window(self, window, scrape, expected):
        assert metrics.guard_window(window, scrape) == expected


class TestObservations:
    def test_full_observation(self):
        obs = build_observations(full_results(), window_s=100, evaluated_at=1000)[KEY]
        spec = obs.speculation
        assert spec is not None and spec.k == 3
        assert spec.alpha == pytest.approx(0.8)
        assert spec.alpha_per_position == pytest.approx((0.8, 0.8, 0.8))
        assert spec.acceptance_rate == pytest.approx((0.8 + 0.64 + 0.512) / 3)
        assert spec.mean_accepted_length == pytest.approx(0.8 + 0.64 + 0.512)
        # rank 95 of 100 lies in (1, 1.5] holding 20, 15 of them below the rank.
        assert obs.e2e_p95_s == pytest.approx(1 + 0.5 * 15 / 20)
        assert obs.e2e_mean_s == pytest.approx(1.0)
        assert obs.tpot_p95_s == pytest.approx(0.0095)
        assert obs.tpot_mean_s == pytest.approx(0.006)
        assert obs.step_time_mean_s == pytest.approx(0.015)
        assert obs.request_rate == pytest.approx(1.0)
        assert obs.generation_tps == pytest.approx(200.0)
        assert obs.output_tokens_per_request == pytest.approx(200.0)
        assert obs.prompt_tokens_per_request == pytest.approx(500.0)
        assert obs.preemption_rate == pytest.approx(0.03)
        assert obs.batch_per_pod == pytest.approx(6.0)
        assert obs.staleness_s == pytest.approx(5.0)
        assert not obs.idle

    def test_speculation_off_is_absent_not_missing(self):
        results = {k: v for k, v in full_results().items() if "draft" not in k and "accepted" not in k}
        obs = build_observations(results, window_s=100, evaluated_at=1000)[KEY]
        assert obs.speculation is None
        assert obs.e2e_p95_s is not None

    def test_idle_service_has_no_latency_but_is_fresh(self):
        results = full_results()
        zero_buckets = bucket_samples(E2E_BOUNDS, [0] * (len(E2E_BOUNDS) + 1))
        results.update(
            e2e_buckets=zero_buckets, e2e_count=vec(0.0), e2e_sum=vec(0.0),
            tpot_count=vec(0.0), tpot_sum=vec(0.0),
        )
        obs = build_observations(results, window_s=100, evaluated_at=1000)[KEY]
        assert obs.idle and obs.e2e_p95_s is None and obs.e2e_mean_s is None
        assert obs.tpot_mean_s is None
        assert obs.staleness_s == pytest.approx(5.0)

    def test_a_window_without_two_samples_of_the_request_counter_is_not_idle(self):
        """After a scrape gap (or a pod's first minutes) increase() has no answer for the
        counters while the pods' gauges are back: nothing counted, which is not zero requests."""
        counted = build_observations(full_results(), window_s=100, evaluated_at=1000)[KEY]
        assert counted.requests_counted
        results = {k: v for k, v in full_results().items()
                   if k in ("running", "waiting", "kv_cache_usage", "newest_sample", "pods", "peak_running")}
        obs = build_observations(results, window_s=100, evaluated_at=1000)[KEY]
        assert obs.pods == 2 and not obs.requests_counted and obs.requests == 0

    def test_the_p95_is_as_sure_as_the_windows_requests_make_it(self):
        """The window's histogram rides along, and the P95 it is confidently above nears the
        P95 as the requests grow; without a histogram there is no bound."""
        obs = build_observations(full_results(), window_s=100, evaluated_at=1000)[KEY]
        assert obs.e2e_buckets and obs.e2e_buckets[-1] == (math.inf, 100.0)
        bounds = [metrics.confident_quantile(obs.e2e_buckets, 0.95, n, 2.0, 4.0) for n in (100, 1e3, 1e5)]
        assert bounds[0] < bounds[1] < bounds[2] <= obs.e2e_p95_s
        assert bounds[2] == pytest.approx(obs.e2e_p95_s, rel=0.02)
        assert metrics.confident_quantile((), 0.95, 100, 2.0, 4.0) is None

    def test_nan_values_are_ignored(self):
        results = full_results()
        results["e2e_sum"] = vec(math.nan)
        results["running_sum"] = vec(math.nan)
        obs = build_observations(results, window_s=100, evaluated_at=1000)[KEY]
        assert obs.e2e_mean_s is None and obs.running is None

    def test_config_hashes_are_attributed_separately(self):
        other = ConfigKey("ns", "llama", "def456")
        results = full_results()
        results["drafts"] = vec(1000.0) + vec(10.0, other)
        results["e2e_count"] = vec(100.0) + vec(7.0, other)
        out = build_observations(results, window_s=100, evaluated_at=1000)
        assert set(out) == {KEY, other}
        assert out[other].requests == 7.0
        assert out[other].speculation is not None and out[other].speculation.drafts == 10.0
        assert out[KEY].requests == 100.0

    def test_series_without_a_service_label_are_ignored(self):
        results = {"drafts": [VectorSample({"namespace": "ns"}, 5.0)]}
        assert build_observations(results, window_s=60, evaluated_at=0) == {}

    def test_missing_positions_count_as_zero(self):
        results = full_results()
        results["accepted_per_position"] = [
            VectorSample(labels(position="0"), 500.0), VectorSample(labels(position="2"), 10.0)
        ]
        spec = build_observations(results, window_s=100, evaluated_at=1000)[KEY].speculation
        assert spec.accepted_per_position == (500.0, 0.0, 10.0)

    def test_spelling_found_is_reported_and_pods_under_either_name_add_up(self):
        results = full_results()
        results["pods"] = vec(2.0, __name__="vllm_num_requests_running")
        obs = build_observations(results, window_s=100, evaluated_at=1000)[KEY]
        assert obs.metric_spellings == ("vllm_",) and obs.to_status()["metricNames"] == "vllm_"
        assert obs.pods == 2
        results["pods"] += vec(1.0, __name__=N.RUNNING)
        obs = build_observations(results, window_s=100, evaluated_at=1000)[KEY]
        assert obs.pods == 3 and obs.metric_names == "vllm: and vllm_"

    def test_to_status_matches_the_api_model(self):
        from specdecode import api

        obs = build_observations(full_results(), window_s=300, evaluated_at=1000)[KEY]
        status = obs.to_status()
        assert status["acceptanceRate"] == pytest.approx(0.6507, abs=1e-4)
        assert status["window"] == "300s" and status["observedAt"] == "1970-01-01T00:16:40Z"
        assert status["runningRequests"] == 6.0  # per replica
        assert status["drafts"] == 1000.0 and status["configHash"] == "abc123"
        assert status["metricNames"] == "vllm:"
        model = api.Observations.model_validate(status)
        assert model.to_wire() == status  # every field known to the API, none dropped

    @settings(max_examples=200, deadline=None)
    @given(alpha=st.floats(0.01, 0.99), k=st.integers(1, 10), drafts=st.floats(1.0, 1e6))
    def test_alpha_mle_recovers_geometric_acceptance(self, alpha, k, drafts):
        per_pos = tuple(drafts * alpha ** (i + 1) for i in range(k))
        counts = SpeculationCounts(drafts, drafts * k, sum(per_pos), per_pos)
        assert counts.alpha == pytest.approx(alpha, rel=1e-9)
        expected_rate = alpha * (1 - alpha**k) / ((1 - alpha) * k)
        assert counts.acceptance_rate == pytest.approx(expected_rate, rel=1e-9)

    def test_alpha_undefined_without_drafts(self):
        counts = SpeculationCounts(0.0, 0.0, 0.0, ())
        assert counts.alpha is None and counts.acceptance_rate is None
        assert counts.mean_accepted_length is None


# --- Emulated evaluation --------------------------------------------------------------------


def pod_series(
    key: ConfigKey, pod: str, times: list[float], *, alpha: float, k: int, drafts_per_s: float,
    reset_at: float | None = None, stale_at: float | None = None, running: float = 4.0,
) -> list[RawSeries]:
    """Deterministic counters of one pod scraped at ``times`` (a restart resets them)."""
    base = {"namespace": key.namespace, SVC: key.service, HASH: key.config_hash, "pod": pod}

    def counter(name: str, per_s: float, **extra: str) -> RawSeries:
        samples, origin = [], times[0] - 100.0
        for t in times:
            if reset_at is not None and t >= reset_at and origin < reset_at:
                origin = reset_at
            samples.append((t, per_s * (t - origin)))
        return RawSeries({"__name__": name, **base, **extra}, samples, stale_at)

    out = [
        counter(N.total(N.SPEC_DRAFTS), drafts_per_s),
        counter(N.total(N.SPEC_DRAFT_TOKENS), drafts_per_s * k),
        counter(N.total(N.SPEC_ACCEPTED_TOKENS), drafts_per_s * sum(alpha ** (i + 1) for i in range(k))),
        counter(N.E2E + "_count", 1.0),
        counter(N.E2E + "_sum", 2.0),
        RawSeries({"__name__": N.RUNNING, **base}, [(t, running) for t in times], stale_at),
    ]
    out += [
        counter(N.total(N.SPEC_ACCEPTED_PER_POS), drafts_per_s * alpha ** (i + 1), position=str(i))
        for i in range(k)
    ]
    for bound, share in [("1.0", 0.0), ("2.5", 1.0), ("+Inf", 1.0)]:
        out.append(counter(N.E2E + "_bucket", share, le=bound))
    return out


class TestEmulatedPlan:
    TIMES = [1000.0 + 5 * i for i in range(40)]

    def test_counters_sum_over_pods_and_a_reset_keeps_the_ratios(self):
        scope = QueryScope.of(60)
        series = pod_series(KEY, "a", self.TIMES, alpha=0.7, k=4, drafts_per_s=10)
        series += pod_series(KEY, "b", self.TIMES, alpha=0.7, k=4, drafts_per_s=10, reset_at=1150)
        obs = metrics.observe_series(scope, series, at=1195.0)[KEY]
        assert obs.speculation.alpha == pytest.approx(0.7)
        # Pod b restarted at 1150: the 5 s since its scrape at 1145 are lost (as in vLLM),
        # the drop is a reset, and the 55 s sampled extrapolate to the 60 s window.
        assert obs.speculation.drafts == pytest.approx(600 + 500 * 60 / 55, rel=1e-9)
        assert obs.request_rate == pytest.approx((60 + 50 * 60 / 55) / 60, rel=1e-9)
        assert obs.e2e_mean_s == pytest.approx(2.0)
        assert 1.0 < obs.e2e_p95_s <= 2.5
        assert obs.pods == 2 and obs.running == pytest.approx(8.0)
        assert obs.staleness_s == pytest.approx(0.0)

    def test_old_config_is_not_attributed_to_the_new_one(self):
        scope = QueryScope.of(60)
        old = ConfigKey("ns", "llama", "old")
        series = pod_series(old, "a", self.TIMES[:20], alpha=0.2, k=4, drafts_per_s=10, stale_at=1100)
        series += pod_series(KEY, "b", self.TIMES[20:], alpha=0.8, k=2, drafts_per_s=10)
        out = metrics.observe_series(scope, series, at=1195.0)
        assert old not in out  # its samples left the window
        assert out[KEY].speculation.alpha == pytest.approx(0.8)
        mixed = metrics.observe_series(scope, series, at=1130.0)
        assert mixed[old].speculation.alpha == pytest.approx(0.2)
        assert mixed[old].newest_sample_at is None  # stale: the pod is gone
        assert mixed[KEY].speculation.k == 2

    def test_a_pod_that_left_inside_the_window_weighs_by_the_time_it_served(self):
        """A canary borrows one of two replicas at 1100; the one left carries the whole load,
        its batch going from 4 to 8. Over the 200-second window a serving pod ran
        (20 x 4 + 20 x 8 + 20 x 4) / 60 = 5.33 on average. Prometheus keeps the borrowed pod's
        samples in range after its staleness marker, so a sum of per-pod means over the one
        pod serving now read 6 + 4 = 10, nearly twice the batch, for five minutes."""
        scope = QueryScope.of(200)
        left = pod_series(KEY, "b", self.TIMES[:20], alpha=0.7, k=3, drafts_per_s=10, stale_at=1100)
        stayed = pod_series(KEY, "a", self.TIMES, alpha=0.7, k=3, drafts_per_s=10)
        stayed = [s for s in stayed if s.name != N.RUNNING] + [RawSeries(
            {"__name__": N.RUNNING, "namespace": KEY.namespace, SVC: KEY.service, HASH: KEY.config_hash, "pod": "a"},
            [(t, 4.0 if t < 1100 else 8.0) for t in self.TIMES],
        )]
        obs = metrics.observe_series(scope, left + stayed, at=1195.0)[KEY]
        assert obs.pods == 1
        assert obs.batch_per_pod == pytest.approx(320.0 / 60.0)

    def test_past_capacity_the_arrivals_are_the_finished_requests_plus_the_queues_growth(self):
        """Two replicas finish 1 request/s each (the counters above) while 3 arrive at each:
        their waiting queues grow 2 a second. The finished rate is the capacity, not the load;
        the arrivals are what a config must carry. A queue that drains takes its drain off."""
        scope = QueryScope.of(60)
        series = []
        for pod in ("a", "b"):
            series += pod_series(KEY, pod, self.TIMES, alpha=0.7, k=3, drafts_per_s=10)
            base = {"namespace": KEY.namespace, SVC: KEY.service, HASH: KEY.config_hash, "pod": pod}
            series.append(RawSeries({"__name__": N.WAITING, **base}, [(t, 2.0 * (t - 1000.0)) for t in self.TIMES]))
        obs = metrics.observe_series(scope, series, at=1195.0)[KEY]
        assert obs.request_rate == pytest.approx(2.0)
        assert obs.queue_change == pytest.approx(240.0)
        assert obs.arrival_rate == pytest.approx(6.0)
        assert obs.to_status()["arrivalRate"] == pytest.approx(6.0)
        draining = [s if s.name != N.WAITING else RawSeries(s.labels, [(t, 500.0 - (t - 1000.0)) for t in self.TIMES])
                    for s in series]
        assert metrics.observe_series(scope, draining, at=1195.0)[KEY].arrival_rate == pytest.approx(0.0)

    def test_without_queue_series_the_arrivals_are_the_finished_requests(self):
        scope = QueryScope.of(60)
        series = [s for s in pod_series(KEY, "a", self.TIMES, alpha=0.7, k=3, drafts_per_s=10) if s.name != N.RUNNING]
        obs = metrics.observe_series(scope, series, at=1195.0)[KEY]
        assert obs.queue_change is None
        assert obs.arrival_rate == obs.request_rate == pytest.approx(1.0)
        assert "arrivalRate" not in obs.to_status()

    @staticmethod
    def escaped(series: list[RawSeries]) -> list[RawSeries]:
        """The same series as Prometheus 2.x stores them from an OpenMetrics scrape."""
        return [
            RawSeries({**s.labels, "__name__": s.name.replace("vllm:", "vllm_")}, s.samples, s.stale_at)
            for s in series
        ]

    def test_escaped_names_give_the_same_observation(self):
        scope = QueryScope.of(60)
        series = pod_series(KEY, "a", self.TIMES, alpha=0.7, k=3, drafts_per_s=10)
        colon = metrics.observe_series(scope, series, at=1195.0)[KEY]
        underscore = metrics.observe_series(scope, self.escaped(series), at=1195.0)[KEY]
        assert underscore.metric_spellings == ("vllm_",) and colon.metric_spellings == ("vllm:",)
        assert underscore.speculation == colon.speculation
        assert (underscore.pods, underscore.requests, underscore.running) == (colon.pods, colon.requests, colon.running)

    def test_a_pod_stored_under_both_names_is_not_counted_twice(self):
        scope = QueryScope.of(60)
        series = pod_series(KEY, "a", self.TIMES, alpha=0.7, k=3, drafts_per_s=10)
        alone = metrics.observe_series(scope, series, at=1195.0)[KEY]
        both = metrics.observe_series(scope, series + self.escaped(series), at=1195.0)[KEY]
        assert both.speculation == alone.speculation and both.requests == alone.requests
        assert both.pods == 1 and both.running == alone.running
        assert both.metric_spellings == ("vllm:",)  # the pod answered under vLLM's own name

    def test_pods_under_different_names_add_up(self):
        scope = QueryScope.of(60)
        series = pod_series(KEY, "a", self.TIMES, alpha=0.7, k=3, drafts_per_s=10)
        series += self.escaped(pod_series(KEY, "b", self.TIMES, alpha=0.7, k=3, drafts_per_s=10))
        obs = metrics.observe_series(scope, series, at=1195.0)[KEY]
        assert obs.pods == 2 and obs.speculation.drafts == pytest.approx(1200.0)
        assert obs.metric_spellings == ("vllm:", "vllm_")

    def test_selector_matchers_filter_series(self):
        series = pod_series(KEY, "a", self.TIMES, alpha=0.7, k=2, drafts_per_s=10)
        assert metrics.observe_series(QueryScope.of(60, {"pod": "zzz"}), series, 1195.0) == {}
        assert KEY in metrics.observe_series(QueryScope.of(60, {"pod": "a"}), series, 1195.0)


# --- Shell ----------------------------------------------------------------------------------


class FakeClient:
    def __init__(self, answers=None, error: Exception | None = None):
        self.answers = answers or {}
        self.error = error
        self.queries: list[tuple[str, dict]] = []
        self.closed = False

    def custom_query(self, query, params=None):
        self.queries.append((query, params))
        if self.error is not None:
            raise self.error
        for spec in metrics.QUERY_SPECS:
            if query == spec.promql(QueryScope.of(100)):
                return self.answers.get(spec.name, [])
        return []

    def close(self):
        self.closed = True


def as_json(samples: list[VectorSample]) -> list[dict]:
    return [{"metric": dict(s.labels), "value": [1000.0, repr(s.value)]} for s in samples]


class TestReader:
    def test_successful_read(self):
        answers = {name: as_json(v) for name, v in full_results().items()}
        client = FakeClient(answers)
        reader = PrometheusReader(PrometheusAccess("http://prom"), connect=lambda _: client)
        result = reader.read([QueryScope.of(100), QueryScope.of(100)], at=1000.0)
        assert isinstance(result, MetricsSnapshot)
        assert result.queries == len(metrics.QUERY_SPECS)
        assert {p["time"] for _, p in client.queries} == {"1000.000"}
        obs = result.for_service(QueryScope.of(100), "ns", "llama")["abc123"]
        assert obs.speculation.alpha == pytest.approx(0.8)
        assert client.closed

    @pytest.mark.parametrize(
        "error, words",
        [
            (requests.exceptions.ConnectionError("refused"), "unreachable"),
            (requests.exceptions.ReadTimeout("slow"), "timed out"),
            (PrometheusApiClientException("HTTP Status Code 503 (b'down')"), "failed on its side (HTTP 503)"),
            (PrometheusApiClientException("HTTP Status Code 401 (b'no')"), "refused the credentials (check spec.metrics.auth) (HTTP 401)"),
            (PrometheusApiClientException("HTTP Status Code 404 (b'no')"), "(HTTP 404)"),
            (ValueError("Expecting value: line 1"), "failed"),
        ],
    )
    def test_failures_become_unavailable(self, error, words):
        reader = PrometheusReader(PrometheusAccess("http://prom"), connect=lambda _: FakeClient(error=error))
        result = reader.read([QueryScope.of(100)], at=1000.0)
        assert isinstance(result, MetricsUnavailable)
        assert result.reason == constants.REASON_METRICS_MISSING
        assert words in result.message

    def test_malformed_answer_is_unavailable(self):
        client = FakeClient({"drafts": [{"metric": {}, "value": ["x"]}]})
        reader = PrometheusReader(PrometheusAccess("http://prom"), connect=lambda _: client)
        result = reader.read([QueryScope.of(100)], at=1000.0)
        assert isinstance(result, MetricsUnavailable) and "not a Prometheus vector" in result.message

    @pytest.mark.parametrize(
        "error",
        [
            PrometheusApiClientException("HTTP Status Code 500 (b'internal: admin-password=hunter2 at 10.0.0.7')"),
            PrometheusApiClientException("weird answer admin-password=hunter2 at 10.0.0.7"),
            ValueError("Expecting value: admin-password=hunter2 at 10.0.0.7"),
            KeyError("admin-password=hunter2 at 10.0.0.7"),
        ],
    )
    def test_the_answer_of_a_failing_endpoint_is_never_reflected(self, error):
        """A spec's URL may point at any internal service: what it answers must not reach
        status (the tenant reads it), only a classified cause and the HTTP status."""
        reader = PrometheusReader(PrometheusAccess("http://internal"), connect=lambda _: FakeClient(error=error))
        result = reader.read([QueryScope.of(100)], at=1000.0)
        assert isinstance(result, MetricsUnavailable)
        assert "hunter2" not in result.message and "10.0.0.7" not in result.message
        assert "internal" in result.message

    def test_a_malformed_answer_is_not_reflected(self):
        client = FakeClient({"drafts": [{"metric": {"leak": "hunter2"}, "value": ["x"]}]})
        result = PrometheusReader(PrometheusAccess("http://prom"), connect=lambda _: client).read([QueryScope.of(100)], at=1000.0)
        assert isinstance(result, MetricsUnavailable) and "hunter2" not in result.message

    def test_nan_and_inf_strings_parse(self):
        parsed = metrics.parse_vector(
            [{"metric": {"a": "b"}, "value": [1, "NaN"]}, {"metric": {}, "value": [1, "+Inf"]}]
        )
        assert math.isnan(parsed[0].value) and parsed[1].value == math.inf

    def test_a_fleets_answers_share_their_label_texts(self):
        """A 500-service read holds 60,000 samples at once: each keeps the decoded answer's
        own label dict (no copy) and each service's name is one string across every query's
        answer, not one per sample (the read's peak went from 33 to 17 MB)."""
        def answer(le: str) -> list[dict]:
            return json.loads(json.dumps([{"metric": {"specdecode_service": f"svc-{i}", "le": le}, "value": [1, "2"]}
                                          for i in range(3)]))

        first, second = answer("0.5"), answer("+Inf")
        kept = first[1]["metric"]
        a, b = metrics.parse_vector(first), metrics.parse_vector(second)
        assert a[1].labels is kept and a[1].labels == {"specdecode_service": "svc-1", "le": "0.5"}
        assert a[1].labels["specdecode_service"] is b[1].labels["specdecode_service"]
        odd = metrics.parse_vector([{"metric": {"position": 1}, "value": [1, "3"]}])
        assert odd[0].labels == {"position": "1"}

    def test_connection_refused_against_a_real_client(self):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        reader = PrometheusReader(PrometheusAccess(f"http://127.0.0.1:{port}", timeout_s=2))
        result = reader.read([QueryScope.of(60)], at=1000.0)
        assert isinstance(result, MetricsUnavailable)
        assert "unreachable" in result.message

    def test_headers_carry_token_and_custom_headers(self, tmp_path):
        token_file = tmp_path / "token"
        token_file.write_text("rotated\n")
        access = PrometheusAccess(
            "https://thanos", bearer_token="static", bearer_token_file=str(token_file),
            headers={"X-Scope-OrgID": "tenant-a"},
        )
        assert access.request_headers() == {
            "X-Scope-OrgID": "tenant-a", "Authorization": "Bearer rotated"
        }

    def test_default_client_uses_ca_bundle_and_headers(self, tmp_path):
        ca = tmp_path / "ca.pem"
        ca.write_text("")
        access = PrometheusAccess(
            "https://prom/", bearer_token="t", ca_bundle=str(ca), headers={"X-A": "1"}, timeout_s=3
        )
        client = prometheus._default_connect(access)
        assert client.url == "https://prom"
        assert client.headers == {"X-A": "1", "Authorization": "Bearer t"}
        assert client._session.verify == str(ca)

    def test_insecure_skip_verify(self):
        client = prometheus._default_connect(PrometheusAccess("https://prom", insecure_skip_verify=True))
        assert client._session.verify is False


def test_a_services_series_come_from_the_reads_index_by_config_hash():
    """for_service looks a service up in an index built with the snapshot (issue #18: a scan
    of every service's keys made each evaluation's cost grow with the fleet)."""
    scope, other_scope = QueryScope.of(300.0), QueryScope.of(60.0)
    a, b = object(), object()
    snapshot = MetricsSnapshot(evaluated_at=0.0, queries=1, observations={
        scope: {ConfigKey("ns", "llama", "abc"): a, ConfigKey("ns", "llama", "def"): b,
                ConfigKey("ns", "qwen", "abc"): object(), ConfigKey("other", "llama", "abc"): object()},
    })
    assert snapshot.for_service(scope, "ns", "llama") == {"abc": a, "def": b}
    assert snapshot.for_service(scope, "ns", "missing") == {}
    assert snapshot.for_service(other_scope, "ns", "llama") == {}
    snapshot.for_service(scope, "ns", "llama").clear()  # the caller's copy, not the index
    assert snapshot.for_service(scope, "ns", "llama") == {"abc": a, "def": b}
