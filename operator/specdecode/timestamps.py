"""RFC 3339 time stamps: the one place the operator formats and parses them.

Kubernetes status and Event times are UTC with second precision (``2026-12-01T07:00:00Z``);
the API server and other writers may add fractions or an offset, so parsing accepts any
RFC 3339 form and always returns an aware datetime.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def rfc3339(moment: datetime | float) -> str:
    """UTC, second precision; ``moment`` is an aware datetime or seconds since the epoch."""
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, tz=timezone.utc)
    elif moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime(_FORMAT)


def parse_rfc3339(text: str) -> datetime:
    """An aware datetime; raises ValueError when ``text`` is not RFC 3339."""
    moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def epoch_seconds(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time stamp (raises ValueError when malformed)."""
    return parse_rfc3339(text).timestamp()


def epoch_seconds_or_none(text: Optional[str]) -> Optional[float]:
    """`epoch_seconds` of a status field that may be unset (None or empty)."""
    return epoch_seconds(text) if text else None


def parse_optional(value: Any) -> Optional[datetime]:
    """What the API returns, leniently: a string, a datetime (the typed client) or None.
    None when absent or malformed, for inputs the operator does not control."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    try:
        return parse_rfc3339(str(value))
    except ValueError:
        return None
