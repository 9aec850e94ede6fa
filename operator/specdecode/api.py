"""The SpecDecodeService API (serving.specdecode.io/v1alpha1) as pydantic v2 models.

These models are the single source of truth: the CRD schema (`specdecode.crd`), the
operator's validation and the documentation shown by `kubectl explain` are all generated from
them. Every field has a description; every cross-field rule is declared once as a `Rule`
that carries both its CEL expression (enforced by the apiserver) and its Python check
(enforced by `specdecode validate` and by the operator before it renders anything).

Field names are camelCase on the wire (Kubernetes convention) and snake_case in Python.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Callable, ClassVar, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from . import constants as C
from .redaction import redact_limited

# ---------------------------------------------------------------------------------------------
# Durations
# ---------------------------------------------------------------------------------------------

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
DURATION_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")


def parse_duration(text: str | int | float, *, days: bool = False) -> float:
    """Seconds in a duration such as `30s`, `5m`, `1h30m` or `250ms` (plain numbers are seconds).

    The one duration parser of the project: the API's durations (the CRD's pattern), and with
    ``days`` also `1d` for scenario files, which can last days.
    """
    example = "90s, 5m, 1h30m or 250ms" + (" (days: 1d)" if days else "")
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"{text!r} is not a duration; write it like {example}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        stripped = text.strip()
        parts = _DURATION_PART.findall(stripped)
        if re.fullmatch(r"[0-9]+(\.[0-9]+)?", stripped):
            seconds = float(stripped)
        elif parts and "".join(n + u for n, u in parts) == stripped and (days or all(u != "d" for _, u in parts)):
            seconds = sum(float(n) * DURATION_UNIT_SECONDS[u] for n, u in parts)
        else:
            raise ValueError(f"{text!r} is not a duration; write it like {example}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"duration {text!r} must be a finite number of seconds >= 0")
    return seconds


# What Go's time.ParseDuration (the apiserver's CEL `duration()`) accepts: int64 nanoseconds.
_GO_DURATION_MAX_NS = (1 << 63) - 1
_GO_UNIT_NS = {"ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
POSITIVE_DURATION_CEL = "duration(self) > duration('0s')"


def duration_nanoseconds(text: str) -> int:
    """Nanoseconds in an API duration, computed as Go's time.ParseDuration does (fractions
    truncated to whole nanoseconds per part, int64 overflow refused), so that the Python check
    and the apiserver's CEL `duration()` agree on every string, `0.0000000001ms` included."""
    total = 0
    for number, unit in _DURATION_PART.findall(text):
        whole, _, fraction = number.partition(".")
        scale = _GO_UNIT_NS[unit]
        part = int(whole) * scale
        if fraction:
            part += int(fraction) * scale // 10 ** len(fraction)
        total += part
        if part > _GO_DURATION_MAX_NS or total > _GO_DURATION_MAX_NS:
            raise ValueError(f"duration {text!r} is too long: at most 2562047h")
    return total


def _positive_duration(text: Optional[str]) -> Optional[str]:
    if text is not None and re.fullmatch(DURATION_PATTERN, text) and duration_nanoseconds(text) <= 0:
        raise ValueError(f"must be longer than 0 (got {text!r}): write it like 30s or 5m")
    return text


# A duration that must be longer than zero: checked by pydantic here and by CEL at admission.
PositiveDuration = Annotated[str, AfterValidator(_positive_duration)]
OptionalPositiveDuration = Annotated[Optional[str], AfterValidator(_positive_duration)]


def Duration(default: Optional[str], description: str, *, positive: bool = False, **kwargs: Any) -> Any:
    """A duration field: a string such as `30s` or `5m` on the wire. A positive one is refused
    at 0 by the apiserver (CEL) and by the operator alike (annotate it `PositiveDuration`)."""
    extra = {"x-kubernetes-validations": [
        {"rule": POSITIVE_DURATION_CEL, "message": "must be longer than 0: write it like 30s or 5m"}
    ]} if positive else None
    return Field(default, description=description, pattern=DURATION_PATTERN, max_length=32,
                 json_schema_extra=extra, **kwargs)


# Kubernetes' own limits on label keys (prefix/name) and values.
LABEL_KEY_MAX = 317
LABEL_VALUE_MAX = 63
# The schema's bounds keep the largest typed spec under this many bytes of JSON: kubectl's
# client-side apply keeps a copy of the object in an annotation, and all annotations share
# 256 KiB. (kopf keeps only a digest: see handlers.DigestDiffBaseStorage.) Only pass-through
# Kubernetes objects (affinity, volumes, volume mounts, env valueFrom) can add more, up to
# SPEC_MAX_BYTES.
SPEC_BOUND_BYTES = 120 * 1024
# The most a whole spec may take, pass-through objects included (compact JSON with defaults,
# as stored). Checked by `specdecode validate` and by the operator, not at admission: CEL
# cannot see inside the pass-through objects (x-kubernetes-preserve-unknown-fields) and has
# no serialized-size function, and typing them in the CRD would mean freezing a copy of
# Kubernetes' Affinity, Volume (30 sources, an ephemeral claim template) and EnvVarSource
# that lags every Kubernetes release, refuses their new fields (strict clients) or prunes
# them (others). A spec over it: `validate` refuses it, the apiserver admits it, and the
# operator reports it (Degraded, InvalidSpec, an Event) and applies nothing for it (a
# serving service keeps its children as they were; a new one gets none).
# 256 KiB is what all annotations share, so kubectl's client-side apply of a larger one fails.
SPEC_MAX_BYTES = 256 * 1024
# The schema's ceiling on replicas; the operator's own limit (settings.max_replicas) is lower.
MAX_REPLICAS_SCHEMA = 256


def _map_keys_rule(max_key: int) -> dict[str, Any]:
    return {"rule": f"self.all(k, size(k) <= {max_key})", "message": f"keys must be at most {max_key} characters"}


def StringMap(description: str, *, max_items: int, max_key: int, max_value: int,
              key_rule: Optional[tuple[str, str]] = None) -> Any:
    """A map of short strings (labels, selectors, headers), bounded in entries, key and value
    length so that the spec's size and CEL's cost estimates stay low. `key_rule` is an extra
    (CEL, message) check of every key, with `check_keys` its Python twin."""
    validations = [_map_keys_rule(max_key)]
    if key_rule:
        validations.append({"rule": f"self.all(k, {key_rule[0]})", "message": key_rule[1]})
    return Field(
        default_factory=dict,
        description=description,
        max_length=max_items,
        json_schema_extra={"x-kubernetes-validations": validations,
                           "additionalProperties": {"type": "string", "maxLength": max_value}},
    )


