"""Why vLLM pods will not start: classify start-up logs, detect pods that fail to start.

Pure: text and pod dicts in, typed verdicts out; no API calls, no clock reads (``now`` is
passed in). The controller reads the pods and their logs and decides what to do; the
`specdecode diagnose` command runs the same classifier on a log a user pasted.

The vLLM texts come from ``vllm_support`` (read in the released wheels, file and line
cited there); this module only decides which text means which cause, and what the user
should change. The CUDA out-of-memory texts are PyTorch's.

How a vLLM log reaches us: each line may carry ``kubectl logs --timestamps`` RFC 3339
stamps, vLLM's process tag ``(EngineCore_DP0 pid=243)``, its logger header
``ERROR 11-30 12:00:00 [core.py:1584]`` and ANSI colours; tracebacks repeat the prefixes on
every line; errors raised inside ``SpeculativeConfig`` come wrapped by pydantic
(``1 validation error for SpeculativeConfig`` / ``  Value error, <message> [type=...]``),
and the API server ends with a wrapper (``Engine core initialization failed. See root
cause above.``) that is never the cause. Classification is by rule priority (specific
texts before general ones), then by the first line a rule matches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from enum import StrEnum
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from .. import api
from .. import constants as C
from .. import timestamps
from ..render import features as vs
from ..redaction import redact

# A line shown to a user or written to status: long enough for vLLM's longest message,
# short enough for FailedConfig.message (2048) and an Event.
MAX_LINE_CHARS = 1024


class Cause(StrEnum):
    """Classified causes of a vLLM pod that does not start (CamelCase: condition reasons)."""

    VOCAB_MISMATCH = "VocabMismatch"
    INVALID_HETEROGENEOUS_VOCAB = "InvalidHeterogeneousVocab"
    UNSUPPORTED_METHOD = "UnsupportedMethod"
    DRAFT_MODEL_UNSUPPORTED = "DraftModelUnsupported"
    UNKNOWN_SPECULATIVE_KEY = "UnknownSpeculativeKey"
    DRAFT_TENSOR_PARALLEL_MISMATCH = "DraftTensorParallelMismatch"
    INVALID_PER_BATCH_SIZE_TABLE = "InvalidPerBatchSizeTable"
    INVALID_SPECULATIVE_CONFIG = "InvalidSpeculativeConfig"
    OUT_OF_MEMORY = "OutOfMemory"
    GPU_MEMORY_IN_USE = "GpuMemoryInUse"
    MODEL_NOT_FOUND = "ModelNotFound"
    MODEL_ACCESS_DENIED = "ModelAccessDenied"
    MODEL_UNAVAILABLE = "ModelUnavailable"  # the Hub unreachable, or offline and not cached
    # From the pod's status, when the log shows nothing known (diagnose_pod_failure):
    HOST_OUT_OF_MEMORY = "HostOutOfMemory"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    CONTAINER_CANNOT_START = "ContainerCannotStart"
    STARTUP_TIMEOUT = "StartupTimeout"
    UNKNOWN = "Unknown"


# Causes that name no specific fault: the caller retries them only after a long back-off.
UNCLASSIFIED_CAUSES = frozenset({Cause.UNKNOWN, Cause.STARTUP_TIMEOUT})

# Methods whose pods load weights beyond the target's (a draft, an EAGLE head, MTP layers
# that vLLM skips when speculation is off): only these can be pushed out of memory by
# speculation. ngram and suffix look up tokens on the CPU side and load nothing.
_METHODS_LOADING_DRAFT_WEIGHTS = frozenset(
    {m.value for m in api.METHODS_WITH_DRAFT_MODEL} | {api.SpeculationMethod.MTP.value, "deepseek_mtp"}
)


@dataclass(frozen=True)
class PodSpeculation:
    """The speculation a failing pod runs, as far as classification needs it.

    Pass None instead of a PodSpeculation for a pod that runs without speculation.
    """

    method: str
    draft_model: Optional[str] = None
    num_speculative_tokens: Optional[int] = None

    @property
    def loads_draft_weights(self) -> bool:
        return self.method in _METHODS_LOADING_DRAFT_WEIGHTS

    @classmethod
    def of(cls, spec: api.SpecDecodeServiceSpec, enabled: bool, k: Optional[int] = None) -> Optional["PodSpeculation"]:
        """What pods rendered from ``spec`` run (K = ``k``, else the spec's initial K): None
        when speculation is off in them."""
        if not enabled:
            return None
        return cls(
            method=spec.speculation.method.value,
            draft_model=spec.speculation.draft_model,
            num_speculative_tokens=k if k is not None else spec.speculation.num_speculative_tokens,
        )


@dataclass(frozen=True)
class Diagnosis:
    """The cause of a start-up failure, the line that shows it, and what to change.

    ``speculation_related`` is True when running the same pod without speculation would
    likely avoid the failure: always for faults of the speculative config itself (the text
    proves vLLM parsed one); for memory exhaustion only when the pod loads draft weights
    (draft model, EAGLE head, MTP); for a model that cannot be found only when it is the
    pod's draft; never for GPU memory held by another process, an image that cannot be
    pulled or a container Kubernetes cannot create. For unclassified causes (``classified``
    False) it is True whenever the pod speculates, since speculation cannot be ruled out:
    the caller then retries only after a long back-off.
    """

    cause: Cause
    fix: str
    line: str = ""
    line_number: Optional[int] = None  # 1-based, in the text given to classify_log
    speculation_related: bool = False

    def __post_init__(self) -> None:
        # The line is quoted from a pod's log or termination message into status and Events.
        object.__setattr__(self, "line", redact(self.line))

    @property
    def classified(self) -> bool:
        return self.cause not in UNCLASSIFIED_CAUSES

    def summary(self) -> str:
        """One line for a condition message or an Event: cause, the log line, the fix."""
        line = self.line if not self.line or self.line.endswith((".", "!", "?")) else self.line + "."
        return f"{self.cause}: {line} Fix: {self.fix}." if line else f"{self.cause}. Fix: {self.fix}."


# ---------------------------------------------------------------------------------------------
# Log lines
# ---------------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LINE_PREFIXES = (
    # kubectl logs --timestamps
    re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})\s+"),
    # vLLM's process tag: (APIServer pid=1), (EngineCore_DP0 pid=243), (VllmWorker rank=0 pid=9)
    re.compile(r"^\([^()]*\bpid=\d+\)\s*"),
    # vLLM's logger header: ERROR 11-30 12:00:00 [core.py:1584]
    re.compile(
        r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
        r"\s+\[[^\]]*\]\s*"
    ),
)
_PYDANTIC_TRAILER = re.compile(r"\s*\[type=[a-z_]+(?:,.*)?\]\s*$")
_PYDANTIC_VALUE_ERROR = re.compile(r"^" + re.escape(vs.PYDANTIC_VALUE_ERROR_PREFIX))
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Failure)\b(?::|$)")


def strip_log_prefix(line: str) -> str:
    """The message of a log line: ANSI colours, timestamps, vLLM's process tag and logger
    header removed (in any order, as vLLM's decorations and kubectl's nest)."""
    text = _ANSI.sub("", line)
    changed = True
    while changed:
        changed = False
        for prefix in _LINE_PREFIXES:
            stripped = prefix.sub("", text, count=1)
            if stripped != text:
                text, changed = stripped, True
    return text.strip()


def _shown(message: str) -> str:
    """A message as shown to users: pydantic's "Value error, " and "[type=...]" trailer (which
    repeats every argument of the config) removed, capped at MAX_LINE_CHARS."""
    text = _PYDANTIC_TRAILER.sub("", _PYDANTIC_VALUE_ERROR.sub("", message))
    if len(text) > MAX_LINE_CHARS:
        text = text[: MAX_LINE_CHARS - 3] + "..."
    return text


# ---------------------------------------------------------------------------------------------
# Rules: vLLM text -> cause, fix, speculation-relatedness
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Hit:
    """A rule's match in a log, with what fixes need to word themselves."""

    match: re.Match[str]
    lines: Sequence[str]  # prefix-stripped lines of the log
    index: int  # of the matching line
    speculation: Optional[PodSpeculation]

    @property
    def loads_draft(self) -> bool:
        return self.speculation is not None and self.speculation.loads_draft_weights

    def pydantic_field(self) -> Optional[str]:
        """The field a pydantic error names: the line before "Input should ..."."""
        if self.index == 0:
            return None
        field = self.lines[self.index - 1].strip()
        return field if re.fullmatch(r"[\w.\[\]]+", field) else None


