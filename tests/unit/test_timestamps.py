"""The one RFC 3339 helper: what status, Events, history and the API server's stamps use."""

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdecode import timestamps


@given(st.integers(min_value=0, max_value=4_102_444_800))
def test_epoch_round_trip_at_second_precision(seconds):
    assert timestamps.epoch_seconds(timestamps.rfc3339(float(seconds))) == seconds


def test_datetimes_of_any_zone_are_written_in_utc():
    moment = datetime(2026, 12, 1, 9, 30, 5, tzinfo=timezone(timedelta(hours=2)))
    assert timestamps.rfc3339(moment) == "2026-12-01T07:30:05Z"


def test_the_api_servers_fractional_and_offset_forms_parse():
    assert timestamps.parse_rfc3339("2026-12-01T07:30:05.123456Z").microsecond == 123456
    assert timestamps.rfc3339(timestamps.parse_rfc3339("2026-12-01T08:30:05+01:00")) == "2026-12-01T07:30:05Z"


def test_malformed_stamps_raise_or_read_as_absent_where_input_is_foreign():
    with pytest.raises(ValueError):
        timestamps.parse_rfc3339("yesterday")
    assert timestamps.parse_optional("yesterday") is None
    assert timestamps.parse_optional(None) is None
    naive = datetime(2026, 12, 1, 7, 0, 0)
    assert timestamps.parse_optional(naive).tzinfo is timezone.utc