def _bounded_map(max_key: int, max_value: int, key_pattern: Optional[str] = None, key_message: str = ""):
    def check(value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if len(key) > max_key:
                raise ValueError(f"key {key[:40]!r}...: keys must be at most {max_key} characters")
            if key_pattern and not re.fullmatch(key_pattern, key):
                raise ValueError(f"key {key!r}: {key_message}")
            if len(item) > max_value:
                raise ValueError(f"value of {key!r}: at most {max_value} characters")
        return value
    return AfterValidator(check)


# Prometheus label names, minus the reserved `__` prefix (`__name__` would replace the metric).
PROM_LABEL_CEL = "k.matches('^[a-zA-Z_][a-zA-Z0-9_]*$') && !k.startsWith('__')"
PROM_LABEL_PATTERN = r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*"
PROM_LABEL_MESSAGE = ("keys must be Prometheus label names ([a-zA-Z_][a-zA-Z0-9_]*) not starting "
                      "with __ (reserved, __name__ included)")

LabelMap = Annotated[dict[str, str], _bounded_map(LABEL_KEY_MAX, LABEL_VALUE_MAX)]
AnnotationMap = Annotated[dict[str, str], _bounded_map(253, 512)]
HeaderMap = Annotated[dict[str, str], _bounded_map(128, 512)]
PromSelector = Annotated[dict[str, str], _bounded_map(128, 256, PROM_LABEL_PATTERN, PROM_LABEL_MESSAGE)]

# ---------------------------------------------------------------------------------------------
# Cross-field rules: one declaration, two enforcers (apiserver CEL and Python)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A cross-field rule of one object.

    `cel` runs in the apiserver (`x-kubernetes-validations` on the object's schema), `check`
    runs in Python on the same object; both must agree. `field` is the path, relative to the
    object, that the message blames (the apiserver reports it as the error's field).
    """

    cel: str
    message: str
    check: Callable[[Any], bool]
    field: str = ""


class ApiModel(BaseModel):
    """Base of every API object: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self):
        for rule in type(self).rules:
            if not rule.check(self):
                raise ValueError(rule.message)
        return self

    def to_wire(self) -> dict[str, Any]:
        """The object as the apiserver stores it: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _preserve(description: str, **kwargs: Any) -> Any:
    """A free-form Kubernetes object (affinity, a volume, ...) passed through unchanged."""
    return Field(
        description=description,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------
# spec.model
# ---------------------------------------------------------------------------------------------


class TargetModel(ApiModel):
    """The target model vLLM serves."""

    name: str = Field(
        description="Hugging Face repository id (`Qwen/Qwen2.5-7B-Instruct`) or a path inside the "
        "model cache volume (`/models/llama-3.1-8b`). Passed to `vllm serve`.",
        min_length=1,
        max_length=512,
    )
    served_name: Optional[str] = Field(
        None,
        description="Name clients use in the OpenAI API (`--served-model-name`) and the "
        "`model_name` label of vLLM's metrics. Defaults to `name`.",
        max_length=256,
    )
    revision: Optional[str] = Field(
        None,
        description="Branch, tag or commit of the model repository (`--revision`). Pin it in "
        "production so a new upload does not change what a restart loads.",
        max_length=128,
    )
    max_model_len: Optional[int] = Field(
        None,
        description="Context length (`--max-model-len`). Lower it when the KV cache does not fit.",
        ge=16,
        le=10_000_000,
    )
    trust_remote_code: bool = Field(
        False,
        description="Allow the model repository's own Python code (`--trust-remote-code`). Only "
        "for repositories you trust.",
    )

    @property
    def served_model_name(self) -> str:
        return self.served_name or self.name


# ---------------------------------------------------------------------------------------------
# spec.speculation
# ---------------------------------------------------------------------------------------------


class SpeculationMethod(str, Enum):
    """Speculative decoding methods of vLLM 0.33 that make sense to deploy."""

    DRAFT_MODEL = "draft_model"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    NGRAM = "ngram"
    SUFFIX = "suffix"


METHODS_WITH_DRAFT_MODEL = (SpeculationMethod.DRAFT_MODEL, SpeculationMethod.EAGLE, SpeculationMethod.EAGLE3)
METHODS_WITHOUT_DRAFT_MODEL = (SpeculationMethod.NGRAM, SpeculationMethod.MTP, SpeculationMethod.SUFFIX)

DEFAULT_ACCEPTANCE_FLOOR: dict[SpeculationMethod, float] = {
    # For a method with a draft: where K=1 stops paying for the performance model's prior at
    # a batch of 8 (its step at K=1 over its step with speculation off, minus one), to the
    # nearest 0.05; a unit test keeps the table and the priors in step. One floor for every
    # method turned a cheap EAGLE head off at acceptance 0.30, where off was the slowest
    # choice (heldback-eagle-topic-shift 0.789; 0.954 with its method's floor).
    SpeculationMethod.DRAFT_MODEL: 0.35,
    SpeculationMethod.EAGLE: 0.15,
    SpeculationMethod.EAGLE3: 0.15,
    SpeculationMethod.MTP: 0.15,
    # Prompt lookup breaks even near 0.10 by the same measure, but its acceptance comes in
    # bursts (high on repetitive text, near zero on open chat), and the floor is what keeps a
    # burst's low from luring schedules into a config then held (bursty-ngram with
    # autotune.schedules Auto: 0.985 at 0.35, 0.628 at 0.10). Kept until schedules judge
    # bursts themselves.
    SpeculationMethod.NGRAM: 0.35,
    SpeculationMethod.SUFFIX: 0.35,
}


class NgramWindow(ApiModel):
    """Prompt-lookup window of the n-gram method: the lengths of n-grams matched in the prompt.
    Unset bounds keep vLLM's defaults."""

    prompt_lookup_min: Optional[int] = Field(
        None, description="Shortest n-gram to match (`prompt_lookup_min`).", ge=1, le=32
    )
    prompt_lookup_max: Optional[int] = Field(
        None, description="Longest n-gram to match (`prompt_lookup_max`).", ge=1, le=32
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.promptLookupMin) || !has(self.promptLookupMax) || "
            "self.promptLookupMin <= self.promptLookupMax",
            message="promptLookupMin must not exceed promptLookupMax: lower promptLookupMin or "
            "raise promptLookupMax",
            check=lambda w: w.prompt_lookup_min is None
            or w.prompt_lookup_max is None
            or w.prompt_lookup_min <= w.prompt_lookup_max,
            field=".promptLookupMin",
        ),
    )


class BatchSizeRange(ApiModel):
    """One row of the per-batch-size K table: K for running batches in [minBatchSize, maxBatchSize]."""

    min_batch_size: int = Field(description="First batch size of the range (inclusive).", ge=1, le=65536)
    max_batch_size: int = Field(description="Last batch size of the range (inclusive).", ge=1, le=65536)
    k: int = Field(
        description="Speculative tokens for this range; 0 turns speculation off inside the engine "
        "for these batch sizes, without a restart. Capped by the effective K.",
        ge=0,
        le=16,
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.minBatchSize <= self.maxBatchSize",
            message="minBatchSize must not exceed maxBatchSize in a per-batch-size range",
            check=lambda r: r.min_batch_size <= r.max_batch_size,
            field=".minBatchSize",
        ),
    )


def _ranges_start_at_one(ranges: list[BatchSizeRange]) -> bool:
    return not ranges or any(r.min_batch_size == 1 for r in ranges)


def _ranges_disjoint(ranges: list[BatchSizeRange]) -> bool:
    return all(
        a is b or a.max_batch_size < b.min_batch_size or b.max_batch_size < a.min_batch_size
        for a in ranges
        for b in ranges
    )


class Speculation(ApiModel):
    """How vLLM speculates: the method, the draft, and the bounds the operator tunes K within."""

    method: SpeculationMethod = Field(
        description="Speculative decoding method: `draft_model` (a small model of the same family), "
        "`eagle` / `eagle3` (an EAGLE head trained for the target), `mtp` (the target's own "
        "multi-token-prediction layers), `ngram` (prompt lookup, no draft) or `suffix` "
        "(suffix-tree lookup, no draft)."
    )
    draft_model: Optional[str] = Field(
        None,
        description="Draft model or EAGLE head: Hugging Face id or path. Required for draft_model, "
        "eagle and eagle3; not allowed for ngram, mtp and suffix.",
        min_length=1,
        max_length=512,
    )
    draft_revision: Optional[str] = Field(
        None, description="Branch, tag or commit of the draft repository.", max_length=128
    )
    num_speculative_tokens: int = Field(
        3,
        description="K the service starts with: tokens proposed per step. The operator moves it "
        "within [minK, maxK] in Auto mode; in Off mode it is what runs.",
        ge=1,
        le=16,
    )
    min_k: int = Field(1, description="Smallest K the operator may choose.", ge=1, le=16)
    max_k: int = Field(8, description="Largest K the operator may choose.", ge=1, le=16)
    allow_disable: bool = Field(
        True,
        description="Whether the operator may turn speculation off when it stops paying or its "
        "pods cannot start. When false it only lowers K, and reports Degraded instead of "
        "running without speculation.",
    )
    draft_tensor_parallel_size: Optional[int] = Field(
        None,
        description="Tensor parallel size of the draft: 1 or the target's. Defaults to the target's.",
        ge=1,
        le=64,
    )
    ngram: Optional[NgramWindow] = Field(
        None, description="Prompt-lookup window, for method ngram only. vLLM's defaults when unset."
    )
    use_heterogeneous_vocab: bool = Field(
        False,
        description="Let a draft_model whose vocabulary differs from the target's run (vLLM maps "
        "tokens between them; greedy draft sampling only). vLLM refuses such a pair without it, "
        "for example Qwen2.5-7B (vocab 152064) with Qwen2.5-0.5B (151936).",
    )
    per_batch_size_k: Optional[list[BatchSizeRange]] = Field(
        None,
        description="Optional K per running-batch-size range, applied inside the engine without "
        "restarts (vLLM versions that support `num_speculative_tokens_per_batch_size`). Ranges "
        "must include one starting at 1 and must not overlap; K in a range is capped by the "
        "effective K.",
        max_length=16,
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.minK <= self.maxK",
            message="minK must not exceed maxK: lower minK or raise maxK",
            check=lambda s: s.min_k <= s.max_k,
            field=".minK",
        ),
        Rule(
            cel="self.numSpeculativeTokens >= self.minK && self.numSpeculativeTokens <= self.maxK",
            message="numSpeculativeTokens must lie within [minK, maxK]: move it into the bounds or "
            "widen them",
            check=lambda s: s.min_k <= s.num_speculative_tokens <= s.max_k,
            field=".numSpeculativeTokens",
        ),
        Rule(
            cel="!(self.method in ['draft_model', 'eagle', 'eagle3']) || has(self.draftModel)",
            message="draftModel is required for methods draft_model, eagle and eagle3: name the "
            "draft model or EAGLE head",
            check=lambda s: s.method not in METHODS_WITH_DRAFT_MODEL or s.draft_model is not None,
            field=".draftModel",
        ),
        Rule(
            cel="!(self.method in ['ngram', 'mtp', 'suffix']) || !has(self.draftModel)",
            message="draftModel is not used by methods ngram, mtp and suffix: remove it",
            check=lambda s: s.method not in METHODS_WITHOUT_DRAFT_MODEL or s.draft_model is None,
            field=".draftModel",
        ),
        Rule(
            cel="self.method == 'ngram' || !has(self.ngram)",
            message="ngram settings apply to method ngram only: remove them or set method: ngram",
            check=lambda s: s.method == SpeculationMethod.NGRAM or s.ngram is None,
            field=".ngram",
        ),
        Rule(
            cel="self.method == 'draft_model' || !self.useHeterogeneousVocab",
            message="useHeterogeneousVocab works with method draft_model only: remove it",
            check=lambda s: s.method == SpeculationMethod.DRAFT_MODEL or not s.use_heterogeneous_vocab,
            field=".useHeterogeneousVocab",
        ),
        Rule(
            cel="!has(self.perBatchSizeK) || size(self.perBatchSizeK) == 0 || "
            "self.perBatchSizeK.exists(r, r.minBatchSize == 1)",
            message="perBatchSizeK must have a range starting at minBatchSize 1",
            check=lambda s: _ranges_start_at_one(s.per_batch_size_k or []),
            field=".perBatchSizeK",
        ),
        Rule(
            # Each range overlaps itself alone (`a == b` would let two equal ranges through).
            cel="!has(self.perBatchSizeK) || self.perBatchSizeK.all(a, self.perBatchSizeK.filter(b, "
            "a.minBatchSize <= b.maxBatchSize && b.minBatchSize <= a.maxBatchSize).size() == 1)",
            message="perBatchSizeK ranges must not overlap: make each range end before the next "
            "one starts",
            check=lambda s: _ranges_disjoint(s.per_batch_size_k or []),
            field=".perBatchSizeK",
        ),
        Rule(
            cel="!has(self.perBatchSizeK) || self.perBatchSizeK.all(r, r.k <= self.maxK)",
            message="perBatchSizeK K values must not exceed maxK: lower them or raise maxK",
            check=lambda s: all(r.k <= s.max_k for r in s.per_batch_size_k or []),
            field=".perBatchSizeK",
        ),
    )

    @property
    def needs_draft_model(self) -> bool:
        return self.method in METHODS_WITH_DRAFT_MODEL