@dataclass(frozen=True)
class _Rule:
    cause: Cause
    pattern: re.Pattern[str]
    fix: Callable[[_Hit], str]
    related: Callable[[_Hit], bool]
    # The line shown and its index; by default the matching line, cleaned.
    shown: Callable[[_Hit], tuple[int, str]] = lambda hit: (hit.index, _shown(hit.lines[hit.index]))
    # Whether a match counts (a pattern alone cannot look at the lines around it).
    applies: Callable[[_Hit], bool] = lambda hit: True


def _always(_: _Hit) -> bool:
    return True


def _never(_: _Hit) -> bool:
    return False


def _when_draft_loaded(hit: _Hit) -> bool:
    return hit.loads_draft


def _shape_regex(shape: str) -> re.Pattern[str]:
    """A regex for the first sentence of a vLLM message quoted in vllm_support.

    Those constants quote messages as vLLM's source spells them: either plain text or a
    concatenation of (f-)string literals with ``{placeholders}``. Matching the first
    sentence keeps the regex tied to the cited text while tolerating the later wording
    that changes between releases (a hint, a list of methods).
    """
    pieces = re.findall(r'f?"((?:[^"\\]|\\.)*)"', shape)
    text = "".join(pieces) if pieces else shape
    text = text.replace("\\'", "'")
    first = re.split(r"(?<=[.;])\s", text, maxsplit=1)[0]
    parts = re.split(r"\{[^{}]*\}", first)
    return re.compile(".+?".join(re.escape(part) for part in parts))


def _fragment(text: str) -> re.Pattern[str]:
    return re.compile(re.escape(text))


def _heterogeneous_vocab_since() -> str:
    return vs.HETEROGENEOUS_VOCAB.first_version.rsplit(".", 1)[0] + "+"


def _fix_vocab_mismatch(hit: _Hit) -> str:
    target = hit.match.groupdict().get("target")
    enable = (
        f"set speculation.useHeterogeneousVocab: true (vLLM {_heterogeneous_vocab_since()}, "
        "draft_model with greedy draft sampling)"
    )
    if target:
        return f"{enable} or pick a draft whose vocab_size is {target}"
    return f"{enable} or pick a draft whose vocab_size equals the target's"


def _fix_invalid_heterogeneous_vocab(hit: _Hit) -> str:
    line = hit.lines[hit.index]
    if "neither unk_token_id nor eos_token_id" in line:
        role = hit.match.groupdict().get("role") or "one"
        return (
            f"the {role} tokenizer has neither an unk nor an eos token, so vLLM cannot map tokens "
            "outside the shared vocabulary: pick a draft of the target's family and set "
            "speculation.useHeterogeneousVocab: false"
        )
    return (
        "useHeterogeneousVocab works only with method draft_model, greedy draft sampling and "
        "without use_local_argmax_reduction: remove it or set speculation.method: draft_model"
    )


def _method_versions(method: str) -> str:
    ranges = vs.METHODS_BY_VERSION.get(method)
    if not ranges:
        return f"no vLLM release from {vs.OLDEST_CHECKED} to {vs.NEWEST_CHECKED} has it"
    spans = [f"{first} to {last}" if last else f"{first} and newer" for first, last in ranges]
    return "vLLM " + ", ".join(spans) + " has it"


