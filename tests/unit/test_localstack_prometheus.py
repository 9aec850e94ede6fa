"""Prometheus configuration for the local stack (pure part)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specdecode.localstack.prometheus import RESERVED_PORTS, free_port, render_config


def test_config_scrapes_the_file_sd_targets_at_the_interval() -> None:
    config = yaml.safe_load(render_config(Path("/tmp/sim/targets.json"), scrape_interval_s=1.5))
    assert config["global"]["scrape_interval"] == "1500ms"
    assert config["global"]["scrape_timeout"] == "1500ms"
    job = config["scrape_configs"][0]
    assert job["file_sd_configs"][0]["files"] == ["/tmp/sim/targets.json"]
    assert job["metrics_path"] == "/metrics"
    assert yaml.safe_load(render_config(Path("t.json"), 2))["global"]["scrape_interval"] == "2s"


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        render_config(Path("t.json"), scrape_interval_s=0)


def test_free_port_is_never_the_system_prometheus_port() -> None:
    assert all(free_port() not in RESERVED_PORTS for _ in range(20))
