"""What `pip install specdecode-operator` brings: the runtime's dependencies stay light."""

from __future__ import annotations

import importlib.metadata
import tomllib

from packaging.requirements import Requirement

from .conftest import REPO


def _dependency(name: str) -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found = [Requirement(line) for line in project["dependencies"] if Requirement(line).name == name]
    assert len(found) == 1, f"{name} is declared {len(found)} times"
    return found[0]


def test_prometheus_api_client_floor_is_the_release_without_pandas_and_matplotlib():
    specifier = _dependency("prometheus-api-client").specifier
    assert not specifier.contains("0.6.0") and not specifier.contains("0.5.5")
    assert specifier.contains("0.7.0")


def test_the_installed_prometheus_api_client_pulls_no_dataframe_or_plotting_packages():
    installed = importlib.metadata.version("prometheus-api-client")
    assert _dependency("prometheus-api-client").specifier.contains(installed)
    unconditional = [Requirement(r).name for r in importlib.metadata.requires("prometheus-api-client") or []
                     if Requirement(r).marker is None]
    assert not {"pandas", "matplotlib", "numpy"} & set(unconditional), unconditional
