"""The PromQL emulation: rate/increase extrapolation, counter resets, histogram_quantile."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdecode.control import promql
from specdecode.control.promql import (
    PROMETHEUS_2_LEGACY,
    PROMETHEUS_3,
    PromQLRules,
    delta,
    extrapolated_change,
    histogram_quantile,
    increase,
    rate,
    select_range,
)


def regular(start: float, step: float, values: list[float]) -> list[tuple[float, float]]:
    return [(start + i * step, v) for i, v in enumerate(values)]


class TestRangeSelection:
    def test_left_open_excludes_the_start_sample(self):
        samples = regular(0, 10, [0, 1, 2, 3])
        assert select_range(samples, 30, 30, PROMETHEUS_3) == samples[1:]

    def test_closed_range_includes_the_start_sample(self):
        samples = regular(0, 10, [0, 1, 2, 3])
        assert select_range(samples, 30, 30, PROMETHEUS_2_LEGACY) == samples

    def test_staleness_markers_are_never_in_a_range(self):
        samples = [(1.0, 1.0), (2.0, math.nan), (3.0, 2.0)]
        assert select_range(samples, 3, 10) == [(1.0, 1.0), (3.0, 2.0)]


class TestIncrease:
    def test_fewer_than_two_samples_gives_nothing(self):
        assert increase([(5.0, 3.0)], 10, 10) is None
        assert increase([], 10, 10) is None

    def test_full_coverage_extrapolates_to_both_boundaries(self):
        # Samples every 10 s at t = 2, 12, ..., 52 over the window (0, 60]: the gaps at both
        # ends (2 s and 8 s) are below 1.1 * 10 s, so extrapolate all the way.
        samples = regular(2, 10, [100 + 5 * i for i in range(6)])
        result = increase(samples, 60, 60)
        assert result == pytest.approx(25 * (50 + 2 + 8) / 50)

    def test_series_starting_inside_the_window_extrapolates_half_a_gap(self):
        # First sample 30 s after the window start: beyond the threshold, so only 5 s.
        samples = regular(30, 10, [1000, 1010, 1020, 1030])
        result = increase(samples, 60, 60)
        # to_start = 5 (half gap), to_end = 0; zero cap 30 * 1000/30 = 1000 is larger.
        assert result == pytest.approx(30 * (30 + 5 + 0) / 30)

    def test_counter_reset_adds_the_value_before_the_drop(self):
        samples = regular(0, 10, [0, 10, 20, 5, 15, 25])
        # delta = 25 - 0 + 20 (reset) = 45 over 50 s sampled; window (0, 50] closed at 0.
        result = extrapolated_change(samples, 0, 50, is_counter=True, is_rate=False)
        assert result == pytest.approx(45)

    def test_zero_cap_stops_extrapolation_below_zero(self):
        # A counter born at t=10 with value 1 rising 10 per 10 s: extrapolating to the
        # window start (5 s earlier) would go below zero; the cap is 10 * 1/10 = 1 s.
        samples = regular(10, 10, [1, 11, 21, 31])
        result = increase(samples, 45, 40)  # window (5, 45]
        assert result == pytest.approx(30 * (30 + 1 + 5) / 30)

    def test_zero_cap_order_differs_between_versions(self):
        # to_start = 12 >= threshold 11 -> new rules: min(half gap 5, to_zero 9) = 5;
        # legacy rules: to_zero 9 < 12 first, then 9 < 11 -> extrapolate 9.
        samples = regular(12, 10, [9, 19, 29])
        new = increase(samples, 32, 32, PROMETHEUS_3)
        legacy = increase(samples, 32, 32, PROMETHEUS_2_LEGACY)
        assert new == pytest.approx(20 * (20 + 5 + 0) / 20)
        assert legacy == pytest.approx(20 * (20 + 9 + 0) / 20)

    def test_rate_is_increase_over_the_range(self):
        samples = regular(1, 5, [3 * i for i in range(20)])
        assert rate(samples, 100, 60) == pytest.approx(increase(samples, 100, 60) / 60)

    @settings(max_examples=200, deadline=None)
    @given(
        slope=st.floats(0.0, 1000.0),
        step_ms=st.integers(1000, 30000),
        offset_ms=st.integers(0, 999),
        window_steps=st.integers(3, 40),
    )
    def test_linear_counter_recovers_its_slope(self, slope, step_ms, offset_ms, window_steps):
        # A counter that has existed long before the window and is scraped regularly
        # (timestamps in whole milliseconds, as Prometheus stores them).
        step = step_ms / 1000
        window = window_steps * step
        start = 1_700_000_000.0
        samples = [(start + i * step, 1e6 + slope * i * step) for i in range(window_steps * 3)]
        at = start + window_steps * 2 * step + offset_ms / 1000
        assert rate(samples, at, window) == pytest.approx(slope, rel=1e-9, abs=1e-9)

    @settings(max_examples=200, deadline=None)
    @given(
        increments=st.lists(st.floats(0.0, 100.0), min_size=2, max_size=50),
        reset_at=st.sets(st.integers(1, 49), max_size=3),
    )
    def test_counters_with_resets_never_decrease(self, increments, reset_at):
        value, samples = 0.0, []
        for i, inc in enumerate(increments):
            value = inc if i in reset_at else value + inc
            samples.append((float(i), value))
        result = increase(samples, len(samples) - 1.0, float(len(samples) + 5))
        assert result is not None and result >= 0


class TestDelta:
    """``delta(gauge[W])``: how much a queue grew (or drained) over the window."""

    def test_a_growing_queue_is_extrapolated_to_the_window(self):
        samples = regular(2, 10, [100 + 50 * i for i in range(6)])
        assert delta(samples, 60, 60) == pytest.approx(250 * (50 + 2 + 8) / 50)

    def test_a_draining_queue_gives_a_negative_change(self):
        # A counter would read the fall as a reset; a gauge simply fell.
        samples = regular(0, 10, [500, 400, 300, 200, 100, 0])
        assert delta(samples, 50, 50) == pytest.approx(-500)

    def test_no_zero_cap_for_a_gauge(self):
        # Extrapolating a rise of 10 per 10 s back 5 s from a value of 1 crosses zero: increase
        # caps it there, delta does not.
        samples = regular(10, 10, [1, 11, 21, 31])
        assert delta(samples, 45, 40) == pytest.approx(30 * (30 + 5 + 5) / 30)
        assert increase(samples, 45, 40) < delta(samples, 45, 40)

    def test_fewer_than_two_samples_gives_nothing(self):
        assert delta([(5.0, 3.0)], 10, 10) is None


class TestHistogramQuantile:
    BUCKETS = [(0.1, 10.0), (0.5, 60.0), (1.0, 90.0), (math.inf, 100.0)]

    def test_interpolates_linearly_within_the_bucket(self):
        # rank 50 falls into (0.1, 0.5] holding 50 observations, 40 of them below rank.
        assert histogram_quantile(0.5, self.BUCKETS) == pytest.approx(0.1 + 0.4 * 40 / 50)

    def test_first_bucket_starts_at_zero(self):
        assert histogram_quantile(0.05, self.BUCKETS) == pytest.approx(0.1 * 5 / 10)

    def test_quantile_in_the_inf_bucket_is_the_top_finite_bound(self):
        assert histogram_quantile(0.95, self.BUCKETS) == 1.0

    def test_no_observations_is_nan(self):
        assert math.isnan(histogram_quantile(0.95, [(0.1, 0.0), (math.inf, 0.0)]))

    def test_missing_inf_bucket_is_nan(self):
        assert math.isnan(histogram_quantile(0.5, [(0.1, 1.0), (0.5, 2.0)]))

    def test_single_bucket_is_nan(self):
        assert math.isnan(histogram_quantile(0.5, [(math.inf, 5.0)]))

    def test_order_and_duplicates_do_not_matter(self):
        shuffled = [self.BUCKETS[2], (0.5, 30.0), self.BUCKETS[0], self.BUCKETS[3], (0.5, 30.0)]
        assert histogram_quantile(0.5, shuffled) == histogram_quantile(0.5, self.BUCKETS)

    def test_non_monotonic_counts_are_forced_monotonic(self):
        broken = [(0.1, 10.0), (0.5, 5.0), (1.0, 10.0), (math.inf, 20.0)]
        # The envelope is 10, 10, 10, 20.
        assert histogram_quantile(0.5, broken) == pytest.approx(0.1)
        assert histogram_quantile(0.25, broken) == pytest.approx(0.1 * 5 / 10)
        assert histogram_quantile(0.75, broken) == 1.0

    def test_zero_quantile_in_an_empty_first_bucket_is_nan_like_go(self):
        assert math.isnan(histogram_quantile(0.0, [(0.1, 0.0), (math.inf, 3.0)]))

    @pytest.mark.parametrize("q, expected", [(-0.1, -math.inf), (1.1, math.inf)])
    def test_out_of_range_quantiles(self, q, expected):
        assert histogram_quantile(q, self.BUCKETS) == expected

    def test_nan_quantile(self):
        assert math.isnan(histogram_quantile(math.nan, self.BUCKETS))

    @settings(max_examples=200, deadline=None)
    @given(
        counts=st.lists(st.floats(0.0, 1e6), min_size=2, max_size=12),
        q1=st.floats(0.0, 1.0),
        q2=st.floats(0.0, 1.0),
    )
    def test_monotone_in_q_and_bounded(self, counts, q1, q2):
        bounds = [0.01 * 2**i for i in range(len(counts) - 1)] + [math.inf]
        cumulative, total = [], 0.0
        for c in counts:
            total += c
            cumulative.append(total)
        buckets = list(zip(bounds, cumulative))
        lo, hi = sorted((q1, q2))
        a, b = histogram_quantile(lo, buckets), histogram_quantile(hi, buckets)
        if total == 0:
            assert math.isnan(a) and math.isnan(b)
            return
        if math.isnan(a):  # rank q * total = 0 in an empty first bucket: 0/0 as in Go
            assert lo * total == 0  # q = 0, or a tiny q whose rank underflows (q 3.3e-224 seen)
            return
        assert 0 <= a <= b + 1e-12
        assert b <= bounds[-2]


class TestInstantSample:
    def test_newest_sample_within_lookback(self):
        samples = [(10.0, 1.0), (20.0, 2.0)]
        assert promql.instant_sample(samples, 25) == (20.0, 2.0)

    def test_nothing_beyond_lookback(self):
        rules = PromQLRules(lookback_s=5)
        assert promql.instant_sample([(10.0, 1.0)], 16, rules) is None

    def test_stale_marker_hides_the_series(self):
        samples = [(10.0, 1.0)]
        assert promql.instant_sample(samples, 20, stale_at=15) is None
        assert promql.instant_sample(samples, 14, stale_at=15) == (10.0, 1.0)


@pytest.mark.parametrize(
    "version, rules",
    [
        ("2.42.0+ds", PROMETHEUS_2_LEGACY),
        ("v2.50.1", PROMETHEUS_2_LEGACY),
        ("2.51.0", promql.PROMETHEUS_2_51),
        ("3.1.0", PROMETHEUS_3),
    ],
)
def test_rules_for_version(version, rules):
    assert promql.rules_for_version(version) == rules


def test_rules_for_version_rejects_garbage():
    with pytest.raises(ValueError):
        promql.rules_for_version("latest")


@pytest.mark.parametrize(
    "seconds, text", [(300, "300s"), (7.5, "7500ms"), (0.25, "250ms"), (60.0, "60s")]
)
def test_format_duration(seconds, text):
    assert promql.format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0, -1, math.inf, math.nan])
def test_format_duration_rejects_non_positive(seconds):
    with pytest.raises(ValueError):
        promql.format_duration(seconds)
