"""How `validate` and `render` word what is wrong: every problem of a document at once, in
plain words (a duration says what a duration looks like), and as structure with -o json."""

from __future__ import annotations

import json

import pytest

from specdecode.cli import ExitCode, main
from specdecode.commands.api_commands import Problem

# Three problems in one document: a misspelt field, a wrong type, a duration in words.
THREE_PROBLEMS = (
    "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: three, namespace: team-a}\n"
    "spec:\n  model: {name: m}\n  speculation: {method: ngram, numSpeculativeToken: 3}\n  replicas: two\n"
    "  autotune: {evaluationInterval: 5 minutes}\n"
)


@pytest.fixture
def three(tmp_path):
    path = tmp_path / "three.yaml"
    path.write_text(THREE_PROBLEMS)
    return path


@pytest.mark.parametrize("verb", ["validate", "render"])
def test_every_problem_of_a_document_is_reported_at_once(three, capsys, verb):
    assert main([verb, "-f", str(three)]) == ExitCode.INVALID
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: {three}: spec.speculation.numSpeculativeToken: is not a field of this object; "
        "check the spelling against `kubectl explain sds.spec`",
        f"error: {three}: spec.replicas: must be a valid integer, unable to parse string as an integer",
        f"error: {three}: spec.autotune.evaluationInterval: '5 minutes' is not a duration: "
        "write a duration such as 30s, 5m, 1h30m or 250ms",
    ]
    assert "more problem" not in err


@pytest.mark.parametrize("value", ["5 minutes", "1d", "30", "-5s"])
def test_a_bad_duration_says_what_a_duration_looks_like_not_the_pattern(tmp_path, capsys, value):
    path = tmp_path / "sds.yaml"
    path.write_text(THREE_PROBLEMS.replace("numSpeculativeToken: 3", "numSpeculativeTokens: 3")
                    .replace("replicas: two", "replicas: 2").replace("5 minutes", f"'{value}'"))
    assert main(["validate", "-f", str(path)]) == ExitCode.INVALID
    err = capsys.readouterr().err
    assert err == (f"error: {path}: spec.autotune.evaluationInterval: {value!r} is not a duration: "
                   "write a duration such as 30s, 5m, 1h30m or 250ms\n")
    assert "^" not in err and "pattern" not in err


def test_validate_json_lists_every_problem_with_file_document_name_field_message_and_fix(tmp_path, three, capsys):
    other = tmp_path / "multi.yaml"
    other.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n---\n"
                     "apiVersion: serving.specdecode.io/v1alpha1\nkind: SpecDecodeService\nmetadata: {name: k}\n"
                     "spec: {model: {name: m}, speculation: {method: ngram, minK: 9}}\n")
    assert main(["validate", "-f", str(three), "-f", str(other), "-o", "json"]) == ExitCode.INVALID
    report = json.loads(capsys.readouterr().out)
    assert report["problems"] == [
        {"file": str(three), "document": 1, "kind": "SpecDecodeService", "namespace": "team-a", "name": "three",
         "field": "spec.speculation.numSpeculativeToken", "message": "is not a field of this object",
         "fix": "check the spelling against `kubectl explain sds.spec`"},
        {"file": str(three), "document": 1, "kind": "SpecDecodeService", "namespace": "team-a", "name": "three",
         "field": "spec.replicas", "message": "must be a valid integer, unable to parse string as an integer",
         "fix": None},
        {"file": str(three), "document": 1, "kind": "SpecDecodeService", "namespace": "team-a", "name": "three",
         "field": "spec.autotune.evaluationInterval", "message": "'5 minutes' is not a duration",
         "fix": "write a duration such as 30s, 5m, 1h30m or 250ms"},
        {"file": str(other), "document": 2, "kind": "SpecDecodeService", "namespace": None, "name": "k",
         "field": "spec.speculation", "message": "minK must not exceed maxK", "fix": "lower minK or raise maxK"},
    ]
    assert [len(d["problems"]) for d in report["documents"]] == [3, 1]


def test_validate_json_of_an_unreadable_file_is_structured_too(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"kind: caf\xe9\n")
    assert main(["validate", "-f", str(path), "-o", "json"]) == ExitCode.UNREADABLE
    (problem,) = json.loads(capsys.readouterr().out)["problems"]
    assert problem == {"file": str(path), "document": 0, "kind": None, "namespace": None, "name": None,
                       "field": None, "message": "not UTF-8: byte 0xe9 at line 1, column 10 (byte 9)",
                       "fix": "save the file as UTF-8"}


def test_render_json_prints_its_problems_as_json_on_stderr_and_nothing_on_stdout(three, capsys):
    assert main(["render", "-f", str(three), "-o", "json"]) == ExitCode.INVALID
    out, err = capsys.readouterr()
    assert out == ""
    report = json.loads(err)
    assert report["valid"] is False
    assert [p["field"] for p in report["problems"]] == [
        "spec.speculation.numSpeculativeToken", "spec.replicas", "spec.autotune.evaluationInterval"]


@pytest.mark.parametrize("text, field, message, fix", [
    ("spec.speculation: minK must not exceed maxK: lower minK or raise maxK",
     "spec.speculation", "minK must not exceed maxK", "lower minK or raise maxK"),
    ("spec.x: is not a field of this object; check the spelling", "spec.x", "is not a field of this object",
     "check the spelling"),
    ("spec.speculation.draftTensorParallelSize: vLLM 0.8.2 runs a draft only with TP (2): set it to 2 or leave it",
     "spec.speculation.draftTensorParallelSize", "vLLM 0.8.2 runs a draft only with TP (2)", "set it to 2 or leave it"),
    # No fix in the words: none is made up, and "key 'a': ..." is not taken for a fix.
    ("spec.pod.labels: key 'a': keys must be at most 63 characters", "spec.pod.labels",
     "key 'a': keys must be at most 63 characters", None),
    ("no SpecDecodeService among its 2 documents", None, "no SpecDecodeService among its 2 documents", None),
])
def test_a_message_splits_into_field_what_is_wrong_and_the_fix(text, field, message, fix):
    problem = Problem.of(text)
    assert (problem.field, problem.message, problem.fix) == (field, message, fix)
    assert str(problem) == text
