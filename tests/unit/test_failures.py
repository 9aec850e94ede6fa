"""The start-up failure classifier on real vLLM texts, and failing-pod detection on pod dicts.

vLLM's messages are rebuilt from vllm_support's constants (quoted from the released wheels)
and dressed the way a pod log shows them: kubectl timestamps, vLLM's process tags and logger
headers, pydantic's wrapping, tracebacks that end in the engine-core wrapper.
"""

from __future__ import annotations

import inspect
import re
from datetime import datetime, timedelta, timezone

import pytest

from specdecode import api
from specdecode import constants as C
from specdecode.control import failures as F
from specdecode.render import features as vs
from specdecode.control.failures import Cause, FailureKind, PodSpeculation, classify_log

from .conftest import service_doc


def vllm_text(shape: str, **values: object) -> str:
    """A vLLM message as rendered at run time, from its quoted source shape in vllm_support:
    the (f-)string pieces joined, each {placeholder} replaced by values[name]."""
    pieces = re.findall(r'f?"((?:[^"\\]|\\.)*)"', shape)
    text = ("".join(pieces) if pieces else shape).replace("\\'", "'")

    def value(match: re.Match[str]) -> str:
        key = match.group(1)
        name = key.rstrip("=").split(".")[-1]
        rendered = str(values[name])
        return f"{key.rstrip('=')}={rendered}" if key.endswith("=") else rendered

    return re.sub(r"\{([^{}]*)\}", value, text)


VOCAB_TEXT = vllm_text(vs.VOCAB_MISMATCH_MESSAGE, target_vocab_size=152064, draft_vocab_size=151936)

API = "(APIServer pid=1) "
CORE = "(EngineCore_DP0 pid=243) "
CORE_ERROR = CORE + "ERROR 11-30 12:00:07 [core.py:1584] "
STAMP = "2025-11-30T12:00:07.123456789Z "

DRAFT = PodSpeculation(method="draft_model", draft_model="Qwen/Qwen2.5-0.5B-Instruct")
NGRAM = PodSpeculation(method="ngram")


def traceback(prefix: str, *frames_then_error: str) -> str:
    lines = ["Traceback (most recent call last):"]
    lines += [f'  File "/usr/local/lib/python3.12/dist-packages/vllm/{f}", line 100, in f' for f in frames_then_error[:-1]]
    lines.append(frames_then_error[-1])
    return "\n".join(prefix + line for line in lines)


# ---------------------------------------------------------------------------------------------
# Vocabulary mismatch
# ---------------------------------------------------------------------------------------------


def test_vocab_mismatch_at_the_end_of_a_pydantic_wrapped_traceback():
    log = "\n".join(
        [
            STAMP + API + "INFO 11-30 12:00:01 [api_server.py:1896] vLLM API server version 0.33.0",
            STAMP + API + "INFO 11-30 12:00:02 [model.py:547] Resolved architecture: Qwen2ForCausalLM",
            traceback(
                STAMP + API,
                "entrypoints/cli/main.py",
                "engine/arg_utils.py",
                "config/speculative.py",
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
            ),
            STAMP + API + f"  Value error, {VOCAB_TEXT} [type=value_error, input_value=ArgsKwargs((), "
            "{'model': 'Qwen/Qwen2.5-0.5B-Instruct', 'method': 'draft_model', 'num_speculative_tokens': 5}), "
            "input_type=ArgsKwargs]",
            STAMP + API + "    For further information visit https://errors.pydantic.dev/2.11/v/value_error",
        ]
    )
    d = classify_log(log, DRAFT)
    assert d.cause is Cause.VOCAB_MISMATCH and d.classified and d.speculation_related
    assert d.line == VOCAB_TEXT  # prefixes, "Value error, " and pydantic's trailer gone
    assert log.splitlines()[d.line_number - 1].endswith("input_type=ArgsKwargs]")
    assert d.fix == (
        "set speculation.useHeterogeneousVocab: true (vLLM 0.25+, draft_model with greedy draft "
        "sampling) or pick a draft whose vocab_size is 152064"
    )


