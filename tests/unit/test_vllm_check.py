"""`specdecode validate --vllm`: the installed vLLM's own checks on what the renderer runs.

The checks themselves run vLLM's code, so the tests that exercise them need vLLM installed
(`pip install 'specdecode-operator[vllm]'`); without it they skip, and what remains checks
the command's behaviour where vLLM is missing.
"""

from __future__ import annotations

import importlib.util

import pytest

from specdecode import api
from specdecode.render import workload as render, vllm_check
from specdecode.cli import ExitCode, main

from .conftest import service_doc

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'specdecode-operator[vllm]')")

SERVICE = """\
apiVersion: serving.specdecode.io/v1alpha1
kind: SpecDecodeService
metadata: {name: coder, namespace: team-a}
spec:
  model: {name: Qwen/Qwen2.5-Coder-7B-Instruct}
  speculation: {method: %(method)s, numSpeculativeTokens: 3, minK: 2, maxK: 4%(extra)s}
  engine: {version: "%(version)s"%(engine)s}
"""


def write(tmp_path, method="ngram", extra="", version="0.33.0", engine=""):
    path = tmp_path / "sds.yaml"
    path.write_text(SERVICE % {"method": method, "extra": extra, "version": version, "engine": engine})
    return str(path)


def test_every_config_the_operator_may_render_is_checked():
    spec = api.parse_service(service_doc({"model": {"name": "m"}, "speculation": {"method": "ngram", "minK": 2, "maxK": 4}})).spec
    labels = [c.describe("ngram") for c in vllm_check.configs_to_check(spec)]
    assert labels == ["off", "ngram K=2", "ngram K=3", "ngram K=4"]


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_without_vllm_the_command_says_how_to_get_it(tmp_path, capsys):
    assert main(["validate", "-f", write(tmp_path), "--vllm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: vLLM is not installed") and "specdecode-operator[vllm]" in err
    assert "Traceback" not in err
    # Without --vllm nothing needs vLLM.
    assert main(["validate", "-f", write(tmp_path)]) == 0


@needs_vllm
def test_vllm_accepts_what_the_renderer_runs_for_its_own_release(tmp_path, capsys):
    table = ", perBatchSizeK: [{minBatchSize: 1, maxBatchSize: 8, k: 4}, {minBatchSize: 9, maxBatchSize: 256, k: 0}]"
    version = vllm_check.installed_version()
    assert main(["validate", "-f", write(tmp_path, extra=table, version=version), "--vllm"]) == 0
    assert "accepts all 4 configs the operator may render" in capsys.readouterr().out


@needs_vllm
def test_vllm_refuses_what_its_parser_does_not_know(tmp_path, capsys):
    path = write(tmp_path, engine=', extraArgs: ["--max-num-seqz", "8"]')
    assert main(["validate", "-f", path, "--vllm"]) == ExitCode.INVALID
    err = capsys.readouterr().err
    assert "refused: off: vllm serve argument parser: " in err and "--max-num-seqz" in err


@needs_vllm
def test_a_key_the_installed_vllm_does_not_have_is_refused():
    spec = api.parse_service(service_doc({"model": {"name": "m"}, "speculation": {"method": "ngram"}})).spec
    args = render.vllm_args(spec, render.SpeculationChoice(k=3))
    at = args.index("--speculative-config") + 1
    args[at] = args[at][:-1] + ',"num_speculative_tokenz":2}'
    findings = vllm_check._Checker().check("K=3", args)
    assert [f.kind for f in findings] == [vllm_check.REFUSED]
    assert findings[0].message.startswith("num_speculative_tokenz: not a field of vLLM's SpeculativeConfig")


@needs_vllm
def test_a_table_vllm_would_drop_is_reported_as_ignored():
    # The renderer refuses this itself (data parallelism from extraArgs); vLLM's own check
    # must agree on the arguments it would get.
    spec = api.parse_service(service_doc({
        "model": {"name": "m"},
        "speculation": {"method": "ngram", "numSpeculativeTokens": 3,
                        "perBatchSizeK": [{"minBatchSize": 1, "maxBatchSize": 8, "k": 3}]},
    })).spec
    args = render.vllm_args(spec, render.SpeculationChoice(k=3)) + ["--data-parallel-size", "2"]
    findings = vllm_check._Checker().check("K=3", args)
    assert [f.kind for f in findings] == [vllm_check.IGNORED]
    assert "data parallel" in findings[0].message
