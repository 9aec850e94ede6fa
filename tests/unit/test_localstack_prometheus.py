"""Prometheus configuration for the local stack (pure part)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specdecode.tools.localstack.prometheus import RESERVED_PORTS, free_port, render_config


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


def test_colon_names_relabel_the_escaped_names_back_and_promtool_accepts_it(tmp_path) -> None:
    import shutil
    import subprocess

    from specdecode.tools.localstack.prometheus import VLLM_NAMES_COLON

    assert "metric_relabel_configs" not in render_config(Path("t.json"), 1)
    text = render_config(tmp_path / "t.json", 1, vllm_names=VLLM_NAMES_COLON)
    (rule,) = yaml.safe_load(text)["scrape_configs"][0]["metric_relabel_configs"]
    assert rule == {"source_labels": ["__name__"], "regex": "vllm_(.+)", "target_label": "__name__",
                    "replacement": "vllm:$1"}
    with pytest.raises(ValueError, match="vllm_names must be one of"):
        render_config(Path("t.json"), 1, vllm_names="colons")
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    (tmp_path / "t.json").write_text("[]")
    (tmp_path / "p.yml").write_text(text)
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "p.yml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