def test_vocab_mismatch_raised_in_the_engine_core_before_the_wrapper():
    log = "\n".join(
        [
            CORE_ERROR + "EngineCore failed to start.",
            traceback(CORE_ERROR, "v1/engine/core.py", "v1/spec_decode/draft_model.py", f"ValueError: {VOCAB_TEXT}"),
            traceback(
                API,
                "v1/engine/async_llm.py",
                "v1/engine/utils.py",
                "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            ),
        ]
    )
    d = classify_log(log)
    assert d.cause is Cause.VOCAB_MISMATCH
    assert d.line == f"ValueError: {VOCAB_TEXT}"
    assert "152064" in d.fix


def test_vocab_mismatch_without_the_numbers_still_names_the_cause():
    d = classify_log("ValueError: " + vs.VOCAB_MISMATCH_PREFIX + " Target model vocab_size=")
    assert d.cause is Cause.VOCAB_MISMATCH
    assert d.fix.endswith("pick a draft whose vocab_size equals the target's")


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------

TORCH_OOM = traceback(
    CORE_ERROR,
    "v1/worker/gpu_worker.py",
    "model_executor/model_loader/base_loader.py",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.31 GiB is free. Including non-PyTorch memory, this process "
    "has 77.86 GiB memory in use.",
)


def test_cuda_oom_traceback_is_speculation_related_only_when_the_pod_loads_a_draft():
    with_draft = classify_log(TORCH_OOM, DRAFT)
    assert with_draft.cause is Cause.OUT_OF_MEMORY and with_draft.speculation_related
    assert with_draft.line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "(tried to allocate 2.00 GiB) with the draft loaded" in with_draft.fix
    assert "smaller draft" in with_draft.fix
    for speculation in (None, NGRAM):
        plain = classify_log(TORCH_OOM, speculation)
        assert plain.cause is Cause.OUT_OF_MEMORY and not plain.speculation_related
        assert "draft" not in plain.fix
    for method in ("eagle", "eagle3", "mtp"):
        assert classify_log(TORCH_OOM, PodSpeculation(method=method)).speculation_related


@pytest.mark.parametrize(
    "text",
    [
        "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 23.65 GiB total capacity)",
        "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. "
        "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.",
    ],
)
def test_other_cuda_oom_texts(text):
    assert classify_log(CORE_ERROR + text.replace("\n", "\n" + CORE_ERROR), DRAFT).cause is Cause.OUT_OF_MEMORY


def test_kv_cache_that_does_not_fit_one_request():
    message = (
        "ValueError: To serve at least one request with the model's max seq len (32768), (4.5 GiB KV "
        "cache is needed, which is larger than the available KV cache memory (2.12 GiB). Based on the "
        "available memory, the estimated maximum model length is 15440. Try increasing "
        "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
        "`max_model_len` when initializing the engine."
    )
    d = classify_log(CORE_ERROR + message, DRAFT)
    assert d.cause is Cause.OUT_OF_MEMORY and d.speculation_related
    assert d.fix.startswith(
        "one 32768-token request needs 4.5 GiB of KV cache, 2.12 GiB is left after the target's and "
        "the draft's weights: set model.maxModelLen to 15440 or less"
    )


def test_no_memory_left_for_the_kv_cache():
    text = CORE_ERROR + "ValueError: " + vs.KV_CACHE_NO_MEMORY_PREFIX + " Try increasing `gpu_memory_utilization`"
    d = classify_log(text, DRAFT)
    assert d.cause is Cause.OUT_OF_MEMORY and d.speculation_related
    assert "raise engine.gpuMemoryUtilization" in d.fix and "smaller draft" in d.fix


def test_gpu_memory_held_by_another_process_is_never_blamed_on_speculation():
    text = (
        "ValueError: Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than desired "
        "GPU memory utilization (0.92, 72.86 GiB). Decrease GPU memory utilization or reduce GPU "
        "memory used by other processes."
    )
    d = classify_log(CORE_ERROR + text, DRAFT)
    assert d.cause is Cause.GPU_MEMORY_IN_USE and not d.speculation_related
    assert "engine.gpuMemoryUtilization to 0.13 or less" in d.fix
    profiling = classify_log("AssertionError: " + vs.MEMORY_PROFILING_ERROR_PREFIX + " Initial free memory 70 GiB", DRAFT)
    assert profiling.cause is Cause.GPU_MEMORY_IN_USE and not profiling.speculation_related


# ---------------------------------------------------------------------------------------------
# Speculative config faults
# ---------------------------------------------------------------------------------------------


def pydantic_error(field: str, message: str, kind: str, value: str) -> str:
    return "\n".join(
        API + line
        for line in (
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
            field,
            f"  {message} [type={kind}, input_value={value}, input_type=str]",
            f"    For further information visit https://errors.pydantic.dev/2.11/v/{kind}",
        )
    )


def test_unknown_method_is_pydantics_literal_error():
    log = pydantic_error(
        "method", "Input should be 'ngram', 'eagle', 'eagle3', 'draft_model' or 'mtp'", "literal_error", "'medusa'"
    )
    d = classify_log(log)
    assert d.cause is Cause.UNSUPPORTED_METHOD and d.speculation_related
    assert d.line == "method: Input should be 'ngram', 'eagle', 'eagle3', 'draft_model' or 'mtp' (got 'medusa')"
    assert d.line_number == 3
    assert "method 'medusa' (vLLM 0.8.2 to 0.32.0 has it)" in d.fix


def test_a_literal_error_on_another_field_is_an_invalid_config():
    d = classify_log(pydantic_error("draft_sample_method", "Input should be 'greedy'", "literal_error", "'top_k'"))
    assert d.cause is Cause.INVALID_SPECULATIVE_CONFIG
    assert d.line == "draft_sample_method: Input should be 'greedy' (got 'top_k')"


def test_a_key_the_image_does_not_know_names_the_release_that_has_it():
    d = classify_log(
        pydantic_error("use_heterogeneous_vocab", "Unexpected keyword argument", "unexpected_keyword_argument", "True")
    )
    assert d.cause is Cause.UNKNOWN_SPECULATIVE_KEY
    assert "key 'use_heterogeneous_vocab' (it needs vLLM 0.25.0 or newer)" in d.fix


def test_generic_pydantic_error_shows_field_and_message():
    d = classify_log(pydantic_error("num_speculative_tokens", "Input should be greater than 0", "greater_than", "0"))
    assert d.cause is Cause.INVALID_SPECULATIVE_CONFIG
    assert d.line == "num_speculative_tokens: Input should be greater than 0 (got 0)"


def test_method_vllm_cannot_detect():
    d = classify_log(
        API + "NotImplementedError: " + vllm_text(vs.UNSUPPORTED_METHOD_MESSAGE, method="mtp"),
        PodSpeculation(method="mtp"),
    )
    assert d.cause is Cause.UNSUPPORTED_METHOD
    assert "method 'mtp'" in d.fix and "multi-token-prediction" in d.fix


def test_draft_model_on_a_release_without_it():
    d = classify_log(API + "NotImplementedError: " + vs.DRAFT_MODEL_NOT_SUPPORTED_MESSAGE)
    assert d.cause is Cause.DRAFT_MODEL_UNSUPPORTED
    assert "vLLM 0.15.0 or newer" in d.fix


def test_draft_tensor_parallel_mismatch_names_the_targets_size():
    text = vllm_text(vs.DRAFT_TP_MISMATCH_MESSAGE, draft_tp=1, tgt_tp=4)
    d = classify_log(CORE_ERROR + "ValueError: " + text)
    assert d.cause is Cause.DRAFT_TENSOR_PARALLEL_MISMATCH
    assert "set speculation.draftTensorParallelSize: 4 or leave it unset" in d.fix
    invalid = vllm_text(vs.DRAFT_TP_INVALID_MESSAGE, speculative_draft_tensor_parallel_size=2)
    assert invalid.startswith("speculative_draft_tensor_parallel_size=2 cannot be")
    d = classify_log("ValueError: " + invalid)
    assert d.cause is Cause.DRAFT_TENSOR_PARALLEL_MISMATCH and "must be 1 or the target's" in d.fix


@pytest.mark.parametrize("shape", vs.PER_BATCH_SIZE_ERROR_MESSAGES)
def test_every_per_batch_size_table_error(shape):
    text = vllm_text(shape, range_start=4, range_end=2, num_speculative_tokens=3)
    d = classify_log(CORE_ERROR + "ValueError: " + text)
    assert d.cause is Cause.INVALID_PER_BATCH_SIZE_TABLE and "speculation.perBatchSizeK" in d.fix


@pytest.mark.parametrize(
    "text",
    [
        vs.HETEROGENEOUS_VOCAB_METHOD_MESSAGE,
        vs.HETEROGENEOUS_VOCAB_SAMPLING_MESSAGE,
        vs.HETEROGENEOUS_VOCAB_ARGMAX_MESSAGE,
        vllm_text(vs.VOCAB_MAPPING_NO_UNK_MESSAGE, role="draft tokenizer"),
    ],
)
def test_heterogeneous_vocab_refusals(text):
    d = classify_log(CORE_ERROR + "ValueError: " + text)
    assert d.cause is Cause.INVALID_HETEROGENEOUS_VOCAB and d.speculation_related


@pytest.mark.parametrize(
    "text, words",
    [
        (vs.NUM_SPEC_TOKENS_REQUIRED_MESSAGE, "numSpeculativeTokens"),
        (vs.NUM_SPEC_TOKENS_WITHOUT_MODEL_MESSAGE, "spec.speculation"),
        (vs.TENSOR_PARALLEL_SIZE_KEY_MESSAGE, "spec.speculation"),
        (vllm_text(vs.PROMPT_LOOKUP_ORDER_MESSAGE, prompt_lookup_min=6, prompt_lookup_max=4), "promptLookupMin"),
        (vllm_text(vs.SHORTHAND_CONFLICT_MESSAGE, flag="--spec-tokens", key="num_speculative_tokens"), "extraArgs"),
        ("vllm serve: error: unrecognized arguments: --speculative-config {\"method\": \"ngram\"}", "engine.version"),
        ("vllm serve: error: argument --speculative-config/-sc: Value {x cannot be converted to loads.", "engine.version"),
    ],
)
def test_other_config_refusals(text, words):
    d = classify_log(API + text)
    assert d.cause is Cause.INVALID_SPECULATIVE_CONFIG and d.speculation_related
    assert words in d.fix


# The cases vllm_support's first classifier was tested with, under the causes they map to now.
@pytest.mark.parametrize(
    "log, cause",
    [
        (
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
            "SpeculativeConfig\n  Value error, Target and draft model should have the same "
            "vocabulary size. Target model vocab_size=1. Draft model vocab_size=2.",
            Cause.VOCAB_MISMATCH,
        ),
        (
            "1 validation error for SpeculativeConfig\nmethod\n  Input should be 'ngram', "
            "'draft_model' [type=literal_error, input_value='medusa', input_type=str]",
            Cause.UNSUPPORTED_METHOD,
        ),
        (
            "1 validation error for SpeculativeConfig\nbogus\n  Unexpected keyword argument "
            "[type=unexpected_keyword_argument, input_value=1, input_type=int]",
            Cause.UNKNOWN_SPECULATIVE_KEY,
        ),
        ("NotImplementedError: Unsupported speculative method: 'foo'", Cause.UNSUPPORTED_METHOD),
        (
            "NotImplementedError: Speculative decoding with draft model is not supported yet. "
            "Please consider using other speculative decoding methods such as ngram, medusa, "
            "eagle, or mtp.",
            Cause.DRAFT_MODEL_UNSUPPORTED,
        ),
        ("ValueError: The first batch-size range must start at 1 so every runtime batch "
         "size has a defined schedule.", Cause.INVALID_PER_BATCH_SIZE_TABLE),
        ("ValueError: Batch-size ranges must be non-overlapping and sorted.", Cause.INVALID_PER_BATCH_SIZE_TABLE),
        ("--spec-tokens and --speculative-config['num_speculative_tokens'] are mutually "
         "exclusive", Cause.INVALID_SPECULATIVE_CONFIG),
        ("WARNING Disabling num_speculative_tokens_per_batch_size and falling back", Cause.UNKNOWN),
        ("INFO Starting vLLM API server", Cause.UNKNOWN),
    ],
)
def test_earlier_classifier_cases(log, cause):
    assert classify_log(log).cause is cause


def test_there_is_one_classifier():
    assert not hasattr(vs, "classify_startup_error") and not hasattr(vs, "STARTUP_ERROR_MARKERS")


# ---------------------------------------------------------------------------------------------
# Models that cannot be found or read
# ---------------------------------------------------------------------------------------------

INVALID_DRAFT = (
    API + "ValueError: Invalid repository ID or local directory specified: 'Qwen/Qwen2.5-0.5B-Instruct'.\n"
    + API + "Please verify the following requirements:\n"
    + API + "1. Provide a valid Hugging Face repository ID."
)


def test_a_missing_draft_is_speculation_related_a_missing_target_is_not():
    d = classify_log(INVALID_DRAFT, DRAFT)
    assert d.cause is Cause.MODEL_NOT_FOUND and d.speculation_related
    assert d.fix.startswith("speculation.draftModel 'Qwen/Qwen2.5-0.5B-Instruct' is neither")
    target = classify_log(INVALID_DRAFT.replace("Qwen2.5-0.5B", "Qwen2.5-7B"), DRAFT)
    assert target.cause is Cause.MODEL_NOT_FOUND and not target.speculation_related
    assert target.fix.startswith("model.name 'Qwen/Qwen2.5-7B-Instruct'")


def test_a_gated_draft_is_access_not_existence():
    log = "\n".join(
        [
            API + "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-6746)",
            API + "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.2-1B-Instruct/resolve/main/config.json.",
            API + "Access to model meta-llama/Llama-3.2-1B-Instruct is restricted. You must have access to it and be authenticated to access it. Please log in.",
            API + "The above exception was the direct cause of the following exception:",
            API + "ValueError: Invalid repository ID or local directory specified: 'meta-llama/Llama-3.2-1B-Instruct'.",
        ]
    )
    d = classify_log(log, PodSpeculation("draft_model", "meta-llama/Llama-3.2-1B-Instruct"))
    assert d.cause is Cause.MODEL_ACCESS_DENIED and d.speculation_related
    assert "modelCache.hfTokenSecret" in d.fix


# ---------------------------------------------------------------------------------------------
# Unknown failures, prefixes, shapes
# ---------------------------------------------------------------------------------------------


def test_unknown_failure_shows_the_root_exception_not_the_wrapper():
    log = "\n".join(
        [
            CORE_ERROR + "EngineCore failed to start.",
            traceback(
                CORE_ERROR,
                "v1/engine/core.py",
                "platforms/cuda.py",
                "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory",
            ),
            traceback(
                API,
                "v1/engine/utils.py",
                "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            ),
        ]
    )
    d = classify_log(log)
    assert d.cause is Cause.UNKNOWN and not d.classified and not d.speculation_related
    assert d.line == "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory"
    assert "kubectl logs POD --previous" in d.fix
    # A speculating pod cannot rule speculation out: the caller backs off, then retries.
    assert classify_log(log, DRAFT).speculation_related


def test_empty_log_and_log_without_exceptions():
    assert classify_log("") == F.Diagnosis(cause=Cause.UNKNOWN, fix=classify_log("").fix)
    d = classify_log("INFO loading weights\nINFO still loading\n\n")
    assert d.cause is Cause.UNKNOWN and d.line == "INFO still loading" and d.line_number == 2


@pytest.mark.parametrize(
    "raw",
    [
        "ValueError: boom",
        "2025-11-30T12:00:07Z ValueError: boom",
        "2025-11-30T12:00:07.5+01:00 (APIServer pid=1) ValueError: boom",
        "(EngineCore_DP0 pid=243) ERROR 11-30 12:00:07 [core.py:1584] ValueError: boom",
        "\x1b[0;36m(APIServer pid=1)\x1b[0;0m \x1b[31mERROR\x1b[0m \x1b[90m11-30 12:00:07\x1b[0m "
        "\x1b[90m[core.py:1]\x1b[0m ValueError: boom",
        "(VllmWorker rank=0 pid=17) ERROR 11-30 12:00:07 [multiproc_executor.py:546] ValueError: boom",
    ],
)
def test_log_prefixes_are_stripped(raw):
    assert F.strip_log_prefix(raw) == "ValueError: boom"


def test_long_lines_are_capped():
    d = classify_log("ValueError: " + vs.VOCAB_MISMATCH_PREFIX + " x" * 2000)
    assert len(d.line) == F.MAX_LINE_CHARS and d.line.endswith("...")


def test_summary_is_one_line_with_cause_line_and_fix():
    d = classify_log("ValueError: " + VOCAB_TEXT)
    assert d.summary() == f"VocabMismatch: ValueError: {VOCAB_TEXT} Fix: {d.fix}."
    assert "\n" not in d.summary()


def test_causes_fit_the_status_field():
    assert all(len(c.value) <= 64 and re.fullmatch(r"[A-Z][A-Za-z]+", c.value) for c in Cause)


def test_module_is_pure():
    source = inspect.getsource(F)
    for name in ("import os", "import subprocess", "open(", "requests", "urllib", "kubernetes", "datetime.now"):
        assert name not in source


# ---------------------------------------------------------------------------------------------
# Pods
# ---------------------------------------------------------------------------------------------

NOW = datetime(2025, 11, 30, 12, 30, tzinfo=timezone.utc)
DEADLINE = 600.0


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str = "svc-abc-1",
    config_hash: str = "h1",
    *,
    ready: bool = False,
    state: dict | None = None,
    last_state: dict | None = None,
    restarts: int = 0,
    started_ago: float | None = 60,
    init: list[dict] | None = None,
    phase: str = "Running",
    **status: object,
) -> dict:
    container = {
        "name": C.VLLM_CONTAINER_NAME,
        "ready": ready,
        "restartCount": restarts,
        "state": state if state is not None else {"running": {"startedAt": ts(started_ago or 0)}},
        "lastState": last_state or {},
    }
    body = {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
        "containerStatuses": [container],
        **status,
    }
    if started_ago is not None:
        body["startTime"] = ts(started_ago)
    if init is not None:
        body["initContainerStatuses"] = init
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": ts((started_ago or 0) + 5),
            "labels": {C.LABEL_CONFIG_HASH: config_hash, C.LABEL_SERVICE: "svc"},
        },
        "spec": {"nodeName": "gpu-node-0"} if started_ago is not None else {},
        "status": body,
    }


