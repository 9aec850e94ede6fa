"""A pure emulation of the PromQL functions the metrics reader relies on.

The policy benchmark replays scenarios without a Prometheus server, yet it must see exactly
what production sees: the same windows, the same extrapolation, the same counter-reset
handling and the same quantile interpolation. This module reimplements those semantics as
pure functions over raw samples ``(t_seconds, value)``; `specdecode.control.metrics` evaluates its
query plan with them in the benchmark, and an e2e test compares them with a real Prometheus.

Semantics emulated (Prometheus `promql/functions.go` and `promql/quantile.go`):

Range selection
    ``metric[W]`` evaluated at time ``T`` selects the samples with ``T - W < t <= T``
    (left-open, Prometheus >= 3.0) or ``T - W <= t <= T`` (closed, Prometheus 2.x).

``increase`` / ``rate`` / ``delta`` (``extrapolatedRate``)
    With the selected samples ``s_0 .. s_n`` (n >= 1; fewer gives no result):

    * ``delta = v_n - v_0``, plus ``v_{i-1}`` for every reset ``v_i < v_{i-1}`` (a counter
      that drops restarted from zero, so everything it had counted before is added back);
    * ``sampled = t_n - t_0``, ``avg_gap = sampled / n``, ``threshold = 1.1 * avg_gap``;
    * ``to_start = t_0 - (T - W)``, ``to_end = T - t_n``; a gap at either end that is at
      least ``threshold`` means the series starts/ends inside the window: extrapolate only
      ``avg_gap / 2`` on that side instead of all the way to the boundary;
    * counters cannot go below zero: if ``delta > 0`` and ``v_0 >= 0``, the start
      extrapolation is capped at ``to_zero = sampled * v_0 / delta``. Since Prometheus 2.51
      (PR 13725) the cap applies after the threshold rule; before, it applied first (the
      threshold was then compared with the capped value);
    * ``increase = delta * (sampled + to_start + to_end) / sampled`` and
      ``rate = increase / W``;
    * ``delta(gauge[W])`` is the same extrapolation without the resets and the cap (a gauge
      may fall).

``histogram_quantile`` (classic buckets, ``bucketQuantile``)
    Sort by upper bound, require a ``+Inf`` bucket (else NaN), merge equal bounds, absorb
    relative float errors below 1e-12, force the counts monotonic; NaN with fewer than two
    buckets or zero observations. ``rank = q * total``; the first bucket whose cumulative
    count reaches ``rank`` holds the quantile, interpolated linearly between the bucket's
    lower bound (the previous upper bound, or 0 for the first bucket) and its upper bound.
    A quantile in the ``+Inf`` bucket is capped at the highest finite bound.

Instant selection
    ``metric`` at ``T`` picks the newest sample with ``T - lookback < t <= T`` (5 minutes by
    default), unless the series was marked stale (its target vanished) after that sample.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

Sample = tuple[float, float]
"""One stored sample: (timestamp in seconds since the epoch, value)."""

Bucket = tuple[float, float]
"""One classic histogram bucket: (upper bound ``le``, cumulative count)."""

DEFAULT_LOOKBACK_S = 300.0
"""Prometheus's default ``--query.lookback-delta``."""

EXTRAPOLATION_THRESHOLD_FACTOR = 1.1
"""A boundary gap longer than this many average sample gaps means the series starts or ends
inside the window."""

PRECISION_TOLERANCE = 1e-12
"""Relative difference between neighbouring bucket counts treated as float noise."""


@dataclass(frozen=True)
class PromQLRules:
    """Version-dependent details of Prometheus's evaluation.

    The defaults match Prometheus 3.x; `rules_for_version` picks them for older servers.
    """

    left_open_ranges: bool = True
    """Range selectors exclude a sample exactly at the window start (Prometheus >= 3.0)."""

    zero_cap_after_threshold: bool = True
    """The counter zero-point cap applies after the extrapolation threshold (>= 2.51)."""

    lookback_s: float = DEFAULT_LOOKBACK_S
    """How far back an instant selector looks for the newest sample."""


PROMETHEUS_3 = PromQLRules()
PROMETHEUS_2_51 = PromQLRules(left_open_ranges=False, zero_cap_after_threshold=True)
PROMETHEUS_2_LEGACY = PromQLRules(left_open_ranges=False, zero_cap_after_threshold=False)

_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)")


def rules_for_version(version: str, lookback_s: float = DEFAULT_LOOKBACK_S) -> PromQLRules:
    """The evaluation rules of a Prometheus release, from its version string ("2.42.0+ds")."""
    match = _VERSION_RE.match(version)
    if not match:
        raise ValueError(f"not a Prometheus version: {version!r}")
    major, minor = int(match.group(1)), int(match.group(2))
    if major >= 3:
        base = PROMETHEUS_3
    elif (major, minor) >= (2, 51):
        base = PROMETHEUS_2_51
    else:
        base = PROMETHEUS_2_LEGACY
    return PromQLRules(base.left_open_ranges, base.zero_cap_after_threshold, lookback_s)