def _literal_method(hit: _Hit) -> str:
    value = re.search(r"input_value='([^']*)'", hit.lines[hit.index])
    return value.group(1) if value else "?"


def _fix_literal_method(hit: _Hit) -> str:
    method = _literal_method(hit)
    return (
        f"the vLLM in the image does not accept method '{method}' ({_method_versions(method)}): "
        "make engine.version match the image's vLLM release, or choose another speculation.method"
    )


def _fix_unsupported_method(hit: _Hit) -> str:
    method = hit.match.group("method")
    checkpoint = (
        f"'{hit.speculation.draft_model}'" if hit.speculation and hit.speculation.draft_model else "the model"
    )
    return (
        f"vLLM did not recognize {checkpoint} as a checkpoint for method '{method}' (mtp needs a "
        "target with multi-token-prediction layers; eagle/eagle3 need an EAGLE head): pick the "
        "method the checkpoint was trained for, or method draft_model for a plain small model"
    )


def _fix_draft_model_unsupported(_: _Hit) -> str:
    newer = vs.METHODS_BY_VERSION["draft_model"][-1][0]  # the V1 engine's draft-model support
    return (
        f"method draft_model needs vLLM {newer} or newer (0.10.0 to 0.14.1 refuse it): raise "
        "engine.version and the image, or use method eagle, eagle3 or ngram"
    )


_KEYS_BY_FEATURE = {
    "use_heterogeneous_vocab": vs.HETEROGENEOUS_VOCAB,
    "num_speculative_tokens_per_batch_size": vs.PER_BATCH_SIZE_K_TABLE,
}


def _fix_unknown_key(hit: _Hit) -> str:
    key = hit.pydantic_field() or "?"
    feature = _KEYS_BY_FEATURE.get(key)
    since = f" (it needs vLLM {feature.first_version} or newer)" if feature else ""
    return (
        f"the vLLM in the image does not know speculative_config key '{key}'{since}: make "
        "engine.version match the image's vLLM release, or remove the speculation field that "
        "renders it"
    )


_PYDANTIC_INPUT = re.compile(r"\[type=[a-z_]+, input_value=(?P<value>.{1,80}?), input_type=")


def _show_pydantic_field_error(hit: _Hit) -> tuple[int, str]:
    """"<field>: <message> (got <input>)": pydantic puts the three on two lines."""
    field = hit.pydantic_field()
    raw = hit.lines[hit.index]
    message = _shown(raw)
    given = _PYDANTIC_INPUT.search(raw)
    # A model-level "Value error" echoes every argument as its input: useless to show.
    if given and not raw.startswith(vs.PYDANTIC_VALUE_ERROR_PREFIX):
        message = f"{message} (got {given.group('value')})"
    return hit.index, f"{field}: {message}" if field else message


def _fix_draft_tp(hit: _Hit) -> str:
    groups = hit.match.groupdict()
    target_tp = groups.get("target_tp")
    if target_tp:
        return (
            f"method draft_model needs the draft's tensor parallel size equal to the target's "
            f"({target_tp}): set speculation.draftTensorParallelSize: {target_tp} or leave it unset"
        )
    return (
        "speculation.draftTensorParallelSize must be 1 or the target's tensor parallel size: "
        "change it, or leave it unset (defaults to the target's)"
    )


def _fix_per_batch_size(_: _Hit) -> str:
    return (
        "fix speculation.perBatchSizeK: ranges must start at batch size 1, not overlap, and have "
        "K >= 0; or raise engine.version if the image's vLLM predates the table"
    )


_GENERIC_CONFIG_FIX = (
    "vLLM rejected the speculative config: correct the spec.speculation field the error names, "
    "or make engine.version match the image's vLLM release"
)


def _fix_invalid_config(hit: _Hit) -> str:
    line = hit.lines[hit.index]
    if "num_speculative_tokens must be provided" in line:
        return "set speculation.numSpeculativeTokens: the draft's config has no n_predict"
    if "prompt_lookup_min" in line:
        return "lower speculation.ngram.promptLookupMin to at most promptLookupMax"
    if "mutually exclusive" in line:
        return (
            "remove speculative flags from engine.extraArgs: the operator renders "
            "--speculative-config from spec.speculation"
        )
    if "unrecognized arguments" in line or "argument --speculative-config" in line:
        return (
            f"the image's vLLM does not take the speculative flags rendered for engine.version "
            f"(--speculative-config JSON needs {vs.SPECULATIVE_CONFIG_FLAG.first_version}+): make "
            "engine.version match the image's vLLM release"
        )
    return _GENERIC_CONFIG_FIX


def _pydantic_first_error(hit: _Hit) -> tuple[int, str]:
    """After "N validation error(s) for SpeculativeConfig", the first error: a field line
    (absent for model-level validators) then the message line."""
    for index in range(hit.index + 1, min(hit.index + 4, len(hit.lines))):
        text = hit.lines[index]
        if text.startswith(vs.PYDANTIC_VALUE_ERROR_PREFIX) or "[type=" in text:
            return _show_pydantic_field_error(replace(hit, index=index))
    return hit.index, _shown(hit.lines[hit.index])


def _fix_pydantic_generic(_: _Hit) -> str:
    return _GENERIC_CONFIG_FIX


def _draft_clause(hit: _Hit, text: str) -> str:
    return text if hit.loads_draft else ""


def _fix_kv_cache_too_small(hit: _Hit) -> str:
    g = hit.match.groupdict()
    weights = "the target's and the draft's weights" if hit.loads_draft else "the weights"
    estimate = g.get("estimated_max_len")
    shorter = f"set model.maxModelLen to {estimate} or less" if estimate else "lower model.maxModelLen"
    return (
        f"one {g['max_model_len']}-token request needs {g['needed_gib']} GiB of KV cache, "
        f"{g['available_gib']} GiB is left after {weights}: {shorter}, raise "
        "engine.gpuMemoryUtilization, or add GPUs (engine.tensorParallelSize)"
        + _draft_clause(hit, ", or use a smaller draft")
    )


