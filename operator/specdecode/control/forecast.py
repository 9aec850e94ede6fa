"""The load forecast the planner plans over, made from the service's own history.

The history is compact and bounded, so that it lives in status (`status.loadHistory`) and a
restarted operator has it: one request rate per ``BUCKET_S`` bucket (the long window's rate
at the first evaluation in that bucket; null where no evaluation saw the service), at most
``MAX_BUCKETS`` of them (a day and two hours at 10 minutes).

The forecast, in order of preference:

1. **Seasonal**: when the history varies (its highest bucket at least ``SEASONAL_SWING``
   times its lowest) and some lag of at least an hour repeats it (the mean squared log ratio
   of the buckets that overlap at that lag is within ``SEASONAL_MATCH``), the load ahead is
   what followed one period ago, scaled by how today's level compares with that period's
   (clamped to ``LEVEL_CLAMP``). Of the lags that match, the one with the longest overlap:
   a day where a day of history exists, the cycle of a compressed day otherwise. A flat
   stretch matches many lags; the longest overlap reads the most history.
2. **Trend**: otherwise the present continues, with a rise or fall of at least
   ``TREND_MIN`` between the trend window and the long window carried on for half an hour
   and then held (capped at ``TREND_CAP``). A smaller drift is noise.

Pure: time is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

BUCKET_S = 600.0
MAX_BUCKETS = 156
SEASONAL_SWING = 1.5
SEASONAL_MATCH = 0.03
SEASONAL_MIN_LAG = 6
"""Buckets (an hour): a shorter repetition is noise, not a cycle."""
SEASONAL_MIN_OVERLAP = 3
LEVEL_CLAMP = (0.67, 1.5)
TREND_MIN = 0.2
TREND_CAP = 0.5
TREND_S = 1800.0


@dataclass(frozen=True)
class LoadHistory:
    """Request rates per bucket from ``start`` (epoch seconds of bucket 0)."""

    start: float | None = None
    rates: tuple[float | None, ...] = ()

    def record(self, rate: float, now: float) -> "LoadHistory":
        """The history with ``rate`` as the value of now's bucket, if that bucket has none yet
        (older buckets are never rewritten; missing ones between stay null)."""
        if not math.isfinite(rate) or rate < 0:
            return self
        if self.start is None or not self.rates:
            return LoadHistory(math.floor(now / BUCKET_S) * BUCKET_S, (round(rate, 4),))
        index = int(math.floor((now - self.start) / BUCKET_S))
        if index < len(self.rates):
            return self
        rates = self.rates + (None,) * (index - len(self.rates)) + (round(rate, 4),)
        drop = max(0, len(rates) - MAX_BUCKETS)
        return LoadHistory(self.start + drop * BUCKET_S, rates[drop:])


@dataclass(frozen=True)
class Forecast:
    """Request rate per planning slot, and how it was made."""

    rates: tuple[float, ...]
    method: str
    """"seasonal", "trend" or "present"."""
    period_s: float | None = None
    """The repeating period a seasonal forecast follows."""

    @property
    def peak(self) -> float:
        return max(self.rates)


def seasonal_lag(rates: Sequence[float | None]) -> int | None:
    """The lag (buckets) that repeats the history best, None when none does or the history
    does not vary enough to tell a cycle from noise."""
    known = [r for r in rates if r is not None and r > 0]
    if len(known) < SEASONAL_MIN_LAG + SEASONAL_MIN_OVERLAP or max(known) < SEASONAL_SWING * min(known):
        return None
    n = len(rates)
    best: tuple[int, int] | None = None  # (overlap, -lag)
    for lag in range(SEASONAL_MIN_LAG, n - SEASONAL_MIN_OVERLAP + 1):
        pairs = [
            (a, b) for a, b in zip(rates[lag:], rates[:n - lag])
            if a is not None and b is not None and a > 0 and b > 0
        ]
        if len(pairs) < SEASONAL_MIN_OVERLAP:
            continue
        error = math.fsum(math.log(a / b) ** 2 for a, b in pairs) / len(pairs)
        if error <= SEASONAL_MATCH and (best is None or (len(pairs), -lag) > best):
            best = (len(pairs), -lag)
    return None if best is None else -best[1]


def forecast(
    history: LoadHistory, now: float, rate: float, trend_rate: float | None, slots: Sequence[float],
) -> Forecast:
    """The request rate of each slot (``slots``: durations from now on): seasonal when the
    history repeats, else the present with its trend (module docstring)."""
    offsets, at = [], 0.0
    for duration in slots:
        offsets.append((at, at + duration))
        at += duration
    rates = history.rates
    lag = seasonal_lag(rates) if history.start is not None else None
    if lag is not None:
        now_index = int(math.floor((now - history.start) / BUCKET_S))  # type: ignore[operator]
        then = _value(rates, now_index - lag)
        if then is not None and then > 0 and rate > 0:
            level = min(LEVEL_CLAMP[1], max(LEVEL_CLAMP[0], rate / then))
            out = []
            for lo, hi in offsets:
                buckets = range(int(lo // BUCKET_S), max(int(lo // BUCKET_S) + 1, int(math.ceil(hi / BUCKET_S))))
                seen = [_value(rates, now_index - lag + (b % lag)) for b in buckets]
                seen = [v for v in seen if v is not None]
                out.append(round(level * (math.fsum(seen) / len(seen) if seen else then), 4))
            # The present is measured, not forecast: the first slot carries at least the load
            # that is here (a calm the cycle promises has not come yet).
            out[0] = round(max(out[0], rate), 4)
            return Forecast(tuple(out), "seasonal", lag * BUCKET_S)
    if trend_rate is not None and trend_rate > 0 and rate > 0:
        rise = rate / trend_rate - 1.0
        if abs(rise) >= TREND_MIN:
            rise = max(-TREND_CAP, min(TREND_CAP, rise))
            out = []
            for lo, hi in offsets:
                mid = (lo + hi) / 2.0
                out.append(round(max(0.0, rate * (1.0 + rise * min(mid, TREND_S) / TREND_S)), 4))
            return Forecast(tuple(out), "trend")
    return Forecast(tuple(round(rate, 4) for _ in slots), "present")


def _value(rates: Sequence[float | None], index: int) -> float | None:
    return rates[index] if 0 <= index < len(rates) else None