def select_range(
    samples: Sequence[Sample], at: float, range_s: float, rules: PromQLRules = PROMETHEUS_3
) -> Sequence[Sample]:
    """The samples a range selector ``[range_s]`` evaluated at ``at`` sees.

    ``samples`` must be sorted by time (as a time series is). NaN values (staleness markers)
    are never part of a range.
    """
    end_ms = to_millis(at)
    start_ms = end_ms - to_millis(range_s)
    if rules.left_open_ranges:
        lo = bisect.bisect_right(samples, start_ms, key=_sample_millis)
    else:
        lo = bisect.bisect_left(samples, start_ms, key=_sample_millis)
    hi = bisect.bisect_right(samples, end_ms, lo=lo, key=_sample_millis)
    return [s for s in samples[lo:hi] if not math.isnan(s[1])]


def _sample_millis(sample: Sample) -> int:
    return round(sample[0] * 1000)


def to_millis(seconds: float) -> int:
    """Prometheus stores and compares time in integer milliseconds; so does the emulation
    (float seconds near 1.8e9 carry only ~0.2 us of resolution, enough to drift by 1e-7)."""
    return round(seconds * 1000)


def extrapolated_change(
    samples: Sequence[Sample],
    range_start: float,
    range_end: float,
    *,
    is_counter: bool,
    is_rate: bool,
    rules: PromQLRules = PROMETHEUS_3,
) -> float | None:
    """Prometheus's ``extrapolatedRate`` on already selected samples (see the module doc).

    Returns None when fewer than two samples are in range (Prometheus drops the series).
    """
    if len(samples) < 2:
        return None
    first_v = samples[0][1]
    last_v = samples[-1][1]
    first_ms, last_ms = to_millis(samples[0][0]), to_millis(samples[-1][0])
    start_ms, end_ms = to_millis(range_start), to_millis(range_end)
    delta = last_v - first_v
    if is_counter:
        previous = first_v
        for _, value in samples[1:]:
            if value < previous:
                delta += previous
            previous = value

    if last_ms <= first_ms:
        return None
    sampled = (last_ms - first_ms) / 1000
    avg_gap = sampled / (len(samples) - 1)
    threshold = avg_gap * EXTRAPOLATION_THRESHOLD_FACTOR
    to_start = (first_ms - start_ms) / 1000
    to_end = (end_ms - last_ms) / 1000

    def zero_cap(current: float) -> float:
        if is_counter and delta > 0 and first_v >= 0:
            return min(current, sampled * (first_v / delta))
        return current

    if rules.zero_cap_after_threshold:
        if to_start >= threshold:
            to_start = avg_gap / 2
        to_start = zero_cap(to_start)
    else:
        to_start = zero_cap(to_start)
        if to_start >= threshold:
            to_start = avg_gap / 2
    if to_end >= threshold:
        to_end = avg_gap / 2

    factor = (sampled + to_start + to_end) / sampled
    if is_rate:
        factor /= (end_ms - start_ms) / 1000
    return delta * factor


def increase(
    samples: Sequence[Sample], at: float, range_s: float, rules: PromQLRules = PROMETHEUS_3
) -> float | None:
    """``increase(counter[range_s])`` evaluated at ``at``; None when Prometheus gives nothing."""
    selected = select_range(samples, at, range_s, rules)
    start = (to_millis(at) - to_millis(range_s)) / 1000
    return extrapolated_change(selected, start, at, is_counter=True, is_rate=False, rules=rules)


def rate(
    samples: Sequence[Sample], at: float, range_s: float, rules: PromQLRules = PROMETHEUS_3
) -> float | None:
    """``rate(counter[range_s])`` evaluated at ``at``; None when Prometheus gives nothing."""
    selected = select_range(samples, at, range_s, rules)
    start = (to_millis(at) - to_millis(range_s)) / 1000
    return extrapolated_change(selected, start, at, is_counter=True, is_rate=True, rules=rules)


def delta(
    samples: Sequence[Sample], at: float, range_s: float, rules: PromQLRules = PROMETHEUS_3
) -> float | None:
    """``delta(gauge[range_s])``: last minus first sample, extrapolated to the window as
    ``increase`` is but with no counter resets and no zero cap; None when Prometheus gives nothing."""
    selected = select_range(samples, at, range_s, rules)
    start = (to_millis(at) - to_millis(range_s)) / 1000
    return extrapolated_change(selected, start, at, is_counter=False, is_rate=False, rules=rules)