# ---------------------------------------------------------------------------------------------
# spec.engine
# ---------------------------------------------------------------------------------------------

# Flags the operator owns: a user setting them in extraArgs would fight the operator's choice.
RESERVED_ARG_PREFIXES = (
    "--speculative",
    "--spec-",
    "-sc",
    "--num-speculative-tokens",
    "--ngram-prompt-lookup",
    "--port",
)


def _reserved_arg(arg: str) -> str | None:
    """The reserved prefix an argument starts with, if any (the same test as the CEL rule)."""
    return next((prefix for prefix in RESERVED_ARG_PREFIXES if arg.startswith(prefix)), None)


class EnvVar(ApiModel):
    """An environment variable of the vLLM container (the Kubernetes EnvVar shape)."""

    name: str = Field(description="Variable name.", min_length=1, max_length=128)
    value: Optional[str] = Field(None, description="Literal value.", max_length=512)
    value_from: Optional[dict[str, Any]] = _preserve(
        "A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...).", default=None
    )


class Engine(ApiModel):
    """The vLLM engine: image, version and the serving knobs passed to `vllm serve`."""

    image: Optional[str] = Field(
        None,
        description="Container image. Defaults to `vllm/vllm-openai:v<version>`.",
        max_length=512,
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Pull policy of the vLLM image."
    )
    version: str = Field(
        C.DEFAULT_VLLM_VERSION,
        description="vLLM version the image runs. Chooses the argument dialect: "
        "`--speculative-config` JSON from 0.8.2, the legacy speculative flags before it, the "
        "newest dialect when the version is not a release number (for example `nightly`).",
        min_length=1,
        max_length=64,
    )
    max_num_seqs: Optional[int] = Field(
        None,
        description="Most sequences in a batch (`--max-num-seqs`). vLLM's default depends on the "
        "GPU (1024 on H100-class, 256 on smaller).",
        ge=1,
        le=65536,
    )
    max_num_batched_tokens: Optional[int] = Field(
        None,
        description="Most tokens per engine step (`--max-num-batched-tokens`).",
        ge=1,
        le=10_000_000,
    )
    gpu_memory_utilization: Optional[float] = Field(
        None,
        description="Fraction of GPU memory vLLM may use (`--gpu-memory-utilization`, 0 to 1). "
        "Lower it when a draft model pushes the GPU out of memory.",
        gt=0.0,
        le=1.0,
    )
    enable_chunked_prefill: Optional[bool] = Field(
        None,
        description="Chunked prefill on or off; vLLM decides per model when unset.",
    )
    tensor_parallel_size: Optional[int] = Field(
        None,
        description="Tensor parallel size of the target (`--tensor-parallel-size`). Defaults to the "
        "GPU count.",
        ge=1,
        le=64,
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="More `vllm serve` arguments, appended as given. Speculative flags and --port "
        "are refused here: the operator owns them.",
        max_length=32,
        json_schema_extra={"items": {"type": "string", "maxLength": 1024}},
    )
    env: list[EnvVar] = Field(
        default_factory=list, description="Environment of the vLLM container.", max_length=32
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.extraArgs) || self.extraArgs.all(a, !(a.startsWith('--speculative') || a.startsWith('--spec-') "
            "|| a.startsWith('-sc') || a.startsWith('--num-speculative-tokens') || "
            "a.startsWith('--ngram-prompt-lookup') || a.startsWith('--port')))",
            message="extraArgs must not carry speculative flags or --port: the operator renders "
            "them from spec.speculation; move the setting there",
            check=lambda e: all(_reserved_arg(a) is None for a in e.extra_args),
            field=".extraArgs",
        ),
    )

    @field_validator("extra_args")
    @classmethod
    def _each_arg_short(cls, args: list[str]) -> list[str]:
        for arg in args:
            if len(arg) > 1024:
                raise ValueError("each extra argument must be at most 1024 characters")
        return args

    def image_ref(self) -> str:
        return self.image or f"{C.DEFAULT_VLLM_IMAGE}:v{self.version}"


# ---------------------------------------------------------------------------------------------
# spec.rollout, spec.resources, spec.scheduling
# ---------------------------------------------------------------------------------------------


class Rollout(ApiModel):
    """How a change of speculation rolls through the replicas. Every change restarts pods."""

    max_surge: int = Field(
        0,
        description="Extra pods during a rollout. 0 needs no spare GPU but takes one replica out "
        "for each change (with one replica, a change is an outage); 1 with maxUnavailable 0 keeps "
        "every replica serving if a spare GPU node exists (with maxUnavailable 1, Kubernetes still "
        "takes a replica down while the surge pod starts).",
        ge=0,
        le=64,
    )
    max_unavailable: int = Field(
        1, description="Pods that may be down during a rollout. 0 (with maxSurge >= 1) keeps every "
        "replica serving through a change: the policy then pays no capacity for a restart, while "
        "any other setting leaves replicas - maxUnavailable to carry the load for a model's load "
        "time, which the policy prices and, near their capacity, waits out.", ge=0, le=64
    )
    startup_timeout: PositiveDuration = Duration(
        "30m",
        "How long a pod may take to load the model and become ready before it counts as failed "
        "to start (rendered as the startup probe's budget).",
        positive=True,
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.maxSurge + self.maxUnavailable >= 1",
            message="maxSurge and maxUnavailable cannot both be 0: a rollout could never progress",
            check=lambda r: r.max_surge + r.max_unavailable >= 1,
            field=".maxUnavailable",
        ),
    )


class Resources(ApiModel):
    """What each vLLM pod requests."""

    gpus: int = Field(1, description="GPUs per pod.", ge=0, le=64)
    gpu_resource_name: str = Field(
        C.DEFAULT_GPU_RESOURCE,
        description="Extended resource name of the GPU (`nvidia.com/gpu`, `amd.com/gpu`, or a MIG "
        "profile such as `nvidia.com/mig-3g.40gb`).",
        min_length=1,
        max_length=253,
    )
    cpu: Optional[str] = Field(
        None, description="CPU request and limit, a Kubernetes quantity (`8`, `7500m`).", max_length=32
    )
    memory: Optional[str] = Field(
        None, description="Memory request and limit, a Kubernetes quantity (`64Gi`).", max_length=32
    )
    shm_size: str = Field(
        "16Gi",
        description="Size of the memory-backed /dev/shm volume (NCCL and PyTorch need more than a "
        "container's default 64Mi).",
        max_length=32,
    )


class Toleration(ApiModel):
    """A Kubernetes toleration."""

    key: Optional[str] = Field(None, description="Taint key; empty with Exists matches all.", max_length=317)
    operator: Optional[Literal["Exists", "Equal"]] = Field(None, description="Exists or Equal.")
    value: Optional[str] = Field(None, description="Taint value, for Equal.", max_length=63)
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = Field(
        None, description="Taint effect to tolerate; all when empty."
    )
    toleration_seconds: Optional[int] = Field(
        None, description="For NoExecute: how long the pod stays bound after the taint appears.",
        ge=-(2**63), le=2**63 - 1,
    )


class Scheduling(ApiModel):
    """Where vLLM pods run."""

    node_selector: LabelMap = StringMap(
        "Node labels a node must have.", max_items=16, max_key=LABEL_KEY_MAX, max_value=LABEL_VALUE_MAX
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        description="Tolerations beyond the one for the GPU taint, which is always added.",
        max_length=16,
    )
    affinity: Optional[dict[str, Any]] = _preserve("Pod affinity, as Kubernetes' Affinity.", default=None)
    priority_class_name: Optional[str] = Field(None, description="PriorityClass of the pods.", max_length=253)
    runtime_class_name: Optional[str] = Field(
        None, description="RuntimeClass of the pods (for example `nvidia`).", max_length=253
    )


# ---------------------------------------------------------------------------------------------
# spec.modelCache, spec.pod
# ---------------------------------------------------------------------------------------------


