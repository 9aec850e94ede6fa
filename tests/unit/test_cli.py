"""The CLI as a user meets it: exit codes, one-line messages, output ready for kubectl."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from specdecode.cli import main

from .conftest import REPO

DRAFT_SAMPLE = str(REPO / "manifests" / "samples" / "llama-3.1-8b-draft-model.yaml")


def test_crd_command_prints_the_committed_crd(capsys):
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == (REPO / "crds" / "specdecodeservices.yaml").read_text()


def test_render_prints_a_stream_for_kubectl_apply(capsys):
    assert main(["render", "-f", DRAFT_SAMPLE]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == ["Deployment", "Service", "PodDisruptionBudget", "PodMonitor"]


def test_render_json_is_a_list(capsys):
    assert main(["render", "-f", DRAFT_SAMPLE, "-o", "json", "--off"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "List" and len(doc["items"]) == 4


def test_render_k_outside_the_bounds_is_refused(capsys):
    assert main(["render", "-f", DRAFT_SAMPLE, "--k", "12"]) == 2
    assert "--k 12: must lie within" in capsys.readouterr().err


def test_validate_accepts_a_sample(capsys):
    assert main(["validate", "-f", DRAFT_SAMPLE]) == 0
    assert "is valid" in capsys.readouterr().out


BROKEN_FILES = {
    "not-yaml": ("spec: [unclosed", "not valid YAML at line"),
    "wrong-kind": ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n", "kind: expected SpecDecodeService"),
    "unknown-field": (
        "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: x}\n"
        "spec: {model: {name: m}, speculation: {method: ngram, numSpeculativeToken: 3}}\n",
        "spec.speculation.numSpeculativeToken: is not a field",
    ),
    "missing-field": (
        "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: x}\nspec: {model: {name: m}}\n",
        "spec.speculation: is required",
    ),
    "wrong-type": (
        "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: x}\n"
        "spec: {model: {name: m}, speculation: {method: ngram}, replicas: two}\n",
        "spec.replicas: must be a valid integer",
    ),
    "rule-broken": (
        "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: x}\n"
        "spec: {model: {name: m}, speculation: {method: eagle3}}\n",
        "spec.speculation: draftModel is required",
    ),
    "empty": ("", "no YAML document found"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_FILES))
@pytest.mark.parametrize("verb", ["validate", "render"])
def test_broken_files_exit_2_with_one_line_naming_the_field(tmp_path, capsys, case, verb):
    text, words = BROKEN_FILES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    assert main([verb, "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert words in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_file_is_a_user_error(capsys):
    assert main(["validate", "-f", "/nonexistent/sds.yaml"]) == 2
    assert "cannot read the file" in capsys.readouterr().err


def test_console_script_reads_standard_input_and_never_prints_a_traceback():
    bad = "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: x}\nspec: {model: {name: m}, speculation: {method: ngram, minK: 9}}\n"
    done = subprocess.run(
        [sys.executable, "-m", "specdecode.cli", "validate", "-f", "-"], input=bad, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: -: spec.speculation:") and "Traceback" not in done.stderr