def _fix_kv_cache_none(hit: _Hit) -> str:
    weights = "the target's and the draft's weights leave" if hit.loads_draft else "the weights leave"
    return (
        f"{weights} no GPU memory for the KV cache: raise engine.gpuMemoryUtilization or add "
        "GPUs (engine.tensorParallelSize)" + _draft_clause(hit, ", or use a smaller draft")
    )


_TRIED_TO_ALLOCATE = re.compile(r"Tried to allocate (?P<size>[\d.]+ [KMGT]i?B)")


def _fix_cuda_oom(hit: _Hit) -> str:
    tried = None
    for text in hit.lines[hit.index : hit.index + 3]:
        found = _TRIED_TO_ALLOCATE.search(text)
        if found:
            tried = found.group("size")
            break
    what = f" (tried to allocate {tried})" if tried else ""
    context = " with the draft loaded" if hit.loads_draft else ""
    return (
        f"the GPU ran out of memory{what}{context}: lower engine.gpuMemoryUtilization to leave room "
        "for activations and CUDA graphs, or lower engine.maxNumSeqs or model.maxModelLen"
        + _speculative_memory_clause(hit)
    )


def _speculative_memory_clause(hit: _Hit) -> str:
    """What the speculation itself costs in GPU memory, named when the pod's speculation is
    known: the draft's weights, and the K drafted tokens verified per sequence each step."""
    spec = hit.speculation
    if spec is None or not spec.loads_draft_weights:
        return ""
    draft = f"speculation.draftModel '{spec.draft_model}'" if spec.draft_model else f"the {spec.method} weights"
    k = spec.num_speculative_tokens
    fewer = (
        f"fewer speculative tokens than K={k} (speculation.numSpeculativeTokens, maxK)"
        if k else "fewer speculative tokens (speculation.maxK)"
    )
    return (
        f"; speculation's share: {draft} holds memory beside the target, so use a smaller draft, "
        f"or {fewer} (each drafted token is verified for every sequence in the step), and leave "
        "the draft's activations headroom below engine.gpuMemoryUtilization"
    )


def _fix_gpu_in_use(hit: _Hit) -> str:
    g = hit.match.groupdict()
    if g.get("free_gib") and g.get("total_gib"):
        free, total = float(g["free_gib"]), float(g["total_gib"])
        ceiling = int(free / total * 100) / 100 if total > 0 else 0.0
        return (
            f"another process holds GPU memory ({g['free_gib']} of {g['total_gib']} GiB free at "
            f"start-up, {g['utilization']} requested): give vLLM the GPU to itself, or set "
            f"engine.gpuMemoryUtilization to {ceiling:.2f} or less"
        )
    return (
        "another process on the GPU changed its memory use while vLLM profiled: give vLLM the "
        "GPU to itself (one pod per GPU, no other CUDA process)"
    )


def _model_of(hit: _Hit) -> Optional[str]:
    groups = hit.match.groupdict()
    model = groups.get("model") or groups.get("repo")
    return model.strip() if model else None


def _is_pod_draft(hit: _Hit) -> bool:
    model = _model_of(hit)
    draft = hit.speculation.draft_model if hit.speculation else None
    return bool(model and draft and _same_model(model, draft))


def _same_model(named: str, draft: str) -> bool:
    # A path may be logged with or without a trailing slash; a hub id exactly.
    return named.rstrip("/") == draft.rstrip("/")


def _which_model(hit: _Hit) -> str:
    model = _model_of(hit) or "?"
    if _is_pod_draft(hit):
        return f"speculation.draftModel '{model}'"
    if hit.speculation is not None:
        return f"model.name '{model}'"
    return f"'{model}' (model.name or speculation.draftModel)"


def _fix_model_not_found(hit: _Hit) -> str:
    return (
        f"{_which_model(hit)} is neither a hub repository nor a directory with config.json: fix "
        "the name or the path on the model-cache volume (modelCache.mountPath)"
    )


def _fix_access_denied(hit: _Hit) -> str:
    return (
        f"{_which_model(hit)} is gated or private: put a Hugging Face token that was granted "
        "access in a Secret and reference it in modelCache.hfTokenSecret"
    )


def _is_known_method(hit: _Hit) -> bool:
    # "Video is not supported yet." and the like are not about speculation.
    return hit.match.group("method") in vs.METHODS_BY_VERSION


def _fix_v2_runner_method(hit: _Hit) -> str:
    method = hit.match.group("method")
    v2 = ", ".join(sorted(m for m in vs.V2_RUNNER_METHODS if m in {x.value for x in api.SpeculationMethod}))
    return (
        f"Model Runner V2 has no proposer for method '{method}'; {method} runs on Model Runner V1 "
        f"({_method_versions(method)}), which vLLM picks by itself for it unless "
        f"{vs.V2_RUNNER_ENV}=1 forces V2: remove {vs.V2_RUNNER_ENV} from engine.env, or choose a "
        f"method V2 runs ({v2})"
    )


def _model_named_in_log(hit: _Hit) -> Optional[str]:
    """The model a lookup failure is about, when vLLM's rewrapped error names it (offline
    mode fails inside huggingface_hub, which names no model)."""
    for line in hit.lines:
        for pattern in (vs.INVALID_MODEL_PATTERN, _NOT_A_MODEL):
            found = pattern.search(line)
            if found:
                return found.group("model").strip()
    return None


def _which_model_unavailable(hit: _Hit) -> tuple[str, bool]:
    """How the fix names the model, and whether it is the pod's draft."""
    model = _model_named_in_log(hit)
    draft = hit.speculation.draft_model if hit.speculation else None
    if model and draft and _same_model(model, draft):
        return f"speculation.draftModel '{model}'", True
    if model:
        return (f"model.name '{model}'" if hit.speculation is not None else f"'{model}'"), False
    return "the model", False