class SecretKeyRef(ApiModel):
    """A key of a Secret in the service's namespace."""

    name: str = Field(description="Secret name.", min_length=1, max_length=253)
    key: str = Field("token", description="Key inside the Secret.", min_length=1, max_length=253)


class CaSecretKeyRef(ApiModel):
    """A key of a Secret in the service's namespace holding a CA bundle."""

    name: str = Field(description="Secret name.", min_length=1, max_length=253)
    # ca.crt: the key cert-manager, kubernetes.io/tls Secrets and service-account tokens use
    # (and the chart's prometheus.auth.caSecret.key), so one default fits every CA Secret.
    key: str = Field("ca.crt", description="Key inside the Secret holding the PEM bundle.", min_length=1,
                     max_length=253)


class ModelCache(ApiModel):
    """Where model weights are cached, and how the hub is reached."""

    type: Optional[Literal["EmptyDir", "PersistentVolumeClaim"]] = Field(
        None,
        description="PersistentVolumeClaim keeps the weights across restarts; EmptyDir downloads them "
        "at every pod start, and every change of K the operator makes restarts the pods (status "
        "condition ModelCacheEphemeral warns while autotune runs). Unset: PersistentVolumeClaim "
        "when claimName is given, else EmptyDir.",
    )
    claim_name: Optional[str] = Field(
        None,
        description="PersistentVolumeClaim to mount (ReadWriteMany when replicas run on several "
        "nodes); giving it selects type PersistentVolumeClaim unless type says otherwise.",
        max_length=253,
    )
    size_limit: Optional[str] = Field(None, description="Size limit of the EmptyDir.", max_length=32)
    mount_path: str = Field(
        "/root/.cache/huggingface",
        description="Where the cache is mounted; HF_HOME points here.",
        min_length=1,
        max_length=1024,
    )
    hf_token_secret: Optional[SecretKeyRef] = Field(
        None,
        description="Secret holding a Hugging Face token, for gated models. Passed as the HF_TOKEN "
        "environment variable from the Secret, never in arguments.",
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.type) || self.type != 'PersistentVolumeClaim' || has(self.claimName)",
            message="claimName is required when type is PersistentVolumeClaim",
            check=lambda m: m.type != "PersistentVolumeClaim" or m.claim_name is not None,
            field=".claimName",
        ),
    )

    @property
    def effective_type(self) -> str:
        """The volume rendered: the declared type, else a PVC when a claim is named."""
        return self.type or ("PersistentVolumeClaim" if self.claim_name else "EmptyDir")


class PodOptions(ApiModel):
    """Pass-through for the vLLM pods that platform teams expect."""

    annotations: AnnotationMap = StringMap("Extra pod annotations.", max_items=16, max_key=253, max_value=512)
    labels: LabelMap = StringMap(
        "Extra pod labels. The operator's own labels win on conflict.",
        max_items=16, max_key=LABEL_KEY_MAX, max_value=LABEL_VALUE_MAX,
    )
    service_account_name: Optional[str] = Field(None, description="ServiceAccount of the pods.", max_length=253)
    image_pull_secrets: list[str] = Field(
        default_factory=list,
        description="Names of Secrets for pulling the image.",
        max_length=8,
        json_schema_extra={"items": {"type": "string", "maxLength": 253}},
    )
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Extra pod volumes (Kubernetes Volume objects).",
        max_length=16,
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    volume_mounts: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Extra mounts of the vLLM container (Kubernetes VolumeMount objects).",
        max_length=16,
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    run_as_user: Optional[int] = Field(
        None,
        description="Run vLLM as this non-root UID. The operator then points every cache "
        "(HF_HOME, VLLM_CACHE_ROOT, XDG_CACHE_HOME, TRITON_CACHE_DIR) at writable volumes.",
        ge=1,
        le=2147483647,
    )


# ---------------------------------------------------------------------------------------------
# spec.autotune, spec.metrics
# ---------------------------------------------------------------------------------------------


class AutotuneMode(str, Enum):
    """What the operator does with its decisions."""

    AUTO = "Auto"
    RECOMMEND = "Recommend"
    OFF = "Off"


class ScheduleMode(str, Enum):
    """Whether the operator chooses per-batch-size K schedules (autotune.schedules)."""

    AUTO = "Auto"
    OFF = "Off"


class LatencySLO(ApiModel):
    """Latency objectives; when P95 breaks one and speculation is the likely cause, the operator
    falls back fast."""

    p95_end_to_end: OptionalPositiveDuration = Duration(
        None, "P95 end-to-end request latency objective (`2s`).", positive=True
    )
    p95_time_per_output_token: OptionalPositiveDuration = Duration(
        None,
        "P95 time per output token objective (`50ms`), per request: decode time / (tokens - 1).",
        positive=True,
    )


class ExperimentsSpec(ApiModel):
    """Canary experiments: a change the model predicts runs first on a canary replica beside the
    running config, on the same traffic, and reaches every replica only when measured better."""

    enabled: bool = Field(
        True,
        description="In Auto mode, test every re-probe (speculation back on) and every change of K "
        "on a canary before it reaches every replica, instead of restarting all of them on a "
        "prediction. Needs spec.replicas >= replicas + 1, or maxExtraReplicas with "
        "rollout.maxSurge > 0; otherwise the operator changes every replica at once as without "
        "experiments and says why in status.recommendation. Safety moves (turning speculation off "
        "on an acceptance collapse or an SLO breach) are never canaried.",
    )
    replicas: int = Field(
        1,
        description="Replicas of the canary Deployment (`<name>-canary`). More replicas measure "
        "faster and expose more traffic to the candidate.",
        ge=1,
        le=8,
    )
    max_extra_replicas: int = Field(
        0,
        description="Canary replicas that may run beside spec.replicas (extra GPUs), used only when "
        "rollout.maxSurge > 0. With 0 the main Deployment gives up as many replicas as the canary "
        "has while an experiment runs (capacity-neutral, no extra GPU).",
        ge=0,
        le=8,
    )
    max_duration: PositiveDuration = Duration(
        "30m",
        "Longest an experiment runs; without a clear difference by then it ends (AbortTimeout) and "
        "the running config stays. Longer finds smaller differences and keeps a canary longer.",
        positive=True,
    )
    min_requests: int = Field(
        200,
        description="Requests each side (canary and running config) must serve before a verdict on "
        "speed (an SLO breach or maxDuration ends an experiment regardless). Fewer ends experiments "
        "sooner on noisier evidence.",
        ge=1,
        le=10_000_000,
    )
    min_effect: float = Field(
        0.03,
        description="Smallest measured change of time per output token worth a rollout (0.03: 3 %). "
        "A candidate within it ends AbortNoGain: a restart of every replica is not free.",
        ge=0.0,
        le=0.5,
    )
    control: bool = Field(
        True,
        description="Test speculation off on a canary: periodically against a config that has run "
        "unchanged for controlInterval (the measured answer to whether speculation still pays), and once, "
        "for one window, when the running config's step time is 15% or more above the performance model's "
        "prior (a Calibrate experiment: is the draft or the target what costs more than expected?). Each "
        "borrows a replica (or uses maxExtraReplicas) while it runs. false: neither.",
    )
    control_interval: PositiveDuration = Duration(
        "168h",
        "How long speculation runs unchanged before a control experiment (speculation off on the "
        "canary) checks that it still pays.",
        positive=True,
    )