def _over_time(
    samples: Sequence[Sample], at: float, range_s: float, rules: PromQLRules,
    reduce: Callable[[list[float]], float],
) -> float | None:
    """``reduce`` of the values in range; None when the range holds no sample."""
    values = [v for _, v in select_range(samples, at, range_s, rules)]
    return reduce(values) if values else None


def avg_over_time(
    samples: Sequence[Sample], at: float, range_s: float, rules: PromQLRules = PROMETHEUS_3
) -> float | None:
    """``avg_over_time(gauge[range_s])``: the plain mean of the samples in range."""
    return _over_time(samples, at, range_s, rules, lambda values: math.fsum(values) / len(values))


def sum_over_time(
    samples: Sequence[Sample], at: float, range_s: float, rules: PromQLRules = PROMETHEUS_3
) -> float | None:
    """``sum_over_time(gauge[range_s])``."""
    return _over_time(samples, at, range_s, rules, math.fsum)


def count_over_time(
    samples: Sequence[Sample], at: float, range_s: float, rules: PromQLRules = PROMETHEUS_3
) -> float | None:
    """``count_over_time(gauge[range_s])``: the samples in range."""
    return _over_time(samples, at, range_s, rules, lambda values: float(len(values)))


def max_over_time(
    samples: Sequence[Sample], at: float, range_s: float, rules: PromQLRules = PROMETHEUS_3
) -> float | None:
    """``max_over_time(gauge[range_s])``."""
    return _over_time(samples, at, range_s, rules, max)


RANGE_FUNCTIONS: dict[str, Callable[[Sequence[Sample], float, float, PromQLRules], float | None]] = {
    "increase": increase,
    "delta": delta,
    "avg_over_time": avg_over_time,
    "max_over_time": max_over_time,
    "sum_over_time": sum_over_time,
    "count_over_time": count_over_time,
}
"""The range-vector functions the emulation evaluates (``f(metric[window])``), by name."""


def instant_sample(
    samples: Sequence[Sample],
    at: float,
    rules: PromQLRules = PROMETHEUS_3,
    stale_at: float | None = None,
) -> Sample | None:
    """The sample an instant selector returns at ``at``, or None.

    ``stale_at`` is when Prometheus wrote a staleness marker for the series (its target or
    the series vanished from a scrape); after it the series is absent from instant queries.
    """
    at_ms = to_millis(at)
    index = bisect.bisect_right(samples, at_ms, key=_sample_millis) - 1
    if index < 0:
        return None
    t, value = samples[index]
    t_ms = to_millis(t)
    if t_ms <= at_ms - to_millis(rules.lookback_s) or math.isnan(value):
        return None
    if stale_at is not None and t_ms < to_millis(stale_at) <= at_ms:
        return None
    return (t, value)


def histogram_quantile(q: float, buckets: Iterable[Bucket]) -> float:
    """``histogram_quantile(q, ...)`` over classic cumulative buckets, NaN where Prometheus
    returns NaN (no observations, no ``+Inf`` bucket, fewer than two buckets)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(buckets, key=lambda b: b[0])
    if not ordered or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return math.nan

    merged: list[list[float]] = []
    for bound, count in ordered:
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])

    previous = merged[0][1]
    for entry in merged[1:]:
        current = entry[1]
        difference = abs(current - previous)
        if difference == 0:
            continue
        if current != 0 and difference / current <= PRECISION_TOLERANCE:
            entry[1] = previous
        else:
            previous = current
    running_max = merged[0][1]
    for entry in merged[1:]:
        if entry[1] > running_max:
            running_max = entry[1]
        elif entry[1] < running_max:
            entry[1] = running_max

    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    index = len(merged) - 1
    for i in range(len(merged) - 1):
        if merged[i][1] >= rank:
            index = i
            break
    if index == len(merged) - 1:
        return merged[-2][0]
    if index == 0 and merged[0][0] <= 0:
        return merged[0][0]
    bucket_start = 0.0
    bucket_end, count = merged[index]
    if index > 0:
        bucket_start = merged[index - 1][0]
        count -= merged[index - 1][1]
        rank -= merged[index - 1][1]
    return bucket_start + (bucket_end - bucket_start) * _float_div(rank, count)


def _float_div(numerator: float, denominator: float) -> float:
    """IEEE division as Go does it: x/0 is +-Inf, 0/0 is NaN (Python would raise)."""
    if denominator == 0:
        if numerator == 0 or math.isnan(numerator):
            return math.nan
        return math.copysign(math.inf, numerator)
    return numerator / denominator


def format_duration(seconds: float) -> str:
    """A PromQL duration literal: whole seconds as ``300s``, otherwise milliseconds."""
    if seconds <= 0 or not math.isfinite(seconds):
        raise ValueError(f"a PromQL range must be positive and finite, got {seconds!r}")
    millis = round(seconds * 1000)
    if millis % 1000 == 0:
        return f"{millis // 1000}s"
    return f"{millis}ms"