def terminated(code: int, message: str = "", reason: str = "Error", ago: float = 30) -> dict:
    return {"terminated": {"exitCode": code, "reason": reason, "message": message, "finishedAt": ts(ago)}}


def test_ready_and_starting_pods_are_not_failures():
    assert F.pod_startup_failure(pod(ready=True), NOW, DEADLINE) is None
    assert F.pod_startup_failure(pod(ready=True, restarts=5, last_state=terminated(1)), NOW, DEADLINE) is None
    assert F.pod_startup_failure(pod(started_ago=120), NOW, DEADLINE) is None
    creating = pod(state={"waiting": {"reason": "ContainerCreating"}}, started_ago=30)
    assert F.pod_startup_failure(creating, NOW, DEADLINE) is None
    # One crash and a running second attempt within the deadline: not yet a crash loop.
    assert F.pod_startup_failure(pod(restarts=1, last_state=terminated(1), started_ago=20), NOW, DEADLINE) is None


def test_crash_loop_back_off_carries_the_vllm_message():
    p = pod(
        state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        last_state=terminated(1, "ValueError: " + VOCAB_TEXT),
        restarts=3,
    )
    f = F.pod_startup_failure(p, NOW, DEADLINE)
    assert f == F.PodFailure(
        pod="svc-abc-1",
        config_hash="h1",
        kind=FailureKind.CRASH_LOOP,
        detail="container vllm is crash-looping: 3 restarts, last exit code 1 (Error)",
        container="vllm",
        previous_log=True,
        reason="Error",
        exit_code=1,
        restart_count=3,
        message="ValueError: " + VOCAB_TEXT,
    )
    assert F.diagnose_pod_failure(f, speculation=DRAFT).cause is Cause.VOCAB_MISMATCH