class Autotune(ApiModel):
    """The control loop: how often it looks, how sure it must be, how often it may restart pods."""

    mode: AutotuneMode = Field(
        AutotuneMode.AUTO,
        description="Auto changes K and turns speculation off/on; Recommend computes and reports "
        "in status without changing anything; Off runs numSpeculativeTokens as declared.",
    )
    evaluation_interval: PositiveDuration = Duration(
        "1m", "How often the service's metrics are evaluated.", positive=True
    )
    window: PositiveDuration = Duration(
        "5m", "Metrics window of each evaluation (rate windows). Longer is steadier, shorter reacts faster.",
        positive=True,
    )
    warmup: str = Duration(
        "2m",
        "Time after a config becomes fully live before its metrics count (caches fill, CUDA graphs "
        "warm up).",
    )
    min_drafts: int = Field(
        2000,
        description="Drafted tokens a window needs before acceptance is trusted.",
        ge=1,
        le=100_000_000,
    )
    min_requests: int = Field(
        20, description="Finished requests a window needs before latency is trusted.", ge=1, le=10_000_000
    )
    acceptance_floor: Optional[float] = Field(
        None,
        description="Per-token acceptance (alpha) below which speculation is turned off (or K set to "
        "minK when allowDisable is false). Default by method: 0.35 for draft_model (where K=1 "
        "stops paying for the operator's prior at a batch of 8; field reports put a draft model's "
        "break-even near 0.3 to 0.4), 0.15 for eagle, eagle3 and mtp (the same measure: a head "
        "drafts for about a tenth of a target step), 0.35 for ngram and suffix (their acceptance "
        "comes in bursts). Set it higher to turn speculation off sooner; lower, to keep a cheap "
        "draft on at lower acceptance.",
        ge=0.0,
        le=1.0,
    )
    slo: LatencySLO = Field(default_factory=LatencySLO, description="Latency objectives.")
    cooldown: str = Duration("10m", "Least time between two changes (each change restarts pods).")
    max_changes_per_hour: int = Field(
        4, description="Change budget: most speculation changes in any hour.", ge=0, le=60
    )
    allow_outages: bool = Field(
        False,
        description="Let a change restart pods when the replicas left serving during its rollout "
        "cannot carry the load: with one replica and rollout.maxUnavailable 1 (maxSurge 0, the "
        "default) every change is a full outage for a model load. false (the default): such a "
        "change waits until the model says the replicas left serving carry the present load, and "
        "when none would be left serving it stays a recommendation (status.recommendation, "
        "condition OutageRisk). A service already past its capacity may still restart its way "
        "out when replicas stay serving. To let autotune act without outages, set "
        "rollout.maxSurge 1 and maxUnavailable 0 (a spare GPU during each rollout) or run 2 or "
        "more replicas. A canary that borrows a replica waits by the same rule. true: changes go "
        "ahead, priced by the policy against the outage they cause.",
    )
    startup_failure_retry: str = Duration(
        "6h",
        "When pods of a speculative config fail to start for a reason the operator cannot classify, "
        "how long before speculation is tried again. Known causes (vocabulary mismatch, out of "
        "memory, unsupported method...) wait for a spec change.",
    )
    reprobe_interval: str = Duration(
        "30m",
        "With speculation off, how long before it is tried again to learn whether it pays now "
        "(speculation off hides acceptance).",
    )
    experiments: ExperimentsSpec = Field(
        default_factory=ExperimentsSpec,
        description="Canary experiments: measure a re-probe or a change of K on a canary replica "
        "before it reaches every replica.",
    )
    schedules: ScheduleMode = Field(
        ScheduleMode.AUTO,
        description="Auto (the default) lets the operator choose a per-batch-size K schedule (vLLM's "
        "num_speculative_tokens_per_batch_size, 0.24 and later): a few ranges of the running batch "
        "size, each with its K (0 = no drafting there), chosen from the measured step time, the "
        "per-position acceptance and the running batch the service sees, so load swings are "
        "followed inside the engine without restarts. A schedule is adopted only where the model "
        "predicts it saves at least 3 % per token over the batches seen (or stands in for a "
        "load-driven change of K), and with canary experiments on it first runs on a canary "
        "replica and reaches every replica only once measured there within the experiments' "
        "minimum effect of what the model predicts for it at that load (its gain may lie at loads "
        "the canary does not see). Adopting or replacing "
        "a schedule restarts the pods once. Costs: every step pays a per-step overhead (calibrated "
        "after rollout), vLLM may fall back from full to piecewise CUDA graphs, and the draft's "
        "weights and KV cache stay loaded even in ranges at K 0. After every schedule rollout the "
        "operator compares measured time per token with the plain K it replaced and reverts a "
        "schedule that is clearly worse, and at any time one under which the service falls behind "
        "a load that plain K is predicted to serve (a throughput collapse past a range's "
        "threshold); both are remembered in status.rejectedSchedules. In Recommend mode the "
        "schedule it would adopt is advice (status.recommendation.schedule) and nothing restarts. "
        "Off pins plain K. A declared speculation.perBatchSizeK is always the user's fixed choice. "
        "Versions or methods whose vLLM drops the table run plain K "
        "(status.speculation.scheduleReason says why).",
    )


class PrometheusAuth(ApiModel):
    """Credentials for Prometheus-compatible APIs (Thanos, Mimir, managed services)."""

    bearer_token_secret: Optional[SecretKeyRef] = Field(
        None,
        description="Secret in the service's own namespace holding a bearer token, sent only to "
        "prometheusUrl. The operator needs `get` on Secrets there (docs/operations/security.md).",
    )
    ca_secret: Optional[CaSecretKeyRef] = Field(
        None,
        description="Secret in the service's own namespace holding a CA bundle (PEM) for "
        "prometheusUrl. The operator needs `get` on Secrets there (docs/operations/security.md).",
    )
    headers: HeaderMap = StringMap(
        "Extra HTTP headers (for example `X-Scope-OrgID` for Mimir).", max_items=8, max_key=128, max_value=512
    )


class Metrics(ApiModel):
    """Where the service's metrics live and how they are scraped."""

    prometheus_url: Optional[str] = Field(
        None,
        description="Prometheus API base URL for this service, overriding the operator's default. "
        "Must start with a prefix the platform allows (operator setting allowedPrometheusUrls; "
        "by default only the operator's own Prometheus), else MetricsAvailable is False.",
        max_length=2048,
        pattern=r"^https?://",
    )
    auth: Optional[PrometheusAuth] = Field(None, description="Credentials for prometheusUrl.")
    selector: PromSelector = StringMap(
        "Extra label matchers added to every query (for example `cluster: gpu-east`). Keys are "
        "Prometheus label names, not starting with `__`.",
        max_items=8, max_key=128, max_value=256, key_rule=(PROM_LABEL_CEL, PROM_LABEL_MESSAGE),
    )
    pod_monitor: bool = Field(
        True,
        description="Render a PodMonitor (Prometheus Operator) for the vLLM pods. Applied only "
        "where the PodMonitor CRD is served.",
    )
    scrape_interval: PositiveDuration = Duration("15s", "Scrape interval of the PodMonitor.", positive=True)
    scrape_protocols: list[
        Literal["PrometheusProto", "OpenMetricsText0.0.1", "OpenMetricsText1.0.0", "PrometheusText0.0.4", "PrometheusText1.0.0"]
    ] = Field(
        default_factory=list,
        description="The PodMonitor's `scrapeProtocols` (Prometheus >= 2.49), most preferred first. "
        "Unset, Prometheus 2.x negotiates OpenMetrics and stores vLLM's series as `vllm_...`; "
        "`[PrometheusText0.0.4]` keeps vLLM's own `vllm:...` names. The operator reads either.",
        max_length=5,
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.scrapeProtocols) || "
            "self.scrapeProtocols.all(p, self.scrapeProtocols.filter(q, q == p).size() == 1)",
            message="metrics.scrapeProtocols lists a protocol twice: name each at most once",
            check=lambda m: len(set(m.scrape_protocols)) == len(m.scrape_protocols),
            field=".scrapeProtocols",
        ),
    )


# ---------------------------------------------------------------------------------------------
# spec
# ---------------------------------------------------------------------------------------------


def _target_tp(spec: "SpecDecodeServiceSpec") -> int:
    return spec.engine.tensor_parallel_size or max(spec.resources.gpus, 1)


class SpecDecodeServiceSpec(ApiModel):
    """What the user wants: the model, its draft, and the rules the operator tunes by. The
    operator never writes spec: its choices live in status and in the Deployment it owns."""

    model: TargetModel = Field(description="The target model.")
    speculation: Speculation = Field(description="Speculative decoding: method, draft and K bounds.")
    engine: Engine = Field(default_factory=Engine, description="The vLLM engine.")
    replicas: int = Field(
        1,
        description="vLLM pods. Scale subresource target for an HPA or KEDA. The operator also "
        "enforces its own limit (SPECDECODE_MAX_REPLICAS, default 32) and reports Degraded, "
        "reason InvalidSpec, above it.",
        ge=0,
        le=MAX_REPLICAS_SCHEMA,
    )
    rollout: Rollout = Field(default_factory=Rollout, description="Rollout of changes.")
    resources: Resources = Field(default_factory=Resources, description="Resources of each pod.")
    scheduling: Scheduling = Field(default_factory=Scheduling, description="Placement of the pods.")
    model_cache: ModelCache = Field(default_factory=ModelCache, description="Model weight cache.")
    autotune: Autotune = Field(default_factory=Autotune, description="The speculation control loop.")
    metrics: Metrics = Field(default_factory=Metrics, description="Metrics source and scraping.")
    pod: PodOptions = Field(default_factory=PodOptions, description="Pod pass-through options.")

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.speculation.draftTensorParallelSize) || "
            "self.speculation.draftTensorParallelSize == 1 || "
            "self.speculation.draftTensorParallelSize == "
            "(has(self.engine) && has(self.engine.tensorParallelSize) ? "
            "self.engine.tensorParallelSize : (has(self.resources) && has(self.resources.gpus) && "
            "self.resources.gpus > 0 ? self.resources.gpus : 1))",
            message="speculation.draftTensorParallelSize must be 1 or the target's tensor parallel "
            "size (engine.tensorParallelSize, else resources.gpus)",
            check=lambda s: s.speculation.draft_tensor_parallel_size in (None, 1, _target_tp(s)),
            field=".speculation.draftTensorParallelSize",
        ),
        Rule(
            cel="!has(self.engine) || !has(self.engine.tensorParallelSize) || !has(self.resources) "
            "|| !has(self.resources.gpus) || self.resources.gpus == 0 || "
            "self.engine.tensorParallelSize <= self.resources.gpus",
            message="engine.tensorParallelSize must not exceed resources.gpus: each pod needs a GPU "
            "per tensor-parallel rank",
            check=lambda s: s.engine.tensor_parallel_size is None
            or s.resources.gpus == 0
            or s.engine.tensor_parallel_size <= s.resources.gpus,
            field=".engine.tensorParallelSize",
        ),
    )

    @property
    def target_tensor_parallel_size(self) -> int:
        return _target_tp(self)

    @property
    def downloads_weights_at_start(self) -> bool:
        """True when every pod start downloads weights again: an EmptyDir cache and a target or
        draft named by hub id (an absolute path means weights on a volume of the user's own:
        an image volume, a node-local hostPath)."""
        if self.model_cache.effective_type != "EmptyDir":
            return False
        names = [self.model.name] + ([self.speculation.draft_model] if self.speculation.draft_model else [])
        return any(not name.startswith("/") for name in names)

    @property
    def acceptance_floor(self) -> float:
        """autotune.acceptanceFloor, or its method's default (`DEFAULT_ACCEPTANCE_FLOOR`)."""
        declared = self.autotune.acceptance_floor
        return DEFAULT_ACCEPTANCE_FLOOR[self.speculation.method] if declared is None else declared


