"""Operator settings from the environment and flags, with errors naming the variable."""

from __future__ import annotations

import pytest

from specdecode import settings


def test_environment_then_flags():
    env = {"SPECDECODE_NAMESPACES": "a, b", "SPECDECODE_STANDALONE": "true", "SPECDECODE_RECONCILE_INTERVAL": "15"}
    got = settings.OperatorSettings.from_environment({"reconcile_interval": 5.0}, environ=env)
    assert got.namespaces == ["a", "b"] and got.standalone is True and got.reconcile_interval == 5.0


def test_bad_value_names_the_variable_and_the_flag(monkeypatch):
    monkeypatch.setenv("SPECDECODE_LOG_FORMAT", "xml")
    with pytest.raises(settings.SettingsError, match="SPECDECODE_LOG_FORMAT / --log-format"):
        settings.load()