def _is_unavailable_draft(hit: _Hit) -> bool:
    return _which_model_unavailable(hit)[1]


def _fix_hub_offline(hit: _Hit) -> str:
    model, _ = _which_model_unavailable(hit)
    return (
        f"{model} is not in the model cache and HF_HUB_OFFLINE is set, so vLLM may not download it: "
        "pre-populate the model-cache volume (modelCache, a PersistentVolumeClaim) with it, or "
        "unset HF_HUB_OFFLINE in engine.env to let the pod download it"
    )


def _fix_hub_unreachable(hit: _Hit) -> str:
    model, _ = _which_model_unavailable(hit)
    return (
        f"the pod cannot reach the Hugging Face Hub and {model} is not in its cache: allow egress "
        "to huggingface.co (NetworkPolicy, or a proxy through HTTPS_PROXY in engine.env), or "
        "pre-populate the model-cache volume (modelCache) and set HF_HUB_OFFLINE=1; a gated "
        "model also needs the token Secret (modelCache.hfTokenSecret)"
    )


def speculation_from_log(text: str) -> Optional[PodSpeculation]:
    """The speculation a vLLM pod ran, from the start-up line vLLM logs with its arguments
    (``non-default args: {...}``, vllm/entrypoints/common/startup.py:96); None when the log
    has no such line or it shows no speculative config."""
    import ast

    for raw in text.splitlines():
        line = strip_log_prefix(raw)
        at = line.find(vs.NON_DEFAULT_ARGS_PREFIX)
        if at < 0:
            continue
        key = line.find("'speculative_config': {", at)
        if key < 0:
            return None
        start = line.index("{", key)
        depth = 0
        for end in range(start, len(line)):
            depth += {"{": 1, "}": -1}.get(line[end], 0)
            if depth == 0:
                break
        try:
            config = ast.literal_eval(line[start : end + 1])
        except (ValueError, SyntaxError):
            return None
        if not isinstance(config, dict):
            return None
        model = config.get("model")
        method = config.get("method") or ("ngram" if model in ("ngram", "[ngram]") else "draft_model")
        k = config.get("num_speculative_tokens")
        return PodSpeculation(
            method=str(method),
            draft_model=str(model) if model and method != "ngram" else None,
            num_speculative_tokens=k if isinstance(k, int) else None,
        )
    return None


def _config_fault(cause: Cause, fix: Callable[[_Hit], str], *patterns: re.Pattern[str]) -> tuple[_Rule, ...]:
    """Rules for texts that prove the speculative config itself is at fault."""
    return tuple(_Rule(cause, pattern, fix, _always) for pattern in patterns)


_LITERAL_ERROR = re.compile(r"^Input should be .*" + re.escape(vs.PYDANTIC_LITERAL_ERROR) + r".*input_value=")
_UNKNOWN_KEY_ERROR = re.compile(r"Unexpected keyword argument.*" + re.escape(vs.PYDANTIC_UNKNOWN_KEY_ERROR))
_PYDANTIC_HEADER = re.compile(r"\d+ validation errors? for SpeculativeConfig")
# argparse: a JSON it cannot parse, or a flag the image's vLLM predates (the operator
# renders flags for the declared engine.version).
_ARGPARSE_JSON = re.compile(r"argument --speculative-config(?:/-sc)?: ")
_ARGPARSE_UNKNOWN_FLAG = re.compile(r"unrecognized arguments:.*--(?:speculative|spec-|num-speculative|ngram-prompt)")
# PyTorch: torch.OutOfMemoryError (torch.cuda.OutOfMemoryError before 2.5) "CUDA out of
# memory. Tried to allocate ..."; the CUDA runtime: "CUDA error: out of memory"; ROCm builds
# say HIP; vLLM rewraps warm-up OOMs as "CUDA out of memory occurred when warming up ...".
_CUDA_OOM = re.compile(
    r"torch\.(?:cuda\.)?OutOfMemoryError|(?:CUDA|HIP) out of memory|(?:CUDA|HIP) error: out of memory"
)
# huggingface_hub.errors.GatedRepoError's text.
_GATED_REPO = re.compile(
    r"Access to model (?P<model>[\w./-]+) is restricted"
    r"|Cannot access gated repo for url https://huggingface\.co/(?:api/models/)?(?P<repo>[\w.-]+/[\w.-]+)"
)
# transformers / huggingface_hub, when vLLM lets their error through unwrapped.
_NOT_A_MODEL = re.compile(r"(?P<model>[\w./-]+) is not a local folder and is not a valid model identifier")


def _is_method_field(hit: _Hit) -> bool:
    # Literal errors on other fields (draft_sample_method, ...) fall to the generic rule.
    return (hit.pydantic_field() or "").rsplit(".", 1)[-1] == "method"


