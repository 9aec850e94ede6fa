"""The CLI as a user meets it: exit codes, one-line messages, output ready for kubectl."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from specdecode.cli import ExitCode, main

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
    assert main(["render", "-f", DRAFT_SAMPLE, "--k", "12"]) == ExitCode.USAGE
    assert "--k 12: must lie within" in capsys.readouterr().err


def test_validate_accepts_a_sample(capsys):
    assert main(["validate", "-f", DRAFT_SAMPLE]) == 0
    assert "is valid" in capsys.readouterr().out


BROKEN_FILES = {  # text, words the one line says, exit code
    "not-yaml": ("spec: [unclosed", "not valid YAML at line", ExitCode.UNREADABLE),
    "wrong-kind": ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n", "kind: expected SpecDecodeService", ExitCode.INVALID),
    "unknown-field": (
        "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: x}\n"
        "spec: {model: {name: m}, speculation: {method: ngram, numSpeculativeToken: 3}}\n",
        "spec.speculation.numSpeculativeToken: is not a field", ExitCode.INVALID,
    ),
    "missing-field": (
        "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: x}\nspec: {model: {name: m}}\n",
        "spec.speculation: is required", ExitCode.INVALID,
    ),
    "wrong-type": (
        "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: x}\n"
        "spec: {model: {name: m}, speculation: {method: ngram}, replicas: two}\n",
        "spec.replicas: must be a valid integer", ExitCode.INVALID,
    ),
    "rule-broken": (
        "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: x}\n"
        "spec: {model: {name: m}, speculation: {method: eagle3}}\n",
        "spec.speculation: draftModel is required", ExitCode.INVALID,
    ),
    "empty": ("", "no YAML document found", ExitCode.INVALID),
}


@pytest.mark.parametrize("case", sorted(BROKEN_FILES))
@pytest.mark.parametrize("verb", ["validate", "render"])
def test_broken_files_exit_invalid_or_unreadable_with_one_line_naming_the_field(tmp_path, capsys, case, verb):
    text, words, code = BROKEN_FILES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    assert main([verb, "-f", str(path)]) == code
    err = capsys.readouterr().err
    assert words in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("verb", ["validate", "render"])
def test_a_missing_file_is_unreadable_input(capsys, verb):
    assert main([verb, "-f", "/nonexistent/sds.yaml"]) == ExitCode.UNREADABLE
    assert "cannot read the file" in capsys.readouterr().err


def test_console_script_reads_standard_input_and_never_prints_a_traceback():
    bad = "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: x}\nspec: {model: {name: m}, speculation: {method: ngram, minK: 9}}\n"
    done = subprocess.run(
        [sys.executable, "-m", "specdecode.cli", "validate", "-f", "-"], input=bad, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == ExitCode.INVALID
    assert done.stderr.startswith("error: -: spec.speculation:") and "Traceback" not in done.stderr


VALID_NGRAM = ("apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: %s, namespace: team-a}\n"
               "spec: {model: {name: m}, speculation: {method: ngram}}\n")
BROKEN_NGRAM = ("apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: %s}\n"
                "spec: {model: {name: m}, speculation: {method: ngram, minK: 9}}\n")


def gitops_folder(tmp_path):
    """A GitOps folder: a multi-document file with a Namespace and two services (the second
    broken), a nested file with a broken service, a kustomization (skipped), a hidden dir."""
    (tmp_path / "apps" / "team-b").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    (tmp_path / "apps" / "services.yaml").write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n---\n"
        + VALID_NGRAM % "good" + "---\n" + BROKEN_NGRAM % "bad-one")
    (tmp_path / "apps" / "team-b" / "svc.yml").write_text(BROKEN_NGRAM % "bad-two")
    (tmp_path / "apps" / "kustomization.yaml").write_text("resources: [services.yaml]\n")
    (tmp_path / ".git" / "junk.yaml").write_text("spec: [unclosed")
    return tmp_path


def test_validate_reports_every_error_of_a_folder_with_file_and_document(tmp_path, capsys):
    folder = gitops_folder(tmp_path)
    assert main(["validate", "-f", str(folder)]) == ExitCode.INVALID
    out, err = capsys.readouterr()
    services = folder / "apps" / "services.yaml"
    assert f"{services}: document 2: SpecDecodeService team-a/good is valid" in out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, err
    assert errors[0].startswith(f"error: {services}: document 3: spec.speculation")
    # A file with one document needs no index.
    assert errors[1].startswith(f"error: {folder / 'apps' / 'team-b' / 'svc.yml'}: spec.speculation")
    assert "1 valid, 2 invalid" in err and "Traceback" not in err


def test_validate_json_lists_every_document(tmp_path, capsys):
    folder = gitops_folder(tmp_path)
    assert main(["validate", "-f", str(folder), "-o", "json"]) == ExitCode.INVALID
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False and report["errors"] == 2
    assert [(d["name"], d["document"], d["valid"]) for d in report["documents"]] == [
        ("good", 2, True), ("bad-one", 3, False), ("bad-two", 1, False)]
    assert all(d["error"].startswith("spec.speculation") for d in report["documents"] if not d["valid"])


def test_validate_all_samples_as_a_directory_with_json(capsys):
    assert main(["validate", "-f", str(REPO / "manifests" / "samples"), "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True and len(report["documents"]) >= 4


@pytest.mark.parametrize("verb", ["validate", "render"])
def test_unknown_vllm_version_is_refused_with_the_known_ones(capsys, verb):
    assert main([verb, "-f", DRAFT_SAMPLE, "--vllm-version", "0.34.0"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: --vllm-version 0.34.0: unknown vLLM version; known: 0.8.2, ")
    assert "0.33.0" in err and err.count("\n") == 1


@pytest.mark.parametrize("version", ["0.33.O", "nightly", "0.13.0", "1.0.0"])
def test_typos_non_releases_and_unread_releases_are_refused(capsys, version):
    assert main(["validate", "-f", DRAFT_SAMPLE, "--vllm-version", version]) == ExitCode.USAGE
    assert f"--vllm-version {version}: unknown vLLM version" in capsys.readouterr().err


@pytest.mark.parametrize("version", ["0.33.0", "0.33.1", "v0.24.0", "0.7.3"])
def test_known_vllm_versions_and_their_patches_are_accepted(capsys, version):
    assert main(["validate", "-f", DRAFT_SAMPLE, "--vllm-version", version]) == 0


def test_validate_with_an_old_vllm_version_names_what_it_cannot_run(tmp_path, capsys):
    path = tmp_path / "eagle3.yaml"
    path.write_text((REPO / "manifests" / "samples" / "llama-3.1-8b-eagle3.yaml").read_text())
    assert main(["validate", "-f", str(path), "--vllm-version", "0.8.2"]) == ExitCode.INVALID
    assert "vLLM 0.8.2" in capsys.readouterr().err


def test_cluster_env_exports_the_kubeconfig_and_puts_the_stack_first_on_path():
    from specdecode.commands.cluster import env_exports

    lines = env_exports("/state/my cluster/kubeconfig", ["/cache/kubernetes-v1.34.4/bin", "/cache/helm-v3.19.5/bin",
                                                       "/cache/kubernetes-v1.34.4/bin"])
    assert lines == ["export KUBECONFIG='/state/my cluster/kubeconfig'",
                     'export PATH=/cache/kubernetes-v1.34.4/bin:/cache/helm-v3.19.5/bin:"$PATH"']
    done = subprocess.run(["bash", "-c", "\n".join(lines) + '\necho "$KUBECONFIG|${PATH%%:*}"'],
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "/state/my cluster/kubeconfig|/cache/kubernetes-v1.34.4/bin"


def test_cluster_env_of_a_cluster_that_is_not_up_says_how_to_start_it(capsys, tmp_path):
    assert main(["cluster", "env", "--cluster-name", "nothing-here", "--state-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "specdecode cluster" in err and err.count("\n") == 1


def test_readme_shows_the_test_command_ci_runs_and_the_venv_set_up():
    """.ci/run's last line is the README's test command, verbatim; the set-up commands use
    the virtual environment .ci/install creates (never the system Python)."""
    readme = (REPO / "README.md").read_text()
    ci_run = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci_run[-1].startswith(".venv/bin/python -m pytest")
    assert f"```sh\n{ci_run[-1]}\n```" in readme
    assert "bash .ci/install && .venv/bin/specdecode demo" in readme
    install = (REPO / ".ci" / "install").read_text()
    assert "-m venv .venv" in install and ".venv/bin/python -m pip install" in install
    assert "python3 -m pip" not in install
