"""The release workflow (.github/workflows/release.yaml) publishes what the chart installs:
its image is values.yaml's image.repository, built from the operator's Dockerfile; its chart is
this chart, pushed where the chart's README installs it from, versioned by the tag; and it
packages with the Helm the chart is tested with. A cheap consistency check, not a run."""

from __future__ import annotations

import re
import tomllib

import yaml

from .test_chart import CHART, REPO, helm

WORKFLOWS = REPO / ".github" / "workflows"


def workflow(name: str) -> dict:
    loaded = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    loaded["on"] = loaded.pop(True, loaded.get("on"))
    return loaded


def steps() -> list[dict]:
    (job,) = workflow("release.yaml")["jobs"].values()
    return job["steps"]


def step_using(action: str) -> dict:
    (found,) = [s for s in steps() if s.get("uses", "").startswith(action + "@")]
    return found


def run_text() -> str:
    return "\n".join(s.get("run", "") for s in steps())


def test_it_runs_on_version_tags_only():
    assert workflow("release.yaml")["on"] == {"push": {"tags": ["v*"]}}


def test_the_image_it_pushes_is_the_charts_default_image():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    env = workflow("release.yaml")["env"]
    assert env["IMAGE"] == values["image"]["repository"] == "ghcr.io/specdecode/specdecode-operator"
    build = step_using("docker/build-push-action")["with"]
    assert (REPO / build["file"]).is_file() and build["file"] == "images/operator/Dockerfile"
    assert build["context"] == "." and build["push"] is True
    # Tagged with the bare version: the chart's default tag is its appVersion, which the
    # package step sets to the same version.
    assert "type=semver,pattern={{version}}" in step_using("docker/metadata-action")["with"]["tags"]
    assert step_using("docker/metadata-action")["with"]["images"] == "${{ env.IMAGE }}"
    (job,) = workflow("release.yaml")["jobs"].values()
    assert job["permissions"]["packages"] == "write"


def test_the_chart_it_pushes_is_this_chart_where_the_readme_installs_it_from():
    env = workflow("release.yaml")["env"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (REPO / env["CHART"]).resolve() == CHART.resolve()
    assert env["CHART_REPOSITORY"] == "oci://ghcr.io/specdecode/charts"
    text = run_text()
    assert re.search(r'helm package "\$CHART" --version "\$\{\{ steps\.version\.outputs\.version \}\}" \\\s*'
                     r'--app-version "\$\{\{ steps\.version\.outputs\.version \}\}"', text), text
    assert f'helm push "dist/{chart["name"]}-${{{{ steps.version.outputs.version }}}}.tgz" "$CHART_REPOSITORY"' in text
    readme = (CHART / "README.md").read_text()
    assert f'{env["CHART_REPOSITORY"]}/{chart["name"]}' in readme


def test_the_tag_must_be_the_packages_version():
    text = run_text()
    assert 'version="${GITHUB_REF_NAME#v}"' in text and "pyproject.toml" in text
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]  # what an unreleased chart defaults to


def test_it_packages_with_the_helm_the_chart_is_tested_with():
    tested = helm("version", "--template", "{{.Version}}").stdout.strip()
    assert workflow("release.yaml")["env"]["HELM_VERSION"] == tested
    assert step_using("azure/setup-helm")["with"]["version"] == "${{ env.HELM_VERSION }}"
    (lint,) = workflow("chart.yaml")["jobs"].values()
    assert [s["with"]["version"] for s in lint["steps"] if s.get("uses", "").startswith("azure/setup-helm@")] == [tested]


def test_every_action_is_pinned_to_a_major_version_at_least():
    for name in ("release.yaml", "chart.yaml"):
        for job in workflow(name)["jobs"].values():
            for step in job["steps"]:
                if "uses" in step:
                    assert re.fullmatch(r"[\w.-]+/[\w.-]+@(v\d+(\.\d+)*|[0-9a-f]{40})", step["uses"]), step["uses"]