# Order matters: the first rule that matches anywhere in the log wins. Faults of the
# speculative config come first (vLLM raises them before loading anything, so nothing else
# can have happened), the catch-all pydantic header last among them; then memory, the most
# specific text first; then model lookup, access before existence (vLLM rewraps a gated
# repository's error as an invalid repository ID).
RULES: tuple[_Rule, ...] = (
    *_config_fault(
        Cause.VOCAB_MISMATCH,
        _fix_vocab_mismatch,
        vs.VOCAB_MISMATCH_PATTERN,
        _shape_regex(vs.VOCAB_MISMATCH_MESSAGE),  # the numbers cut off: the cause still shows
    ),
    *_config_fault(
        Cause.DRAFT_MODEL_UNSUPPORTED, _fix_draft_model_unsupported, _fragment(vs.DRAFT_MODEL_NOT_SUPPORTED_PREFIX)
    ),
    *_config_fault(Cause.UNSUPPORTED_METHOD, _fix_unsupported_method, vs.UNSUPPORTED_METHOD_PATTERN),
    _Rule(Cause.UNSUPPORTED_METHOD, vs.V2_RUNNER_UNSUPPORTED_METHOD_PATTERN, _fix_v2_runner_method, _always,
          applies=_is_known_method),
    _Rule(Cause.UNSUPPORTED_METHOD, _LITERAL_ERROR, _fix_literal_method, _always, _show_pydantic_field_error,
          _is_method_field),
    _Rule(Cause.UNKNOWN_SPECULATIVE_KEY, _UNKNOWN_KEY_ERROR, _fix_unknown_key, _always,
          _show_pydantic_field_error),
    *_config_fault(
        Cause.DRAFT_TENSOR_PARALLEL_MISMATCH, _fix_draft_tp, vs.DRAFT_TP_MISMATCH_PATTERN, vs.DRAFT_TP_INVALID_PATTERN,
    ),
    *_config_fault(
        Cause.INVALID_PER_BATCH_SIZE_TABLE,
        _fix_per_batch_size,
        *(_shape_regex(message) for message in vs.PER_BATCH_SIZE_ERROR_MESSAGES),
    ),
    *_config_fault(
        Cause.INVALID_HETEROGENEOUS_VOCAB,
        _fix_invalid_heterogeneous_vocab,
        _shape_regex(vs.HETEROGENEOUS_VOCAB_METHOD_MESSAGE),
        _shape_regex(vs.HETEROGENEOUS_VOCAB_SAMPLING_MESSAGE),
        _shape_regex(vs.HETEROGENEOUS_VOCAB_ARGMAX_MESSAGE),
        vs.VOCAB_MAPPING_NO_UNK_PATTERN,
    ),
    *_config_fault(
        Cause.INVALID_SPECULATIVE_CONFIG,
        _fix_invalid_config,
        _shape_regex(vs.NUM_SPEC_TOKENS_REQUIRED_MESSAGE),
        _shape_regex(vs.NUM_SPEC_TOKENS_WITHOUT_MODEL_MESSAGE),
        _shape_regex(vs.TENSOR_PARALLEL_SIZE_KEY_MESSAGE),
        _shape_regex(vs.PROMPT_LOOKUP_ORDER_MESSAGE),
        _shape_regex(vs.SHORTHAND_CONFLICT_MESSAGE),
        _ARGPARSE_JSON,
        _ARGPARSE_UNKNOWN_FLAG,
    ),
    _Rule(Cause.INVALID_SPECULATIVE_CONFIG, _PYDANTIC_HEADER, _fix_pydantic_generic, _always,
          _pydantic_first_error),
    _Rule(Cause.GPU_MEMORY_IN_USE, vs.FREE_MEMORY_BELOW_UTILIZATION_PATTERN, _fix_gpu_in_use, _never),
    _Rule(Cause.GPU_MEMORY_IN_USE, _fragment(vs.MEMORY_PROFILING_ERROR_PREFIX), _fix_gpu_in_use, _never),
    _Rule(Cause.OUT_OF_MEMORY, vs.KV_CACHE_TOO_SMALL_PATTERN, _fix_kv_cache_too_small, _when_draft_loaded),
    _Rule(Cause.OUT_OF_MEMORY, _fragment(vs.KV_CACHE_NO_MEMORY_PREFIX), _fix_kv_cache_none, _when_draft_loaded),
    _Rule(Cause.OUT_OF_MEMORY, _CUDA_OOM, _fix_cuda_oom, _when_draft_loaded),
    _Rule(Cause.MODEL_ACCESS_DENIED, _GATED_REPO, _fix_access_denied, _is_pod_draft),
    # Before "not found": vLLM rewraps an unreachable Hub as an invalid repository ID.
    _Rule(Cause.MODEL_UNAVAILABLE, vs.HUB_OFFLINE_PATTERN, _fix_hub_offline, _is_unavailable_draft),
    _Rule(Cause.MODEL_UNAVAILABLE, vs.HUB_UNREACHABLE_PATTERN, _fix_hub_unreachable, _is_unavailable_draft),
    _Rule(Cause.MODEL_NOT_FOUND, vs.INVALID_MODEL_PATTERN, _fix_model_not_found, _is_pod_draft),
    _Rule(Cause.MODEL_NOT_FOUND, _NOT_A_MODEL, _fix_model_not_found, _is_pod_draft),
)


def _unknown(lines: Sequence[str], speculation: Optional[PodSpeculation]) -> Diagnosis:
    """The most telling line of a log no rule knows: its last exception that is not a
    wrapper pointing above itself, else its last non-empty line."""
    index = None
    for i in range(len(lines) - 1, -1, -1):
        text = lines[i]
        if _EXCEPTION_LINE.match(text) and not any(w in text for w in vs.ENGINE_CORE_FAILED_WRAPPERS):
            index = i
            break
    if index is None:
        index = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip()), None)
    return Diagnosis(
        cause=Cause.UNKNOWN,
        fix="no known vLLM start-up failure in the log: read it from the first Traceback "
        "(kubectl logs POD --previous for a restarted container)",
        line=_shown(lines[index]) if index is not None else "",
        line_number=index + 1 if index is not None else None,
        speculation_related=speculation is not None,
    )


def classify_log(text: str, speculation: Optional[PodSpeculation] = None) -> Diagnosis:
    """The cause of a vLLM start-up failure shown in ``text`` (a log, its tail, or a
    container's termination message).

    ``speculation`` is what the pod ran (None: no speculation, or not known, as for a log a
    user pasted). It words the fixes and decides ``speculation_related`` for causes that
    depend on it (memory, a missing model); see Diagnosis.
    """
    lines = [strip_log_prefix(raw) for raw in text.splitlines()]
    for rule in RULES:
        for index, line in enumerate(lines):
            match = rule.pattern.search(line)
            if match is None:
                continue
            hit = _Hit(match=match, lines=lines, index=index, speculation=speculation)
            if not rule.applies(hit):
                continue
            shown_index, shown = rule.shown(hit)
            return Diagnosis(
                cause=rule.cause,
                fix=rule.fix(hit),
                line=shown,
                line_number=shown_index + 1,
                speculation_related=rule.related(hit),
            )
    return _unknown(lines, speculation)


