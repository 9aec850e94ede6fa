"""What `validate` and `render` read, as a user gives it: several files, folders, multi-document
files, standard input; and the files they refuse without a traceback (not UTF-8, a repeated
key), the Helm charts they skip, the pipe closed under them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from specdecode.cli import ExitCode, main

SERVICE = ("apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: %s, namespace: team-a}\n"
           "spec: {model: {name: m}, speculation: {method: ngram}}\n")
VERBS = ["validate", "render"]


def deployments(out: str) -> list[str]:
    return [d["metadata"]["name"] for d in yaml.safe_load_all(out) if d["kind"] == "Deployment"]


def test_render_of_two_files_renders_both(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text(SERVICE % "alpha")
    (tmp_path / "b.yaml").write_text(SERVICE % "beta")
    assert main(["render", "-f", str(tmp_path / "a.yaml"), "-f", str(tmp_path / "b.yaml")]) == ExitCode.OK
    assert deployments(capsys.readouterr().out) == ["alpha", "beta"]


def test_render_reads_folders_and_multi_document_files_as_validate_does(tmp_path, capsys):
    (tmp_path / "apps" / "team-b").mkdir(parents=True)
    (tmp_path / "apps" / "all.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n---\n"
                                                 + SERVICE % "one" + "---\n" + SERVICE % "two")
    (tmp_path / "apps" / "team-b" / "three.yml").write_text(SERVICE % "three")
    (tmp_path / "apps" / "kustomization.yaml").write_text("resources: [all.yaml]\n")
    assert main(["validate", "-f", str(tmp_path), "-o", "json"]) == ExitCode.OK
    validated = [d["name"] for d in json.loads(capsys.readouterr().out)["documents"]]
    assert main(["render", "-f", str(tmp_path)]) == ExitCode.OK
    assert deployments(capsys.readouterr().out) == validated == ["one", "two", "three"]


def test_render_with_one_invalid_service_prints_every_problem_and_no_objects(tmp_path, capsys):
    (tmp_path / "good.yaml").write_text(SERVICE % "good")
    (tmp_path / "bad.yaml").write_text((SERVICE % "bad").replace("method: ngram", "method: ngram, minK: 9"))
    assert main(["render", "-f", str(tmp_path / "good.yaml"), "-f", str(tmp_path / "bad.yaml")]) == ExitCode.INVALID
    out, err = capsys.readouterr()
    assert out == ""  # nothing half-applied through `| kubectl apply -f -`
    assert err.startswith(f"error: {tmp_path / 'bad.yaml'}: spec.speculation: minK must not exceed maxK")


def test_render_reads_standard_input():
    done = subprocess.run([sys.executable, "-m", "specdecode", "render", "-f", "-"], input=SERVICE % "piped",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and deployments(done.stdout) == ["piped"]


@pytest.mark.parametrize("verb", VERBS)
def test_a_file_that_is_not_utf8_names_the_byte_and_its_place(tmp_path, capsys, verb):
    path = tmp_path / "latin1.yaml"
    path.write_bytes((SERVICE % "caf\xe9").encode("latin-1"))
    assert main([verb, "-f", str(path)]) == ExitCode.UNREADABLE
    err = capsys.readouterr().err
    assert err == f"error: {path}: not UTF-8: byte 0xe9 at line 3, column 21 (byte 87); save the file as UTF-8\n"


def test_a_file_that_is_not_utf8_on_standard_input_prints_no_traceback():
    done = subprocess.run([sys.executable, "-m", "specdecode", "validate", "-f", "-"],
                          input=b"kind: \xff\n", capture_output=True, timeout=60)
    assert done.returncode == ExitCode.UNREADABLE
    assert done.stderr.decode() == "error: -: not UTF-8: byte 0xff at line 1, column 7 (byte 6); save the file as UTF-8\n"


def test_a_byte_order_mark_is_utf8(tmp_path, capsys):
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + (SERVICE % "bom").encode())
    assert main(["validate", "-f", str(path)]) == ExitCode.OK


@pytest.mark.parametrize("verb", VERBS)
def test_a_repeated_key_is_refused_with_the_key_and_both_lines(tmp_path, capsys, verb):
    path = tmp_path / "dup.yaml"
    path.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\n"
                    "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: d}\n"
                    "spec:\n  model: {name: m}\n  speculation:\n    method: ngram\n    maxK: 4\n    maxK: 6\n")
    assert main([verb, "-f", str(path)]) == ExitCode.UNREADABLE
    err = capsys.readouterr().err
    assert err == (f"error: {path}: not valid YAML at line 13, column 5: duplicate key 'maxK' (first at line 12); "
                   "keep one of them\n")


def test_yaml_merge_keys_are_not_repeated_keys(tmp_path, capsys):
    path = tmp_path / "merge.yaml"
    path.write_text("apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\n"
                    "metadata: {name: m, labels: &team {team: a}, annotations: {<<: *team, owner: b}}\n"
                    "spec: {model: {name: m}, speculation: {method: ngram}}\n")
    assert main(["validate", "-f", str(path)]) == ExitCode.OK, capsys.readouterr().err


def helm_gitops(tmp_path):
    """A GitOps folder with a service beside a Helm chart whose templates are not YAML."""
    chart = tmp_path / "platform" / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("replicas: 1\n")
    (chart / "templates" / "deployment.yaml").write_text("replicas: {{ .Values.replicas }}\n{{- if .Values.x }}\n")
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "svc.yaml").write_text(SERVICE % "beside-the-chart")
    return chart


@pytest.mark.parametrize("verb", VERBS)
def test_a_helm_chart_in_a_gitops_folder_is_skipped_and_said(tmp_path, capsys, verb):
    chart = helm_gitops(tmp_path)
    assert main([verb, "-f", str(tmp_path)]) == ExitCode.OK
    out, err = capsys.readouterr()
    assert err.startswith(f"{chart}: skipped: a Helm chart") and "error" not in err
    assert "beside-the-chart" in out


def test_validate_json_lists_the_skipped_charts(tmp_path, capsys):
    chart = helm_gitops(tmp_path)
    assert main(["validate", "-f", str(tmp_path), "-o", "json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["skippedCharts"] == [str(chart)]


def test_a_folder_holding_only_a_chart_says_the_chart_was_skipped(tmp_path, capsys):
    chart = helm_gitops(tmp_path)
    (tmp_path / "apps" / "svc.yaml").unlink()
    assert main(["validate", "-f", str(tmp_path)]) == ExitCode.INVALID
    assert f"no SpecDecodeService found (Helm charts skipped: {chart})" in capsys.readouterr().err


@pytest.mark.parametrize("output, unbuffered", [("yaml", False), ("json", True)])
def test_a_closed_pipe_ends_render_quietly(tmp_path, output, unbuffered):
    """`specdecode render -f many.yaml | head -1`: the reader leaves after one line, long before
    the ~1 MB stream (more than a pipe holds) is written; with buffered and unbuffered stdout."""
    path = tmp_path / "many.yaml"
    path.write_text("---\n".join(SERVICE % f"s{i}" for i in range(250)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | ({"PYTHONUNBUFFERED": "1"} if unbuffered else {})
    proc = subprocess.Popen([sys.executable, "-m", "specdecode", "render", "-f", str(path), "-o", output],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout.readline() in (b"apiVersion: apps/v1\n", b"{\n")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == ExitCode.BROKEN_PIPE
    assert err == ""
