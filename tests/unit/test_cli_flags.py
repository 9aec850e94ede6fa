"""One spelling per flag across commands (old spellings kept as hidden aliases for one
release), `specdecode --version`, and exit codes that say what went wrong."""

from __future__ import annotations

import argparse
import importlib.metadata
import json

import pytest

from specdecode import cli, constants
from specdecode.cli import ExitCode, main

from .conftest import REPO

SAMPLE = str(REPO / "manifests" / "samples" / "llama-3.1-8b-draft-model.yaml")


def every_parser():
    """(command words, parser) for `specdecode` and every subcommand below it."""
    cli._import_commands()
    todo = [((), cli._build_parser())]
    while todo:
        words, parser = todo.pop()
        yield words, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [((*words, name), sub) for name, sub in action.choices.items()]


def visible_flags(parser) -> set[str]:
    return {flag for a in parser._actions if a.help != argparse.SUPPRESS for flag in a.option_strings}


def test_every_command_spells_output_format_and_cluster_name_one_way():
    parsers = dict(every_parser())
    for words, parser in parsers.items():
        flags = visible_flags(parser)
        assert "--json" not in flags and "--name" not in flags, words
    with_output = {w for w, p in parsers.items() if "--output" in visible_flags(p)}
    assert {("validate",), ("render",), ("bench", "policy"), ("bench", "fleet"), ("bench", "faults"),
            ("cluster", "status")} <= with_output
    with_cluster_name = {w for w, p in parsers.items() if "--cluster-name" in visible_flags(p)}
    assert {("demo",), ("bench", "fleet"), ("bench", "faults"), ("cluster", "up"), ("cluster", "down"),
            ("cluster", "status"), ("cluster", "env"), ("cluster", "kubectl")} <= with_cluster_name


@pytest.mark.parametrize("words", [("bench", "policy"), ("bench", "fleet"), ("bench", "faults"), ("validate",)])
def test_the_old_json_flag_still_works_and_says_it_is_deprecated(capsys, words):
    parser = dict(every_parser())[words]
    assert parser.parse_args(["--json"] + (["-f", "x"] if words == ("validate",) else [])).output == "json"
    assert parser.parse_args(["-f", "x"] if words == ("validate",) else []).output == "text"
    assert capsys.readouterr().err == "specdecode: --json is deprecated and goes in the next release; use -o json\n"


def test_cluster_status_old_and_new_spellings_agree(tmp_path, capsys):
    state = str(tmp_path / "state")
    assert main(["cluster", "status", "--cluster-name", "nothing", "--state-dir", state, "-o", "json"]) == ExitCode.NOT_RUNNING
    new = capsys.readouterr()
    assert main(["cluster", "status", "--name", "nothing", "--state-dir", state, "--json"]) == ExitCode.NOT_RUNNING
    old = capsys.readouterr()
    assert json.loads(old.out) == json.loads(new.out) and json.loads(new.out)["name"] == "nothing"
    assert new.err == ""
    assert old.err.splitlines() == [
        "specdecode: --name is deprecated and goes in the next release; use --cluster-name",
        "specdecode: --json is deprecated and goes in the next release; use -o json",
    ]


def test_version_prints_the_package_and_the_default_vllm_release(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == (f"specdecode {importlib.metadata.version('specdecode-operator')} "
                                       f"(renders for vLLM {constants.DEFAULT_VLLM_VERSION} by default)\n")


def test_help_documents_every_exit_code(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    table = out[out.index("exit codes:"):].splitlines()[1:]
    documented = [int(line.split()[0]) for line in table if line.strip() and line.split()[0].isdigit()]
    assert documented == [int(code) for code in ExitCode]


def test_each_kind_of_failure_has_its_own_exit_code(tmp_path, capsys):
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text((REPO / "manifests" / "samples" / "llama-3.1-8b-draft-model.yaml").read_text()
                       .replace("SpecDecodeService\n", "SpecDecodeService\nbogus: 1\n", 1))
    with pytest.raises(SystemExit) as usage:
        main(["validate", "-f", SAMPLE, "--no-such-flag"])
    codes = {
        "ok": main(["validate", "-f", SAMPLE]),
        "usage": usage.value.code,
        "flag value": main(["validate", "-f", SAMPLE, "--vllm-version", "nightly"]),
        "invalid": main(["validate", "-f", str(invalid)]),
        "missing": main(["validate", "-f", str(tmp_path / "missing.yaml")]),
    }
    assert codes == {"ok": 0, "usage": 2, "flag value": 2, "invalid": 4, "missing": 5}