# ---------------------------------------------------------------------------------------------
# Pods
# ---------------------------------------------------------------------------------------------


class FailureKind(StrEnum):
    """How a pod shows that it does not start."""

    CRASH_LOOP = "CrashLoop"
    TERMINATED = "Terminated"
    STARTUP_TIMEOUT = "StartupTimeout"


# restartCount at which a container that keeps exiting with an error counts as
# crash-looping even while the kubelet has it running again between back-offs.
CRASH_LOOP_RESTARTS = 2

_IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_CANNOT_CREATE_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


@dataclass(frozen=True)
class PodFailure:
    """A pod that fails to start, with what the controller needs to read its log.

    ``container``/``previous_log``: the container whose log shows the failure, and whether
    it is the previous instance's (``kubectl logs --previous``: a crash-looping container
    has restarted since). ``message`` is the terminated container's termination message
    (vLLM's error where the pod writes one, or kwok's simulated text), else the waiting
    reason's message.
    """

    pod: str
    config_hash: Optional[str]
    kind: FailureKind
    detail: str  # one sentence: what the pod status shows
    container: Optional[str] = None
    previous_log: bool = False
    reason: Optional[str] = None  # Kubernetes' reason: Error, OOMKilled, CrashLoopBackOff...
    exit_code: Optional[int] = None
    restart_count: int = 0
    message: str = ""


def _ready(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )


def _scheduled(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("startTime") or (pod.get("spec") or {}).get("nodeName"):
        return True
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "True" for c in status.get("conditions") or ()
    )


def _container_statuses(status: Mapping[str, Any]) -> list[tuple[bool, Mapping[str, Any]]]:
    """(is_init, status) of every container, init containers first: a pod whose model
    download init container fails never reaches vLLM."""
    return [(True, s) for s in status.get("initContainerStatuses") or ()] + [
        (False, s) for s in status.get("containerStatuses") or ()
    ]


def _exit_code(terminated: Mapping[str, Any]) -> Optional[int]:
    code = terminated.get("exitCode")
    return int(code) if isinstance(code, (int, float)) else None


def _message(*terminated: Optional[Mapping[str, Any]]) -> str:
    for state in terminated:
        if state and state.get("message"):
            return str(state["message"])
    return ""


def _init_done(is_init: bool, cs: Mapping[str, Any]) -> bool:
    terminated = (cs.get("state") or {}).get("terminated")
    return is_init and terminated is not None and _exit_code(terminated) == 0


def pod_startup_failure(pod: Mapping[str, Any], now: datetime, startup_deadline_s: float) -> Optional[PodFailure]:
    """Why ``pod`` (the API's JSON, camelCase) fails to start, or None when it is ready,
    still within its start-up deadline, terminating, or not scheduled yet (placement is the
    scheduler's business, reported by the Deployment's availability, not a start failure).

    In order: crash-looping (a container waiting in CrashLoopBackOff, or restarted at least
    CRASH_LOOP_RESTARTS times with its last run ending in a non-zero exit), terminated with
    an error and not restarting, then not Ready for longer than ``startup_deadline_s``
    since the vLLM container's current run started (the pod's startTime, then its creation,
    when no run has started: an image that cannot be pulled lands here).
    """
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if metadata.get("deletionTimestamp") or _ready(status):
        return None
    name = str(metadata.get("name", ""))
    config_hash = (metadata.get("labels") or {}).get(C.LABEL_CONFIG_HASH)

    def failure(kind: FailureKind, detail: str, **fields: Any) -> PodFailure:
        return PodFailure(pod=name, config_hash=config_hash, kind=kind, detail=detail, **fields)

    statuses = _container_statuses(status)
    for is_init, cs in statuses:
        if _init_done(is_init, cs):
            continue
        state = cs.get("state") or {}
        last = (cs.get("lastState") or {}).get("terminated")
        restarts = int(cs.get("restartCount") or 0)
        waiting = state.get("waiting") or {}
        last_code = _exit_code(last) if last else None
        container = cs.get("name")
        kind_of = "init container" if is_init else "container"
        if waiting.get("reason") == "CrashLoopBackOff" or (
            restarts >= CRASH_LOOP_RESTARTS and last_code not in (None, 0)
        ):
            return failure(
                FailureKind.CRASH_LOOP,
                f"{kind_of} {container} is crash-looping: {restarts} restarts"
                + (f", last exit code {last_code}" if last_code is not None else "")
                + (f" ({last.get('reason')})" if last and last.get("reason") else ""),
                container=container,
                previous_log=state.get("terminated") is None,
                reason=(last or {}).get("reason") or waiting.get("reason"),
                exit_code=last_code,
                restart_count=restarts,
                message=_message(state.get("terminated"), last),
            )
    for is_init, cs in statuses:
        terminated = (cs.get("state") or {}).get("terminated")
        code = _exit_code(terminated) if terminated else None
        if terminated is None or code in (None, 0):
            continue
        container = cs.get("name")
        kind_of = "init container" if is_init else "container"
        return failure(
            FailureKind.TERMINATED,
            f"{kind_of} {container} terminated with exit code {code}"
            + (f" ({terminated.get('reason')})" if terminated.get("reason") else ""),
            container=container,
            reason=terminated.get("reason"),
            exit_code=code,
            restart_count=int(cs.get("restartCount") or 0),
            message=_message(terminated),
        )
    if status.get("phase") == "Failed":
        return failure(
            FailureKind.TERMINATED,
            f"pod failed: {status.get('reason') or 'no reason given'}",
            reason=status.get("reason"),
            message=str(status.get("message") or ""),
        )
    if not _scheduled(pod):
        return None
    return _startup_timeout(pod, now, startup_deadline_s, failure)