def test_restarting_with_errors_is_a_crash_loop_between_back_offs():
    f = F.pod_startup_failure(pod(restarts=2, last_state=terminated(137, reason="OOMKilled"), started_ago=5), NOW, DEADLINE)
    assert f is not None and f.kind is FailureKind.CRASH_LOOP and f.previous_log and f.reason == "OOMKilled"
    d = F.diagnose_pod_failure(f, "INFO Loading weights took 41.2 seconds", DRAFT)
    assert d.cause is Cause.HOST_OUT_OF_MEMORY and d.speculation_related and "resources.memory" in d.fix


def test_terminated_with_an_error_and_not_restarting():
    p = pod(state=terminated(1, TORCH_OOM), restarts=0)
    f = F.pod_startup_failure(p, NOW, DEADLINE)
    assert f is not None and f.kind is FailureKind.TERMINATED and not f.previous_log
    assert f.exit_code == 1 and f.message == TORCH_OOM
    assert F.diagnose_pod_failure(f, speculation=DRAFT).cause is Cause.OUT_OF_MEMORY
    assert F.pod_startup_failure(pod(state=terminated(0, reason="Completed")), NOW, DEADLINE) is None


def test_a_failed_pod_phase_is_terminated():
    p = pod(phase="Failed", state=terminated(0, reason="Completed"), reason="Evicted", message="node low on memory")
    f = F.pod_startup_failure(p, NOW, DEADLINE)
    assert f is not None and f.kind is FailureKind.TERMINATED and f.reason == "Evicted"
    assert f.message == "node low on memory"


