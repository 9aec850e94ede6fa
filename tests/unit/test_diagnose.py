"""`specdecode diagnose`: a pasted log in, the cause, the line and the fix out; exit codes."""

from __future__ import annotations

import re
import subprocess
import sys

from specdecode.render import features as vs
from specdecode.cli import ExitCode, main

VOCAB_LOG = (
    "(APIServer pid=1) INFO 11-30 12:00:01 [api_server.py:1896] vLLM API server version 0.33.0\n"
    "(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n"
    "(APIServer pid=1)   Value error, Target and draft model should have the same vocabulary size. "
    "Target model vocab_size=152064. Draft model vocab_size=151936. Using models with different tokenizers "
    "can cause out-of-bounds errors during speculative decoding. [type=value_error, input_value=ArgsKwargs((), "
    "{'model': 'Qwen/Qwen2.5-0.5B-Instruct'}), input_type=ArgsKwargs]\n"
)

OOM_LOG = (
    "(EngineCore_DP0 pid=243) ERROR 11-30 12:00:07 [core.py:1584] EngineCore failed to start.\n"
    "(EngineCore_DP0 pid=243) ERROR 11-30 12:00:07 [core.py:1584] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.31 GiB is free.\n"
    "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
)


def test_a_classified_log_prints_cause_line_and_fix(tmp_path, capsys):
    log = tmp_path / "vllm.log"
    log.write_text(VOCAB_LOG)
    assert main(["diagnose", "-f", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "cause: VocabMismatch"
    assert out[1].startswith("line (line 3): " + vs.VOCAB_MISMATCH_PREFIX)
    assert out[2] == (
        "fix: set speculation.useHeterogeneousVocab: true (vLLM 0.25+, draft_model with greedy draft "
        "sampling) or pick a draft whose vocab_size is 152064"
    )


def test_an_unknown_failure_exits_1(tmp_path, capsys):
    log = tmp_path / "vllm.log"
    log.write_text("ImportError: libcuda.so.1: cannot open shared object file: No such file or directory\n")
    assert main(["diagnose", "-f", str(log)]) == 1
    out = capsys.readouterr().out
    assert "cause: Unknown" in out and "libcuda.so.1" in out


def test_an_unreadable_file_is_a_user_error(tmp_path, capsys):
    assert main(["diagnose", "-f", str(tmp_path / "missing.log")]) == ExitCode.UNREADABLE
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "cannot read the file" in err and "Traceback" not in err


def test_bytes_that_are_not_utf8_do_not_hide_the_error(tmp_path, capsys):
    log = tmp_path / "vllm.log"
    log.write_bytes(b"\xff\xfe progress bar garbage\n" + OOM_LOG.encode())
    assert main(["diagnose", "-f", str(log)]) == 0
    assert "cause: OutOfMemory" in capsys.readouterr().out


def test_a_terminal_gets_rich_output(tmp_path, capsys, monkeypatch):
    log = tmp_path / "vllm.log"
    log.write_text(OOM_LOG)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["diagnose", "-f", str(log)]) == 0
    # Rich wraps to the terminal's width and colours: compare the words.
    words = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out).split())
    assert words.startswith("cause OutOfMemory line torch.OutOfMemoryError: CUDA out of memory.")
    assert "(line 2) fix the GPU ran out of memory (tried to allocate 2.00 GiB)" in words


def test_standard_input_through_a_pipe():
    done = subprocess.run(
        [sys.executable, "-m", "specdecode.cli", "diagnose", "-f", "-"],
        input=OOM_LOG,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "cause: OutOfMemory"
    assert lines[1].startswith("line (line 2): torch.OutOfMemoryError: CUDA out of memory.")
    assert lines[2].startswith("fix: the GPU ran out of memory (tried to allocate 2.00 GiB)")
    assert "\x1b[" not in done.stdout  # a pipe gets plain text

    unknown = subprocess.run(
        [sys.executable, "-m", "specdecode.cli", "diagnose", "-f", "-"],
        input="Segmentation fault (core dumped)\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode == 1 and "cause: Unknown" in unknown.stdout


ARGS_LINE = (
    "(APIServer pid=1) INFO 11-30 12:00:01 [startup.py:96] non-default args: {'model_tag': "
    "'meta-llama/Llama-3.1-8B-Instruct', 'model': 'meta-llama/Llama-3.1-8B-Instruct', 'speculative_config': "
    "{'method': 'draft_model', 'model': 'meta-llama/Llama-3.2-1B-Instruct', 'num_speculative_tokens': 4}}\n"
)
SPEC = """\
apiVersion: serving.specdecode.io/v1alpha1
kind: SpecDecodeService
metadata: {name: llama, namespace: team-a}
spec:
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  speculation: {method: eagle3, draftModel: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, numSpeculativeTokens: 3}
"""


def test_oom_fix_names_the_speculation_from_the_logged_args_or_the_spec(tmp_path, capsys):
    log = tmp_path / "vllm.log"
    log.write_text(OOM_LOG)
    assert main(["diagnose", "-f", str(log)]) == 0
    assert "speculation" not in capsys.readouterr().out  # nothing says what the pod ran
    log.write_text(ARGS_LINE + OOM_LOG)
    assert main(["diagnose", "-f", str(log)]) == 0
    fix = capsys.readouterr().out.splitlines()[2]
    assert "speculation.draftModel 'meta-llama/Llama-3.2-1B-Instruct'" in fix and "than K=4" in fix
    spec = tmp_path / "sds.yaml"
    spec.write_text(SPEC)
    assert main(["diagnose", "-f", str(log), "--spec", str(spec)]) == 0
    fix = capsys.readouterr().out.splitlines()[2]
    assert "speculation.draftModel 'yuhuili/EAGLE3-LLaMA3.1-Instruct-8B'" in fix and "than K=3" in fix
    spec.write_text(SPEC.replace("eagle3", "eagle4"))
    assert main(["diagnose", "-f", str(log), "--spec", str(spec)]) == ExitCode.INVALID
    assert "--spec" in (err := capsys.readouterr().err) and "spec.speculation.method" in err