# Waiting reasons that are a pod's normal way to start, not a cause to report.
_STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})


def pods_waiting(pods: Iterable[Mapping[str, Any]]) -> Optional[tuple[str, str]]:
    """Why pods that are not ready wait, in their own words: (reason, "pod NAME: message") of
    the first pod (by name) that the scheduler cannot place (PodScheduled False: unschedulable,
    a PersistentVolumeClaim that does not exist) or whose container waits on something other
    than its normal start (an image that cannot be pulled, a missing Secret); None when every
    pod is ready, terminating or simply starting. `pod_startup_failure` judges failures; this
    says why a rollout makes no progress before any deadline passed."""
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        metadata = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if metadata.get("deletionTimestamp") or _ready(status):
            continue
        name = metadata.get("name", "")
        for c in status.get("conditions") or ():
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                reason = str(c.get("reason") or "Unschedulable")
                return reason, f"pod {name}: {c.get('message') or 'not scheduled'}"
        for _, cs in _container_statuses(status):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason and reason not in _STARTING_REASONS:
                detail = waiting.get("message") or f"container {cs.get('name')} waiting"
                return str(reason), f"pod {name}: {detail}"
    return None


def _main_container(statuses: Iterable[tuple[bool, Mapping[str, Any]]]) -> Optional[Mapping[str, Any]]:
    """The vLLM container's status (the one named vllm, else the first regular one), or the
    first init container still pending, which is what the pod waits on."""
    statuses = list(statuses)
    for is_init, cs in statuses:
        if is_init and not _init_done(is_init, cs):
            return cs
    regular = [cs for is_init, cs in statuses if not is_init]
    return next((cs for cs in regular if cs.get("name") == C.VLLM_CONTAINER_NAME), regular[0] if regular else None)


def _startup_timeout(
    pod: Mapping[str, Any],
    now: datetime,
    startup_deadline_s: float,
    failure: Callable[..., PodFailure],
) -> Optional[PodFailure]:
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    cs = _main_container(_container_statuses(status))
    state = (cs or {}).get("state") or {}
    running_since = timestamps.parse_optional((state.get("running") or {}).get("startedAt"))
    # A restarted container gets its own full deadline: a second slow load is not a hang.
    since = running_since or timestamps.parse_optional(status.get("startTime")) or timestamps.parse_optional(metadata.get("creationTimestamp"))
    if since is None:
        return None
    current = now if now.tzinfo else now.replace(tzinfo=timezone.utc)
    elapsed = int((current - since).total_seconds())
    if elapsed <= startup_deadline_s:
        return None
    waiting = state.get("waiting") or {}
    what = "running but not ready" if running_since else (
        f"waiting ({waiting['reason']})" if waiting.get("reason") else "not started"
    )
    return failure(
        FailureKind.STARTUP_TIMEOUT,
        f"not ready {elapsed}s after start, deadline {int(startup_deadline_s)}s: {what}",
        container=(cs or {}).get("name"),
        reason=waiting.get("reason"),
        restart_count=int((cs or {}).get("restartCount") or 0),
        message=str(waiting.get("message") or ""),
    )


def pods_failing(
    pods: Iterable[Mapping[str, Any]],
    config_hash: str,
    now: datetime,
    startup_deadline_s: float,
) -> list[PodFailure]:
    """Start-up failures among the pods labelled with ``config_hash`` (others belong to
    another config: a rollout's old pods say nothing about the new config), by pod name."""
    failures = []
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(C.LABEL_CONFIG_HASH) != config_hash:
            continue
        found = pod_startup_failure(pod, now, startup_deadline_s)
        if found is not None:
            failures.append(found)
    return sorted(failures, key=lambda f: f.pod)


def diagnose_pod_failure(
    failure: PodFailure, log_text: str = "", speculation: Optional[PodSpeculation] = None
) -> Diagnosis:
    """The cause of a pod's failure: its termination message and log tail first (vLLM says
    why), then what Kubernetes says (OOMKilled, image pull, container creation), then the
    deadline. ``log_text`` is the log of ``failure.container`` (previous instance when
    ``failure.previous_log``). The diagnosis' line_number counts in the message, then the log."""
    text = "\n".join(part for part in (failure.message, log_text) if part)
    diagnosis = classify_log(text, speculation)
    if diagnosis.classified:
        return diagnosis
    loads_draft = speculation is not None and speculation.loads_draft_weights
    if failure.reason == "OOMKilled":
        return Diagnosis(
            cause=Cause.HOST_OUT_OF_MEMORY,
            fix="the container exceeded its memory limit (OOMKilled): raise resources.memory; weights "
            "pass through host memory while they load" + (", the draft's too" if loads_draft else ""),
            line=failure.detail,
            speculation_related=loads_draft,
        )
    if failure.reason in _IMAGE_PULL_REASONS:
        return Diagnosis(
            cause=Cause.IMAGE_PULL_FAILED,
            fix="the image cannot be pulled: check engine.image and engine.version (the image tag) "
            "and pod.imagePullSecrets",
            line=_shown(failure.message or failure.detail),
        )
    if failure.reason in _CANNOT_CREATE_REASONS:
        return Diagnosis(
            cause=Cause.CONTAINER_CANNOT_START,
            fix="Kubernetes cannot create the container: fix what the message names (often a "
            "missing Secret, such as modelCache.hfTokenSecret)",
            line=_shown(failure.message or failure.detail),
        )
    if failure.kind is FailureKind.STARTUP_TIMEOUT and diagnosis.cause is Cause.UNKNOWN:
        return Diagnosis(
            cause=Cause.STARTUP_TIMEOUT,
            fix="no error in the log: the weights may still be loading (raise "
            "rollout.startupTimeout, or use a PersistentVolumeClaim model cache) or the server "
            "hangs (read the log)",
            line=diagnosis.line or failure.detail,
            line_number=diagnosis.line_number,
            speculation_related=speculation is not None,
        )
    return diagnosis