def test_not_ready_past_the_deadline():
    f = F.pod_startup_failure(pod(started_ago=DEADLINE + 60), NOW, DEADLINE)
    assert f is not None and f.kind is FailureKind.STARTUP_TIMEOUT and f.container == "vllm"
    assert f.detail == "not ready 660s after start, deadline 600s: running but not ready"
    d = F.diagnose_pod_failure(f, "INFO Loading safetensors checkpoint shards: 40% Completed", DRAFT)
    assert d.cause is Cause.STARTUP_TIMEOUT and not d.classified and d.speculation_related
    assert "rollout.startupTimeout" in d.fix


def test_the_deadline_counts_from_the_current_run():
    p = pod(started_ago=DEADLINE * 3, restarts=1, last_state=terminated(1))
    p["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": ts(30)}}
    assert F.pod_startup_failure(p, NOW, DEADLINE) is None


def test_image_pull_and_container_creation_past_the_deadline():
    pull = pod(
        state={"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "vllm/vllm-openai:v0.99.0"'}},
        started_ago=DEADLINE + 1,
    )
    f = F.pod_startup_failure(pull, NOW, DEADLINE)
    assert f is not None and f.kind is FailureKind.STARTUP_TIMEOUT and f.reason == "ImagePullBackOff"
    assert "waiting (ImagePullBackOff)" in f.detail
    d = F.diagnose_pod_failure(f, "", DRAFT)
    assert d.cause is Cause.IMAGE_PULL_FAILED and not d.speculation_related and "v0.99.0" in d.line
    secret = pod(
        state={"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}},
        started_ago=DEADLINE + 1,
    )
    d = F.diagnose_pod_failure(F.pod_startup_failure(secret, NOW, DEADLINE), "", DRAFT)
    assert d.cause is Cause.CONTAINER_CANNOT_START and not d.speculation_related


def test_unscheduled_and_terminating_pods_are_not_start_failures():
    pending = pod(started_ago=None, state={"waiting": {"reason": "Pending"}}, phase="Pending")
    pending["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    pending["metadata"]["creationTimestamp"] = ts(DEADLINE * 10)
    assert F.pod_startup_failure(pending, NOW, DEADLINE) is None
    leaving = pod(state=terminated(1, "x"))
    leaving["metadata"]["deletionTimestamp"] = ts(1)
    assert F.pod_startup_failure(leaving, NOW, DEADLINE) is None


def test_a_crash_looping_init_container():
    init = [
        {
            "name": "fetch-weights",
            "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": terminated(2, "huggingface_hub.errors.GatedRepoError: 401 Client Error."),
        }
    ]
    p = pod(init=init, state={"waiting": {"reason": "PodInitializing"}})
    f = F.pod_startup_failure(p, NOW, DEADLINE)
    assert f is not None and f.kind is FailureKind.CRASH_LOOP and f.container == "fetch-weights"
    assert f.detail.startswith("init container fetch-weights is crash-looping")
    done = [{"name": "fetch-weights", "restartCount": 0, "state": terminated(0, reason="Completed")}]
    assert F.pod_startup_failure(pod(init=done), NOW, DEADLINE) is None


def test_naive_now_and_typed_client_datetimes():
    p = pod(started_ago=DEADLINE + 60)
    p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"] = NOW - timedelta(seconds=DEADLINE + 60)
    f = F.pod_startup_failure(p, NOW.replace(tzinfo=None), DEADLINE)
    assert f is not None and f.kind is FailureKind.STARTUP_TIMEOUT


def test_pods_failing_looks_only_at_the_given_config():
    pods = [
        pod("svc-new-b", "new", state=terminated(1, "ValueError: " + VOCAB_TEXT)),
        pod("svc-new-a", "new", state={"waiting": {"reason": "CrashLoopBackOff"}}, restarts=2, last_state=terminated(1)),
        pod("svc-new-c", "new", ready=True),
        pod("svc-old-a", "old", state={"waiting": {"reason": "CrashLoopBackOff"}}, restarts=9, last_state=terminated(1)),
        {"metadata": {"name": "stray"}, "status": {}},
    ]
    found = F.pods_failing(pods, "new", NOW, DEADLINE)
    assert [(f.pod, f.config_hash, f.kind) for f in found] == [
        ("svc-new-a", "new", FailureKind.CRASH_LOOP),
        ("svc-new-b", "new", FailureKind.TERMINATED),
    ]
    assert F.pods_failing(pods, "other", NOW, DEADLINE) == []


def test_pod_speculation_of_a_spec():
    spec = api.parse_service(
        service_doc(
            {
                "model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
                "speculation": {"method": "draft_model", "draftModel": "Qwen/Qwen2.5-0.5B-Instruct"},
            }
        )
    ).spec
    assert PodSpeculation.of(spec, enabled=False) is None
    running = PodSpeculation.of(spec, enabled=True)
    assert running.method == DRAFT.method and running.draft_model == DRAFT.draft_model and running.loads_draft_weights
    assert running.num_speculative_tokens == spec.speculation.num_speculative_tokens
    assert PodSpeculation.of(spec, enabled=True, k=5).num_speculative_tokens == 5
    assert not NGRAM.loads_draft_weights and not PodSpeculation("suffix").loads_draft_weights


# ---------------------------------------------------------------------------------------------
# Start-up gaps held against vLLM 0.33.0's own texts
# ---------------------------------------------------------------------------------------------


def test_a_method_model_runner_v2_lacks_is_unsupported_method_with_the_runner_that_has_it():
    text = vllm_text(vs.V2_RUNNER_UNSUPPORTED_METHOD_MESSAGE, method="suffix")
    log = traceback(CORE_ERROR, "v1/worker/gpu/model_runner.py", "v1/worker/gpu/spec_decode/__init__.py",
                    f"NotImplementedError: {text}")
    log += "\n" + API + "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    d = classify_log(log, PodSpeculation(method="suffix", num_speculative_tokens=4))
    assert d.cause is Cause.UNSUPPORTED_METHOD and d.speculation_related
    assert d.line == "NotImplementedError: suffix is not supported yet."
    assert "Model Runner V2 has no proposer for method 'suffix'" in d.fix
    assert "vLLM 0.11.1 and newer has it" in d.fix and "remove VLLM_USE_V2_MODEL_RUNNER from engine.env" in d.fix
    # Other "is not supported yet." texts are not about speculation.
    assert classify_log(CORE_ERROR + "NotImplementedError: Video is not supported yet.").cause is Cause.UNKNOWN


INVALID_REPO = (
    "ValueError: Invalid repository ID or local directory specified: '{model}'.\n"
    "Please verify the following requirements:\n"
    "1. Provide a valid Hugging Face repository ID.\n"
)
# huggingface_hub 2.4.0 (vLLM 0.33.0 requires >= 1.31.0): _snapshot_download.py:382-386 and
# utils/_http.py:294-296.
OFFLINE_SNAPSHOT = (
    "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder for the "
    "specified revision on the local disk and outgoing traffic has been disabled. To enable repo look-ups and "
    "downloads online, pass 'local_files_only=False' as input."
)
OFFLINE_HTTP = ("huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://huggingface.co/api/models/"
                "Qwen/Qwen2.5-0.5B-Instruct: offline mode is enabled. To disable it, please unset the "
                "`HF_HUB_OFFLINE` environment variable.")


@pytest.mark.parametrize("error", [OFFLINE_SNAPSHOT, OFFLINE_HTTP])
def test_offline_without_the_model_in_the_cache(error):
    log = traceback(API, "engine/arg_utils.py", "transformers_utils/repo_utils.py", error)
    d = classify_log(log, DRAFT)
    assert d.cause is Cause.MODEL_UNAVAILABLE and d.classified
    assert "HF_HUB_OFFLINE" in d.fix and "pre-populate the model-cache volume" in d.fix
    # The model vLLM names decides whether speculation is to blame.
    named = log + "\n" + API + INVALID_REPO.format(model=DRAFT.draft_model).replace("\n", "\n" + API)
    d = classify_log(named, DRAFT)
    assert d.cause is Cause.MODEL_UNAVAILABLE and d.speculation_related
    assert f"speculation.draftModel '{DRAFT.draft_model}' is not in the model cache" in d.fix


def test_hub_unreachable_is_not_a_wrong_model_name():
    # vLLM 0.33.0: repo_utils.py:124 logs the failed Hub lookup, config.py rewraps it as an
    # invalid repository ID (which alone means a wrong name).
    log = "\n".join([
        API + "ERROR 11-30 12:00:02 [repo_utils.py:124] Error retrieving file list: [Errno -3] Temporary "
        "failure in name resolution",
        traceback(API, "entrypoints/cli/serve.py", "transformers_utils/config.py",
                  INVALID_REPO.format(model="meta-llama/Llama-3.1-8B-Instruct").splitlines()[0]),
    ])
    d = classify_log(log, DRAFT)
    assert d.cause is Cause.MODEL_UNAVAILABLE and not d.speculation_related
    assert "cannot reach the Hugging Face Hub and model.name 'meta-llama/Llama-3.1-8B-Instruct'" in d.fix
    assert "modelCache.hfTokenSecret" in d.fix and "HF_HUB_OFFLINE=1" in d.fix
    # Without the Hub lookup's failure, the same rewrapped error is a wrong name.
    alone = classify_log(INVALID_REPO.format(model="meta-llama/Llama-3.1-8B-Instruct"), DRAFT)
    assert alone.cause is Cause.MODEL_NOT_FOUND
    # huggingface_hub's own wording when a download has no network (_snapshot_download.py:400-404).
    snapshot = ("huggingface_hub.errors.LocalEntryNotFoundError: Got: ConnectError: [Errno 101] Network is "
                "unreachable\nAn error happened while trying to locate the files on the Hub, and we cannot find "
                "the appropriate snapshot folder for the specified revision on the local disk. Please check your "
                "internet connection and try again.")
    assert classify_log(snapshot).cause is Cause.MODEL_UNAVAILABLE


def non_default_args_line(**args) -> str:
    """vLLM 0.33.0's start-up line (entrypoints/common/startup.py:96, the argparse namespace's
    values as Python shows them: --speculative-config is parsed with json.loads)."""
    return API + f"INFO 11-30 12:00:01 [startup.py:96] non-default args: {args}"


def test_the_pods_speculation_is_read_from_the_arguments_vllm_logs():
    line = non_default_args_line(
        model_tag="meta-llama/Llama-3.1-8B-Instruct", model="meta-llama/Llama-3.1-8B-Instruct",
        speculative_config={"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct",
                            "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 8, 4]]},
        gpu_memory_utilization=0.9,
    )
    assert F.speculation_from_log(line) == PodSpeculation("draft_model", "meta-llama/Llama-3.2-1B-Instruct", 4)
    ngram = non_default_args_line(model="m", speculative_config={"model": "ngram", "num_speculative_tokens": 3})
    assert F.speculation_from_log(ngram) == PodSpeculation("ngram", None, 3)
    assert F.speculation_from_log(non_default_args_line(model="m")) is None
    assert F.speculation_from_log(TORCH_OOM) is None


def test_oom_with_the_pods_speculation_known_names_the_speculative_part_of_the_fix():
    known = PodSpeculation("draft_model", "meta-llama/Llama-3.2-1B-Instruct", 4)
    d = classify_log(TORCH_OOM, known)
    assert d.speculation_related
    assert "speculation.draftModel 'meta-llama/Llama-3.2-1B-Instruct' holds memory beside the target" in d.fix
    assert "fewer speculative tokens than K=4" in d.fix and "engine.gpuMemoryUtilization" in d.fix
    assert "speculation" not in classify_log(TORCH_OOM, NGRAM).fix
