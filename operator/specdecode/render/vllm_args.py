"""vLLM's command line, by version: the speculative arguments we render and read back.

Two dialects exist (REFERENCE.md): the legacy flags (`--speculative-model`,
`--num-speculative-tokens`, ...) removed in 0.8.3, and the `--speculative-config` JSON that
exists from 0.8.2. We render JSON from 0.8.2 on, the legacy flags before, and the newest
dialect when the version is not a release number (`nightly`, a commit). Which keys and
methods a release accepts comes from `vllm_support`, built from the released wheels.

`parse_speculative_args` is the inverse, used by the simulator (which stands for vLLM pods)
and by tests: whatever we render must read back to the same method, model and K.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from packaging.version import InvalidVersion, Version

from . import features as support

SPECULATIVE_CONFIG_FLAG = "--speculative-config"
JSON_DIALECT_SINCE = Version("0.8.2")

# Finer inter-token buckets: vLLM's default TPOT buckets start at 10 ms, coarser than a
# speculative TPOT at low load (a few ms), so the policy could not tell configs apart.
FINE_LATENCY_BUCKETS = [
    0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04,
    0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
]


class UnsupportedConfig(ValueError):
    """The declared vLLM version cannot run what the spec asks for; ``field`` is the spec
    field to change."""

    def __init__(self, message: str, field: str = "spec.engine.version") -> None:
        super().__init__(message)
        self.field = field


def data_parallel_size(args: Sequence[str]) -> int:
    """`--data-parallel-size` / `-dp` among extra arguments (1 when absent or unreadable:
    vLLM itself refuses what it cannot parse)."""
    size = 1
    for i, arg in enumerate(args):
        value = None
        for flag in ("--data-parallel-size", "-dp"):
            if arg == flag and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
        if value is not None:
            try:
                size = int(value)
            except ValueError:
                pass
    return size


def release(version: str) -> Optional[Version]:
    """The release a version string names, or None for `nightly`, `main`, a commit..."""
    try:
        return Version(version.lstrip("v"))
    except InvalidVersion:
        return None


def chunked_prefill_args(enabled: Optional[bool], version: str) -> list[str]:
    """Chunked prefill on or off in the release's own form; nothing when unset (vLLM decides
    per model). Off is `--no-enable-chunked-prefill` from 0.8.5 on, `--enable-chunked-prefill=False`
    before (`vllm_support.NO_ENABLE_CHUNKED_PREFILL_FLAG`)."""
    if enabled is None:
        return []
    if enabled:
        return ["--enable-chunked-prefill"]
    rel = release(version)
    if rel is None or support.supports(support.NO_ENABLE_CHUNKED_PREFILL_FLAG, str(rel)):
        return ["--no-enable-chunked-prefill"]
    return ["--enable-chunked-prefill=False"]


@dataclass(frozen=True)
class SpeculativeConfig:
    """The speculative part of a vLLM command line, as vLLM reads it."""

    method: str
    num_speculative_tokens: int
    model: Optional[str] = None
    revision: Optional[str] = None
    draft_tensor_parallel_size: Optional[int] = None
    prompt_lookup_min: Optional[int] = None
    prompt_lookup_max: Optional[int] = None
    use_heterogeneous_vocab: bool = False
    per_batch_size: Optional[tuple[tuple[int, int, int], ...]] = None

    def as_json_dict(self) -> dict:
        """The `--speculative-config` JSON object, keys in a stable order, unset keys left out."""
        out: dict = {"method": self.method}
        if self.model is not None:
            out["model"] = self.model
        out["num_speculative_tokens"] = self.num_speculative_tokens
        optional = {
            "revision": self.revision,
            "draft_tensor_parallel_size": self.draft_tensor_parallel_size,
            "prompt_lookup_min": self.prompt_lookup_min,
            "prompt_lookup_max": self.prompt_lookup_max,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        if self.use_heterogeneous_vocab:
            out["use_heterogeneous_vocab"] = True
        if self.per_batch_size:
            out["num_speculative_tokens_per_batch_size"] = [list(row) for row in self.per_batch_size]
        return out


def speculative_args(config: Optional[SpeculativeConfig], version: str) -> list[str]:
    """The arguments that give vLLM `version` this speculation; [] when speculation is off."""
    if config is None:
        return []
    rel = release(version)
    _check_supported(config, version, rel)
    if rel is None or rel >= JSON_DIALECT_SINCE:
        if rel is not None:
            config = replace(config, method=_engine_method(config.method, str(rel)))
        return [SPECULATIVE_CONFIG_FLAG, json.dumps(config.as_json_dict(), separators=(",", ":"))]
    return _legacy_args(config)


# Before the JSON dialect, speculation was a draft model or the `[ngram]` pseudo-model.
LEGACY_METHODS = frozenset({"draft_model", "ngram"})


def _check_supported(config: SpeculativeConfig, version: str, rel: Optional[Version]) -> None:
    if rel is None:
        return  # unknown builds get the newest dialect; vLLM itself is the judge
    plain = str(rel)
    if rel < JSON_DIALECT_SINCE:
        if config.method not in LEGACY_METHODS:
            raise UnsupportedConfig(
                f"vLLM {version} predates --speculative-config and runs only draft_model and ngram "
                f"speculation: use vLLM {JSON_DIALECT_SINCE} or newer for {config.method}"
            )
    elif not support.method_supported(_engine_method(config.method, plain), plain):
        since = [first for first, _ in support.METHODS_BY_VERSION.get(config.method, ())]
        hint = f"vLLM {since[-1]} or newer runs it" if since else "no vLLM release runs it"
        raise UnsupportedConfig(f"vLLM {version} cannot run speculation method {config.method}: {hint}")
    if config.use_heterogeneous_vocab and not support.supports(support.HETEROGENEOUS_VOCAB, plain):
        raise UnsupportedConfig(
            f"vLLM {version} has no use_heterogeneous_vocab: use vLLM "
            f"{support.HETEROGENEOUS_VOCAB.first_version} or newer, or a draft with the target's vocabulary"
        )
    if config.per_batch_size and not support.supports(support.PER_BATCH_SIZE_K_TABLE, plain):
        raise UnsupportedConfig(
            f"vLLM {version} has no per-batch-size K table: remove speculation.perBatchSizeK or use "
            f"vLLM {support.PER_BATCH_SIZE_K_TABLE.first_version} or newer"
        )
    if config.per_batch_size:
        dropped = support.per_batch_size_table_dropped(_engine_method(config.method, plain), plain)
        if dropped:
            raise UnsupportedConfig(
                f"it would not take effect: {dropped}; remove it, or use a method the table works "
                f"with ({', '.join(sorted(support.PER_BATCH_SIZE_TABLE_V1_METHODS))})",
                field="spec.speculation.perBatchSizeK",
            )


def _engine_method(method: str, version: str) -> str:
    """The method name a release knows: MTP was `deepseek_mtp` before the generic `mtp`."""
    if method == "mtp":
        return support.mtp_method_name(version) or "mtp"
    return method


def _legacy_args(config: SpeculativeConfig) -> list[str]:
    """vLLM before 0.8.2: one flag per setting; n-gram is the pseudo-model `[ngram]`."""
    model = "[ngram]" if config.method == "ngram" else config.model
    args = ["--speculative-model", str(model), "--num-speculative-tokens", str(config.num_speculative_tokens)]
    if config.draft_tensor_parallel_size is not None:
        args += ["--speculative-draft-tensor-parallel-size", str(config.draft_tensor_parallel_size)]
    if config.prompt_lookup_max is not None:
        args += ["--ngram-prompt-lookup-max", str(config.prompt_lookup_max)]
    if config.prompt_lookup_min is not None:
        args += ["--ngram-prompt-lookup-min", str(config.prompt_lookup_min)]
    return args


def histogram_bucket_args(version: str) -> list[str]:
    """Finer latency buckets where the version has `--custom-histogram-buckets`."""
    rel = release(version)
    if rel is not None and not support.supports(support.CUSTOM_HISTOGRAM_BUCKETS, str(rel)):
        return []
    buckets = {"inter_token_latency": FINE_LATENCY_BUCKETS}
    return ["--custom-histogram-buckets", json.dumps(buckets, separators=(",", ":"))]


# ---------------------------------------------------------------------------------------------
# Reading a command line back
# ---------------------------------------------------------------------------------------------


def _flag_values(args: Sequence[str]) -> dict[str, str]:
    """`--flag value` and `--flag=value` pairs of a command line (last one wins, as argparse)."""
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and "=" in arg:
            flag, value = arg.split("=", 1)
            values[flag] = value
        elif arg.startswith("-") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            values[arg] = args[i + 1]
            i += 1
        elif arg.startswith("-"):
            values[arg] = ""
        i += 1
    return values


def parse_speculative_args(args: Sequence[str]) -> Optional[SpeculativeConfig]:
    """The speculation a vLLM command line configures, or None when it runs without.

    Reads both dialects. Raises ValueError on a malformed `--speculative-config`.
    """
    flags = _flag_values(args)
    raw = flags.get(SPECULATIVE_CONFIG_FLAG, flags.get("-sc"))
    if raw is not None:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"--speculative-config is not JSON: {err}") from None
        if not isinstance(data, dict):
            raise ValueError("--speculative-config must be a JSON object")
        method = data.get("method") or ("ngram" if data.get("model") == "ngram" else "draft_model")
        table = data.get("num_speculative_tokens_per_batch_size")
        return SpeculativeConfig(
            method=method,
            num_speculative_tokens=int(data.get("num_speculative_tokens", 0)),
            model=data.get("model"),
            revision=data.get("revision"),
            draft_tensor_parallel_size=data.get("draft_tensor_parallel_size"),
            prompt_lookup_min=data.get("prompt_lookup_min"),
            prompt_lookup_max=data.get("prompt_lookup_max"),
            use_heterogeneous_vocab=bool(data.get("use_heterogeneous_vocab", False)),
            per_batch_size=tuple(tuple(int(x) for x in row) for row in table) if table else None,
        )
    if "--speculative-model" in flags:
        model = flags["--speculative-model"]
        ngram = model == "[ngram]"
        return SpeculativeConfig(
            method="ngram" if ngram else "draft_model",
            num_speculative_tokens=int(flags.get("--num-speculative-tokens", 0)),
            model=None if ngram else model,
            draft_tensor_parallel_size=_int_or_none(flags.get("--speculative-draft-tensor-parallel-size")),
            prompt_lookup_min=_int_or_none(flags.get("--ngram-prompt-lookup-min")),
            prompt_lookup_max=_int_or_none(flags.get("--ngram-prompt-lookup-max")),
        )
    return None


def _int_or_none(value: Optional[str]) -> Optional[int]:
    return None if value is None else int(value)
