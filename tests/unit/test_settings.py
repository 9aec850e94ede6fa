"""Operator settings from the environment and flags, with errors naming the variable."""

from __future__ import annotations

import pytest

from specdecode.shell import settings


def test_environment_then_flags():
    env = {"SPECDECODE_NAMESPACES": "a, b", "SPECDECODE_STANDALONE": "true", "SPECDECODE_RECONCILE_INTERVAL": "15"}
    got = settings.OperatorSettings.from_environment({"reconcile_interval": 5.0}, environ=env)
    assert got.namespaces == ["a", "b"] and got.standalone is True and got.reconcile_interval == 5.0


def test_bad_value_names_the_variable_and_the_flag(monkeypatch):
    monkeypatch.setenv("SPECDECODE_LOG_FORMAT", "xml")
    with pytest.raises(settings.SettingsError, match="SPECDECODE_LOG_FORMAT / --log-format"):
        settings.load()


def test_the_operator_rides_out_a_ten_minute_api_outage_by_default():
    from specdecode.shell.settings import OperatorSettings, api_retry_backoffs

    pauses = api_retry_backoffs(OperatorSettings().api_outage_tolerance)
    assert sum(pauses) >= 600
    assert pauses[0] <= 1 and max(pauses) <= 10


def test_failed_reconciles_are_retried_soon_then_less_often():
    from specdecode.shell.settings import retry_delay

    assert [retry_delay(r) for r in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_retried_failures_are_warnings_and_crashes_stay_errors():
    import logging

    from specdecode.commands.run import TemporaryFailuresAsWarnings

    def level(message: str) -> str:
        record = logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, message, None, None)
        TemporaryFailuresAsWarnings().filter(record)
        return record.levelname

    assert level("Handler 'sds_reconcile' failed temporarily: reconcile failed (503)") == "WARNING"
    assert level("Request attempt #3/35 failed; will retry: PATCH https://x -> ClientConnectorError()") == "WARNING"
    assert level("Request attempt #35/35 failed; escalating: PATCH https://x") == "ERROR"
    assert level("Handler 'sds_reconcile' failed with an exception and will try again in 60 seconds") == "ERROR"