# ---------------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------------


def Redacted(limit: int) -> Any:
    """A status text that may quote foreign text (logs, HTTP answers): redacted on every
    construction, so status read back compares equal to status computed anew."""
    return Annotated[str, AfterValidator(redact_limited(limit))]


class StatusModel(BaseModel):
    """Base of status objects: camelCase on the wire, unknown fields kept out of the way."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Condition(StatusModel):
    """A standard Kubernetes condition."""

    type: str = Field(description="Condition type: Ready, Progressing, Degraded, SpeculationEffective, "
                      "MetricsAvailable, DraftCompatible, ModelCacheEphemeral, Experimenting, OutageRisk "
                      "(True: the spec lets a change roll out below what carries the load) or SLOMet "
                      "(False: P95 latency over spec.autotune.slo).", max_length=64)
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="One CamelCase word for machines.", max_length=128)
    message: Redacted(4096) = Field("", description="What happened, with numbers, for people.", max_length=4096)
    last_transition_time: str = Field(description="When status last changed (RFC 3339).", max_length=64)
    observed_generation: Optional[int] = Field(None, description="Generation of the spec this reflects.")


class EffectiveSpeculation(StatusModel):
    """The speculation the operator runs now (what the Deployment is rendered with)."""

    enabled: bool = Field(description="Whether speculation is on.")
    method: Optional[str] = Field(None, description="Method in use.", max_length=32)
    k: Optional[int] = Field(None, description="num_speculative_tokens in use; absent when off.")
    since: Optional[str] = Field(None, description="When this speculation was chosen (RFC 3339).", max_length=64)
    reason: Optional[Redacted(1024)] = Field(None, description="Why it was chosen.", max_length=1024)
    cause: Optional[str] = Field(
        None,
        description="Why it was chosen, as one word: Declared, AutotuneOff, Policy, Bounds, StartupFailure "
        "or DraftIncompatible.",
        max_length=32,
    )
    config_hash: Optional[str] = Field(None, description="Hash of the rendered engine config.", max_length=64)
    live: Optional[bool] = Field(None, description="Whether every replica runs this config.")
    live_since: Optional[str] = Field(
        None,
        description="When every replica first ran this config and was ready (RFC 3339); metrics "
        "count for it after autotune.warmup from here.",
        max_length=64,
    )
    spec_hash: Optional[str] = Field(
        None,
        description="Hash of what spec declared about speculation when this was chosen; a new "
        "declaration restarts from the declared K.",
        max_length=64,
    )
    schedule: Optional[str] = Field(
        None,
        description="Per-batch-size K schedule chosen by the operator (autotune.schedules Auto), as "
        "`<first batch>-<last batch>:K<k>` ranges, the last open (`1-16:K4,17+:off`); absent: plain K.",
        max_length=256,
    )
    schedule_reason: Optional[Redacted(512)] = Field(
        None,
        description="Why no schedule runs although autotune.schedules is Auto (the vLLM version "
        "or method drops the table, a declared perBatchSizeK), or why the schedule was chosen.",
        max_length=512,
    )
    schedule_replaced_k: Optional[int] = Field(
        None, description="The plain K the schedule replaced (what a revert returns to); 0: "
        "speculation off, for a schedule a re-probe chose."
    )
    schedule_step_scale: Optional[float] = Field(
        None,
        description="Measured / prior step time of the plain K the schedule replaced: the "
        "calibration of the schedule's step model (its overhead, a replacement), and of the "
        "after-rollout check when that K measured nothing before (observations.plainBaseline).",
    )
    below_floor_since: Optional[str] = Field(
        None,
        description="When the short (guard) window of this config first showed acceptance "
        "confidently below autotune.acceptanceFloor, in evaluations that have all shown it since "
        "(RFC 3339); absent when the last evaluation did not. The collapse guard turns speculation "
        "off once a later window, mostly new data, still shows it: a shorter dip is not a collapse.",
        max_length=64,
    )


class PlainTimePerToken(StatusModel):
    """The engine time per output token a plain K measured on one full window, at its batch."""

    running_requests: float = Field(description="Mean running batch of a replica over that window.")
    seconds_per_output_token: float = Field(description="Engine seconds per output token over that window.")
    acceptance: Optional[float] = Field(
        None, ge=0, le=1,
        description="Draft acceptance over that window (fitted, first position): the check moves the "
        "measurement to the acceptance of its own window, since tokens per step change with it.",
    )


class PlainBaseline(StatusModel):
    """What the plain K measured while it ran, one full window per factor-2 band of the running
    batch: the baseline a schedule's after-rollout check compares with (autotune.schedules Auto)."""

    k: int = Field(description="The plain K measured.")
    points: list[PlainTimePerToken] = Field(
        default_factory=list, description="One per factor-2 band of the running batch, the latest.", max_length=16
    )


class Observations(StatusModel):
    """What the last evaluation saw, over its window, for the pods of the current config."""

    observed_at: Optional[str] = Field(None, description="Evaluation time (RFC 3339).", max_length=64)
    config_hash: Optional[str] = Field(None, description="Config the samples belong to.", max_length=64)
    window: Optional[str] = Field(None, description="Metrics window.", max_length=32)
    pods: Optional[int] = Field(None, description="Pods that contributed samples.")
    requests: Optional[float] = Field(None, description="Finished requests in the window (sample count).")
    request_rate: Optional[float] = Field(None, description="Finished requests per second, all replicas.")
    arrival_rate: Optional[float] = Field(
        None,
        description="Requests arriving per second, all replicas: the finished ones plus what the waiting "
        "queues and running batches gained over the window. With requests waiting and this 10% or more "
        "above requestRate the replicas are past their capacity, and a per-batch-size schedule that drafts "
        "at their batch gives way to the policy's move to less drafting.",
    )
    drafts: Optional[float] = Field(None, description="Drafts in the window (sample count).")
    acceptance_rate: Optional[float] = Field(None, description="Accepted / drafted tokens.")
    alpha: Optional[float] = Field(None, description="Estimated per-token acceptance.")
    recent_low_alpha: Optional[float] = Field(
        None,
        description="Lowest per-token acceptance of recent evaluations (a new low at once, forgotten "
        "over about an hour, kept while speculation is off): tuning moves are checked against it.",
    )
    recent_peak_request_rate: Optional[float] = Field(
        None,
        description="Highest finished requests per second of about the last day (a new peak at once; "
        "kept 26h after it was last seen, a load within 10% of it seeing it again; then falling to "
        "today's load over hours): where a rollout takes replicas away (rollout.maxSurge 0, or "
        "maxUnavailable >= 1), a move to a config that could not carry "
        "it is held, since no restart back would be affordable when that load returns.",
    )
    recent_peak_at: Optional[str] = Field(
        None, description="When recentPeakRequestRate was last seen (RFC 3339).", max_length=64
    )
    last_alpha: Optional[float] = Field(
        None,
        description="Per-token acceptance last measured on the running config: the latest window "
        "with drafts (kept through idle windows and metrics outages: the memory that the draft paid).",
    )
    alpha_per_position: Optional[list[Optional[float]]] = Field(
        None,
        description="Conditional acceptance at each draft position: null where a position had no "
        "trials, and past position 0 while a per-batch-size K schedule drafts different Ks (vLLM "
        "counts accepted tokens per position, not drafted ones, so those positions' trials are "
        "unknown; alpha is then position 0's rate).",
        max_length=32,
    )
    mean_accepted_length: Optional[float] = Field(None, description="Accepted tokens per draft.")
    p95_end_to_end_seconds: Optional[float] = Field(None, description="P95 end-to-end latency, seconds.")
    mean_end_to_end_seconds: Optional[float] = Field(None, description="Mean end-to-end latency, seconds.")
    p95_time_per_output_token_seconds: Optional[float] = Field(None, description="P95 time per output token, seconds.")
    mean_time_per_output_token_seconds: Optional[float] = Field(None, description="Mean time per output token, seconds.")
    mean_step_seconds: Optional[float] = Field(
        None, description="Mean engine step time (inter-token latency sum / count), seconds."
    )
    running_requests: Optional[float] = Field(None, description="Mean running batch per replica.")
    peak_running_requests: Optional[float] = Field(
        None, description="Largest running batch of one replica in the window (max_over_time)."
    )
    recent_low_running_requests: Optional[float] = Field(
        None,
        description="Smallest mean running batch of a replica in recent evaluations (a new low at "
        "once, forgotten over hours; autotune.schedules Auto only): the bottom of the batch range a "
        "per-batch-size K schedule is chosen for.",
    )
    recent_peak_running_requests: Optional[float] = Field(
        None,
        description="Largest running batch of a replica in recent evaluations (a new peak at once, "
        "forgotten over hours; autotune.schedules Auto only): the top of that range.",
    )
    schedule_overhead_seconds: Optional[float] = Field(
        None,
        description="Per-step cost of running under a per-batch-size K schedule, calibrated from "
        "the measured step time after a schedule rollout (kept across rollouts).",
    )
    plain_baseline: Optional[PlainBaseline] = Field(
        None,
        description="Engine time per output token the plain K measured on full windows before a "
        "schedule replaced it (autotune.schedules Auto; kept while that K or its schedule runs): "
        "what the schedule's after-rollout check compares its own measurement with.",
    )
    waiting_requests: Optional[float] = Field(None, description="Mean queued requests per replica.")
    kv_cache_usage: Optional[float] = Field(None, description="KV-cache usage, 0 to 1.")
    preemption_rate: Optional[float] = Field(None, description="Preemptions per second.")
    generation_tokens_per_second: Optional[float] = Field(None, description="Generated tokens per second.")
    staleness_seconds: Optional[float] = Field(None, description="Age of the newest sample at evaluation.")
    metric_names: Optional[str] = Field(
        None,
        description="How Prometheus stores vLLM's series: `vllm:` (vLLM's own names) or `vllm_` "
        "(Prometheus 2.x negotiated OpenMetrics and the server escaped the colon); both while the "
        "two exist. The operator reads either.",
        max_length=32,
    )


class Recommendation(StatusModel):
    """The policy's current advice (acted on in Auto mode, only reported in Recommend mode)."""

    action: str = Field(description="hold, set_k, disable or enable.", max_length=32)
    enabled: bool = Field(description="Whether speculation should be on.")
    k: Optional[int] = Field(None, description="Recommended K.")
    schedule: Optional[str] = Field(
        None, description="Recommended per-batch-size K schedule (status.speculation.schedule's form; "
        "autotune.schedules Auto); k is then its largest K. Absent for plain K.", max_length=256,
    )
    reason: Redacted(2048) = Field("", description="Why, with numbers.", max_length=2048)
    predicted_speedup: Optional[float] = Field(
        None, description="Predicted speed of the recommendation relative to the current config."
    )
    at: Optional[str] = Field(None, description="When it was computed (RFC 3339).", max_length=64)


class LoadHistory(StatusModel):
    """The service's request rate per bucket over about the last day: what the plan's forecast
    is made from (kept here so that a restarted operator forecasts as the old one did)."""

    start: Optional[str] = Field(None, description="Start of the first bucket (RFC 3339).", max_length=64)
    bucket_seconds: int = Field(600, description="Length of one bucket, seconds.")
    rates: list[Optional[float]] = Field(
        default_factory=list,
        description="Requests per second arriving in each bucket (the long window's rate at the first "
        "evaluation inside it), oldest first; null where no evaluation saw the service.",
        max_length=160,
    )


class PlanStatus(StatusModel):
    """The plan the last evaluation made: what it expects and what it would run when. Only its
    first slot is acted on; the next evaluation plans again on newer metrics."""

    at: Optional[str] = Field(None, description="When it was made (RFC 3339).", max_length=64)
    configs: list[str] = Field(
        default_factory=list, description="The config planned for each slot (off, K=<k>, or a schedule).",
        max_length=16,
    )
    slot_seconds: list[int] = Field(default_factory=list, description="Length of each slot, seconds.", max_length=16)
    forecast_request_rate: list[float] = Field(
        default_factory=list, description="The request rate the forecast expects in each slot.", max_length=16,
    )
    forecast_method: Optional[str] = Field(
        None,
        description="seasonal (the load repeats its history with periodSeconds), trend (the present with its "
        "rise or fall) or present (the load stays).", max_length=16,
    )
    period_seconds: Optional[int] = Field(None, description="The period a seasonal forecast follows.")
    gain: Optional[float] = Field(
        None,
        description="How much better the plan scores than the best plan that keeps the running config now "
        "(0: it keeps it; a move needs autotune's hysteresis).",
    )


class DecisionRecord(StatusModel):
    """One change (or recommended change) of speculation."""

    time: str = Field(description="When (RFC 3339).", max_length=64)
    action: str = Field(description="set_k, disable, enable or fallback.", max_length=32)
    rule: Optional[str] = Field(
        None, description="The policy's rule that decided: tune, hedge, peak-readiness, reprobe, experiment, "
        "schedule, fast-fallback, floor, collapse, slo-guard, bounds, ... (the names `specdecode bench trace` "
        "prints). Absent for a start-up failure's fallback and in records written before the operator kept "
        "it.", max_length=32,
    )
    from_k: Optional[int] = Field(None, description="K before; absent when speculation was off.")
    to_k: Optional[int] = Field(None, description="K after; absent when speculation is off.")
    applied: bool = Field(True, description="False for Recommend mode: reported, not acted on.")
    reason: Redacted(1024) = Field("", description="Why, with numbers.", max_length=1024)
    alpha: Optional[float] = Field(
        None, description="Acceptance measured on the config being left (remembered for re-probes)."
    )
    step_scale: Optional[float] = Field(
        None, description="Measured / prior engine step time of the config being left (calibration memory)."
    )
    from_schedule: Optional[str] = Field(
        None, description="Per-batch-size K schedule before (status.speculation.schedule's form).", max_length=256
    )
    to_schedule: Optional[str] = Field(
        None, description="Per-batch-size K schedule after; absent for plain K.", max_length=256
    )


class FailedConfig(StatusModel):
    """A speculative config whose pods could not start: not retried until the spec changes."""

    config_hash: str = Field(description="Hash of the failed engine config.", max_length=64)
    k: Optional[int] = Field(None, description="K of the failed config; absent when speculation was off.")
    spec_generation: int = Field(description="Spec generation it failed under.")
    cause: str = Field(description="Classified cause (VocabMismatch, OutOfMemory, ..., Unknown).", max_length=64)
    classified: bool = Field(
        True,
        description="Whether the cause is known. Known causes are not retried until the spec changes; "
        "unknown ones again after autotune.startupFailureRetry.",
    )
    message: Redacted(2048) = Field("", description="The log line that shows it.", max_length=2048)
    at: str = Field(description="When (RFC 3339).", max_length=64)


class ExperimentRecord(StatusModel):
    """One canary experiment: the candidate against the running config on the same traffic."""

    purpose: Literal["Reprobe", "Change", "Control", "Calibrate"] = Field(
        description="Reprobe (speculation off: does it pay now?), Change (a new K or schedule before "
        "it reaches every replica), Control (speculation off against a long-running config) or Calibrate "
        "(speculation off for one window beside a config whose step time is well above the model's prior: "
        "is the draft or the target the costlier part?)."
    )
    candidate: str = Field(description="The candidate config (`ngram K=5`, `off`, `eagle 1-32:K6,33+:K3`).",
                           max_length=128)
    candidate_enabled: bool = Field(False, description="Whether the canary runs speculation.")
    candidate_k: Optional[int] = Field(
        None, description="num_speculative_tokens on the canary; absent when it runs speculation off.", ge=1, le=16
    )
    candidate_schedule: Optional[str] = Field(
        None, description="Per-batch-size K schedule on the canary (status.speculation.schedule's form; "
        "autotune.schedules Auto); candidateK is then its largest K. Absent for plain K or off.", max_length=256,
    )
    predicted_effect: Optional[float] = Field(
        None, description="A schedule's canary: the performance model's relative change of time per output "
        "token against the running config at the load it was chosen (-0.02: 2 % faster). A schedule's gain "
        "may lie at loads the canary does not see, so it is promoted once measured no more than the "
        "experiments' minimum effect worse than this, and aborted once measured clearly worse.",
    )
    candidate_hash: str = Field(description="Config hash of the canary's pods.", max_length=64)
    incumbent_hash: str = Field(description="Config hash of the running config.", max_length=64)
    started_at: str = Field(description="When the canary was created (RFC 3339).", max_length=64)
    ended_at: Optional[str] = Field(None, description="When it ended (RFC 3339); absent while it runs.", max_length=64)
    verdict: Literal[
        "Running", "Promote", "AbortWorse", "AbortNoGain", "AbortSLO", "AbortTimeout", "Cancelled", "Measured",
    ] = Field(
        "Running", description="How it ended: Promote rolls the candidate out; every Abort keeps the running "
        "config; Cancelled ended it from outside (the spec changed, autotune left Auto, the canary failed); "
        "Measured: a Calibrate experiment measured both step times and keeps the running config."
    )
    reason: Redacted(512) = Field("", description="Why, with numbers.", max_length=512)
    effect: Optional[float] = Field(
        None, description="Measured relative change of time per output token (-0.08: 8 % faster)."
    )
    effect_low: Optional[float] = Field(None, description="Lower end of the always-valid confidence interval of effect.")
    effect_high: Optional[float] = Field(None, description="Upper end of the always-valid confidence interval of effect.")
    windows: int = Field(0, description="Evaluation windows measured.", ge=0)
    candidate_step_scale: Optional[float] = Field(
        None, description="The canary's measured step time over the performance model's prior at its batch, "
        "in the last window that measured both arms on the same traffic (a window where one side finished far "
        "more requests per replica, draining a backlog, is not taken). With incumbentStepScale, from the same "
        "window and traffic, it calibrates what speculation costs on this hardware against the config without it. "
        "Absent until a window measured both.", ge=0.0,
    )
    incumbent_step_scale: Optional[float] = Field(
        None, description="The same for the running config's replicas in that window.", ge=0.0,
    )
    requests: Optional[float] = Field(None, description="Requests the canary served during the experiment.")
    incumbent_requests: Optional[float] = Field(
        None, description="Requests the running config's replicas served in the same windows."
    )
    paired_windows: int = Field(0, description="Windows with traffic on both sides (the test's sample size).", ge=0)
    log_ratio_sum: float = Field(
        0.0, description="Sum over paired windows of log(canary / running time per output token) (resume state)."
    )
    log_ratio_sum_squares: float = Field(0.0, description="Sum of their squares (resume state).", ge=0.0)
    last_window_at: Optional[str] = Field(
        None, description="End of the last window measured (RFC 3339; resume state: windows never overlap).",
        max_length=64,
    )
    promotion_waits_since: Optional[str] = Field(
        None, description="When the test reached Promote while rolling the candidate out would overload the "
        "replicas left serving (RFC 3339); absent until then. The canary keeps serving and the verdict stands "
        "until the load allows the rollout: later windows are checked for SLOs and the acceptance floor but "
        "not added to the evidence, which was measured at the load the candidate is promoted for.",
        max_length=64,
    )

    @property
    def running(self) -> bool:
        return self.verdict == "Running"
class RejectedSchedule(StatusModel):
    """A per-batch-size K schedule the operator reverted: not chosen again for this spec."""

    schedule: str = Field(description="The schedule (as in status.speculation.schedule).", max_length=256)
    reason: Redacted(1024) = Field("", description="Why it was reverted, with the measured numbers.", max_length=1024)
    spec_hash: Optional[str] = Field(
        None, description="Declared speculation it was measured under (a new declaration forgets it).", max_length=64
    )
    at: str = Field(description="When (RFC 3339).", max_length=64)


class SpecDecodeServiceStatus(StatusModel):
    """What the operator sees and chose. Written by the operator only."""

    phase: Optional[Literal["Pending", "Progressing", "Serving", "Degraded"]] = Field(
        None, description="Pending, Progressing (a rollout is under way), Serving or Degraded."
    )
    observed_generation: Optional[int] = Field(None, description="Spec generation last reconciled.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.", max_length=16)
    replicas: Optional[int] = Field(None, description="vLLM pods that exist (scale subresource).")
    ready_replicas: Optional[int] = Field(None, description="vLLM pods ready to serve.")
    selector: Optional[str] = Field(None, description="Label selector of the pods (scale subresource).", max_length=1024)
    speculation: Optional[EffectiveSpeculation] = Field(None, description="Speculation in effect.")
    observations: Optional[Observations] = Field(None, description="Last evaluation's metrics.")
    recommendation: Optional[Recommendation] = Field(None, description="The policy's current advice.")
    plan: Optional[PlanStatus] = Field(None, description="The plan behind the advice: forecast and configs per slot.")
    load_history: Optional[LoadHistory] = Field(None, description="Request rate per bucket of about the last day.")
    history: list[DecisionRecord] = Field(
        default_factory=list,
        description=f"Last {C.MAX_DECISION_HISTORY} decisions, newest last.",
        max_length=C.MAX_DECISION_HISTORY,
    )
    failed_configs: list[FailedConfig] = Field(
        default_factory=list, description="Speculative configs that could not start.", max_length=16
    )
    experiments: list[ExperimentRecord] = Field(
        default_factory=list,
        description=f"Last {C.MAX_EXPERIMENTS} canary experiments, newest last; one runs while the last "
        "has verdict Running.",
        max_length=C.MAX_EXPERIMENTS,
    )
    rejected_schedules: list[RejectedSchedule] = Field(
        default_factory=list,
        description="Per-batch-size K schedules reverted because they measured clearly worse than "
        "the plain K they replaced after rollout, or fell behind a load it would serve; not chosen "
        "again for this spec.",
        max_length=8,
    )


class SpecDecodeService(ApiModel):
    """A vLLM service with speculative decoding, tuned by the operator from its own metrics."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    api_version: Literal["serving.specdecode.io/v1alpha1"] = Field(
        description="serving.specdecode.io/v1alpha1"
    )
    kind: Literal["SpecDecodeService"] = Field(description="SpecDecodeService")
    metadata: dict[str, Any] = Field(description="Standard object metadata.")
    spec: SpecDecodeServiceSpec = Field(description="Desired state.")
    status: Optional[SpecDecodeServiceStatus] = Field(None, description="Observed state.")

    @field_validator("metadata")
    @classmethod
    def _named(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        name = metadata.get("name")
        if not name:
            raise ValueError("metadata.name is required")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 52:
            raise ValueError(
                "metadata.name must be a DNS label of at most 52 characters (lowercase letters, "
                "digits and '-'): child objects are named after it"
            )
        return metadata

    @property
    def name(self) -> str:
        return self.metadata["name"]

    @property
    def namespace(self) -> str:
        return self.metadata.get("namespace") or "default"


# ---------------------------------------------------------------------------------------------
# Parsing user input with messages that name the field
# ---------------------------------------------------------------------------------------------


class SpecError(ValueError):
    """A SpecDecodeService that breaks the API: one line naming the field and the fix."""


class SpecTooLarge(SpecError):
    """A spec over SPEC_MAX_BYTES: refused by `validate` and the operator, admitted by the
    apiserver (see SPEC_MAX_BYTES for why)."""


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _pass_through(spec: "SpecDecodeServiceSpec") -> list[Any]:
    """The free-form Kubernetes objects of a spec: only they can take it past the typed bound."""
    return [spec.scheduling.affinity, spec.pod.volumes, spec.pod.volume_mounts,
            [env.value_from for env in spec.engine.env]]


def check_spec_size(spec: "SpecDecodeServiceSpec") -> None:
    """Refuse a spec whose stored form exceeds SPEC_MAX_BYTES, naming its largest field. The
    typed fields stay under SPEC_BOUND_BYTES, so a spec with small pass-through objects (every
    evaluation parses the spec) is not serialized."""
    if SPEC_BOUND_BYTES + _json_bytes(_pass_through(spec)) <= SPEC_MAX_BYTES:
        return
    wire = spec.to_wire()
    size = _json_bytes(wire)
    if size <= SPEC_MAX_BYTES:
        return
    fields = {f"spec.{key}": value for key, value in wire.items()}
    for key, value in wire.items():
        if isinstance(value, dict):
            fields.update({f"spec.{key}.{sub}": item for sub, item in value.items()})
    largest, largest_value = max(((k, v) for k, v in fields.items() if k.count(".") == 2 or not isinstance(v, dict)),
                                 key=lambda kv: _json_bytes(kv[1]))
    raise SpecTooLarge(
        f"{largest}: {_json_bytes(largest_value) / 1024:.0f} KiB of JSON takes the spec to {size / 1024:.0f} KiB, "
        f"over the {SPEC_MAX_BYTES // 1024} KiB a spec may take: move large content (files, long value lists) "
        "into a ConfigMap or Secret and mount or reference it"
    )


def _field_path(loc: tuple[Any, ...], root: str) -> str:
    path = root
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith("function-"):
            continue
        else:
            path += f".{to_camel(str(part)) if '_' in str(part) else part}"
    return path


def describe_validation_error(err: ValidationError, root: str = "") -> str:
    """The first problem of a pydantic error as `field.path: what is wrong and how to fix it`."""
    first = err.errors(include_url=False)[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and "[" in p))
    path = _field_path(loc, root).lstrip(".") or root or "object"
    kind = first["type"]
    msg = first["msg"]
    if kind == "missing":
        text = "is required"
    elif kind == "extra_forbidden":
        text = "is not a field of this object; check the spelling against `kubectl explain sds.spec`"
    elif kind == "literal_error" or kind == "enum":
        text = msg.replace("Input should be", "must be")
    elif kind == "value_error":
        text = msg.removeprefix("Value error, ")
    else:
        text = msg.replace("Input should be", "must be")
    extra = len(err.errors()) - 1
    suffix = f" (and {extra} more problem{'s' if extra > 1 else ''})" if extra else ""
    return f"{path}: {text}{suffix}"


def parse_spec(spec: dict[str, Any]) -> SpecDecodeServiceSpec:
    """Validate a spec as the operator reads it from the apiserver."""
    try:
        parsed = SpecDecodeServiceSpec.model_validate(spec)
    except ValidationError as err:
        raise SpecError(describe_validation_error(err, root="spec")) from None
    check_spec_size(parsed)
    return parsed


def parse_service(obj: Any) -> SpecDecodeService:
    """Validate a whole SpecDecodeService document (as `specdecode validate` reads it)."""
    if not isinstance(obj, dict):
        raise SpecError("the document is not a mapping: expected a SpecDecodeService object")
    if obj.get("apiVersion") != C.API_VERSION or obj.get("kind") != C.KIND:
        raise SpecError(
            f"apiVersion/kind: expected {C.API_VERSION} {C.KIND}, got "
            f"{obj.get('apiVersion')!r} {obj.get('kind')!r}"
        )
    try:
        service = SpecDecodeService.model_validate(obj)
    except ValidationError as err:
        raise SpecError(describe_validation_error(err)) from None
    check_spec_size(service.spec)
    return service
