"""Which speculative-decoding features exist in which vLLM release.

A pure table, no I/O. Every entry was read from the released wheel on PyPI
(``pip download --no-deps vllm==X``), not from docs or the repository; each one cites
the wheel file and the line that shows it. Findings come from bisection over released
versions, so a range's bounds are the two releases that were actually opened: "first
0.24.0 (absent 0.23.0)" means both wheels were read. Patch releases between two read
wheels were not all opened; where that matters the entry says so.

Wheels read (exact file names; pip picks the highest build tag, e.g. ``-2-`` for 0.23.0):
0.8.2, 0.8.4, 0.8.5, 0.9.0, 0.9.2, 0.10.0, 0.10.1.1, 0.10.2, 0.11.0, 0.11.1, 0.12.0,
0.14.0, 0.14.1, 0.15.0, 0.16.0, 0.17.0, 0.17.1, 0.18.0, 0.18.1, 0.19.0, 0.19.1,
0.20.0, 0.21.0 (``vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64.whl``), 0.22.0,
0.23.0 (``vllm-0.23.0-2-cp38-abi3-manylinux_2_28_x86_64.whl``), 0.24.0, 0.25.0, 0.26.0,
0.28.0, 0.30.0, 0.31.0, 0.32.0, 0.33.0 (newest on PyPI when this was written).

Nothing here was checked below 0.8.2 (the first release with ``--speculative-config``);
``OLDEST_CHECKED`` is the floor of every range. A version newer than ``NEWEST_CHECKED``
is assumed to keep whatever 0.33.0 had (``last_version=None`` means "still present in
0.33.0").

Usage::

    supports(PER_BATCH_SIZE_K_TABLE, "0.24.0")   # True
    method_supported("draft_model", "0.12.0")      # False (NotImplementedError in V1)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

OLDEST_CHECKED = "0.8.2"
NEWEST_CHECKED = "0.33.0"
# The releases whose wheels were read for this table (the list above).
KNOWN_VERSIONS = (
    "0.8.2", "0.8.4", "0.8.5", "0.9.0", "0.9.2", "0.10.0", "0.10.1.1", "0.10.2", "0.11.0", "0.11.1",
    "0.12.0", "0.14.0", "0.14.1", "0.15.0", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0",
    "0.19.1", "0.20.0", "0.21.0", "0.22.0", "0.23.0", "0.24.0", "0.25.0", "0.26.0", "0.28.0", "0.30.0",
    "0.31.0", "0.32.0", "0.33.0",
)


def _wheel(version: str) -> str:
    """The wheel file pip downloads for ``version`` (as read for this table)."""
    special = {
        "0.8.2": "vllm-0.8.2-cp38-abi3-manylinux1_x86_64.whl",
        "0.8.4": "vllm-0.8.4-cp38-abi3-manylinux1_x86_64.whl",
        "0.8.5": "vllm-0.8.5-cp38-abi3-manylinux1_x86_64.whl",
        "0.9.0": "vllm-0.9.0-cp38-abi3-manylinux1_x86_64.whl",
        "0.9.2": "vllm-0.9.2-cp38-abi3-manylinux1_x86_64.whl",
        "0.10.0": "vllm-0.10.0-cp38-abi3-manylinux1_x86_64.whl",
        "0.10.2": "vllm-0.10.2-cp38-abi3-manylinux1_x86_64.whl",
        "0.11.0": "vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl",
        "0.11.1": "vllm-0.11.1-cp38-abi3-manylinux1_x86_64.whl",
        "0.20.0": "vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl",
        "0.21.0": "vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64.whl",
        "0.23.0": "vllm-0.23.0-2-cp38-abi3-manylinux_2_28_x86_64.whl",
    }
    if version in special:
        return special[version]
    tag = "manylinux_2_31" if Version(version) < Version("0.20.0") else "manylinux_2_28"
    return f"vllm-{version}-cp38-abi3-{tag}_x86_64.whl"


@dataclass(frozen=True)
class Feature:
    """A vLLM feature and the released versions that have it.

    ``first_version``: first release (in version order) that has it.
    ``last_version``: last release that has it, ``None`` if 0.33.0 still has it.
    ``evidence``: where the wheels show it (wheel file, path, line), including the
    newest release read that lacks it.
    """

    name: str
    first_version: str
    last_version: str | None = None
    evidence: tuple[str, ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        first = Version(self.first_version)
        if self.last_version is not None and Version(self.last_version) < first:
            raise ValueError(f"{self.name}: last_version before first_version")


def supports(feature: Feature, version: str) -> bool:
    """True when vLLM ``version`` has ``feature`` (PEP 440 comparison).

    Local or dev suffixes compare as PEP 440 says (``0.24.0rc1`` < ``0.24.0``).
    """
    v = Version(version)
    if v < Version(feature.first_version):
        return False
    return feature.last_version is None or v <= Version(feature.last_version)


# --------------------------------------------------------------------------------------
# Flags and config fields
# --------------------------------------------------------------------------------------

SPECULATIVE_CONFIG_FLAG = Feature(
    name="--speculative-config '<JSON>'",
    first_version="0.8.2",
    evidence=(
        f"{_wheel('0.8.2')}: vllm/engine/arg_utils.py:783 parser.add_argument('--speculative-config'",
        f"{_wheel('0.8.2')}: vllm/engine/arg_utils.py:1225-1230 legacy --speculative-model/"
        "--num-speculative-tokens still parsed, with a deprecation warning",
    ),
    note="Not bisected below 0.8.2 (REFERENCE: added 0.8.2). Render JSON for 0.8.2+.",
)

SPECULATIVE_CONFIG_SHORT_ALIAS = Feature(
    name="-sc (alias of --speculative-config)",
    first_version="0.19.0",
    evidence=(
        f"{_wheel('0.19.0')}: vllm/engine/arg_utils.py:1304 "
        '"--speculative-config", "-sc", **vllm_kwargs["speculative_config"]',
        f"{_wheel('0.18.1')}: vllm/engine/arg_utils.py adds only \"--speculative-config\" (no -sc)",
    ),
    note="REFERENCE implied -sc exists since 0.8.2; it does not. Always render the long flag.",
)

SPEC_SHORTHAND_FLAGS = Feature(
    name="--spec-method / --spec-model / --spec-tokens",
    first_version="0.22.0",
    evidence=(
        f"{_wheel('0.22.0')}: vllm/engine/arg_utils.py:1463 "
        'vllm_group.add_argument("--spec-method", **speculative_kwargs["method"])',
        f"{_wheel('0.22.0')}: vllm/engine/arg_utils.py:1679 "
        "f\"{flag} and --speculative-config['{key}'] are mutually exclusive\"",
        f"{_wheel('0.21.0')}: vllm/engine/arg_utils.py has no --spec-method",
    ),
    note="Shorthands map to method / model / num_speculative_tokens; giving a shorthand and "
    "the same key in the JSON is a ValueError (SHORTHAND_CONFLICT_MESSAGE).",
)

NO_ENABLE_CHUNKED_PREFILL_FLAG = Feature(
    name="--no-enable-chunked-prefill",
    first_version="0.8.5",
    evidence=(
        f"{_wheel('0.8.5')}: vllm/engine/arg_utils.py:150-152 a bool field gets "
        "argparse.BooleanOptionalAction (\"Creates --no-<name> and --<name> flags\"), "
        ":852-853 --enable-chunked-prefill from scheduler_kwargs",
        f"{_wheel('0.8.4')}: vllm/engine/arg_utils.py:784-789 --enable-chunked-prefill "
        "action=StoreBoolean, nargs=\"?\", const=\"True\": no --no- form, `False` turns it off",
        "vllm-0.8.0-cp38-abi3-manylinux1_x86_64.whl: vllm/engine/arg_utils.py:770-775 the same",
        "vllm-0.7.3-cp38-abi3-manylinux1_x86_64.whl: vllm/engine/arg_utils.py:745-750 the same; "
        "vllm/utils.py:1137-1146 StoreBoolean takes true or false (any case), else ValueError",
        f"{_wheel('0.33.0')}: vllm/engine/arg_utils.py:386 BooleanOptionalAction, :1785-1787",
    ),
    note="Before 0.8.5 chunked prefill is turned off with `--enable-chunked-prefill=False` "
    "(read down to 0.7.3, below OLDEST_CHECKED); argparse refuses --no-enable-chunked-prefill "
    "there as an unrecognized argument.",
)

PER_BATCH_SIZE_K_TABLE = Feature(
    name="speculative_config.num_speculative_tokens_per_batch_size",
    first_version="0.24.0",
    evidence=(
        f"{_wheel('0.24.0')}: vllm/config/speculative.py:162 "
        "num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None",
        f"{_wheel('0.24.0')}: vllm/v1/spec_decode/dynamic/utils.py:7 "
        "def validate_and_normalize_dynamic_sd_schedule (same file, byte for byte, in 0.33.0)",
        f"{_wheel('0.23.0')}: vllm/config/speculative.py has no num_speculative_tokens_per_batch_size",
        f"{_wheel('0.33.0')}: vllm/config/speculative.py:524 (field), "
        "vllm/v1/core/sched/scheduler.py:324-328 (validated when the scheduler is built)",
    ),
    note="See PER_BATCH_SIZE_RULES. In 0.24.0 the V2 model runner lists it as unsupported "
    "(vllm/config/vllm.py:2034-2035), so the engine falls back to the V1 model runner.",
)

PER_BATCH_SIZE_TABLE_OFF_WITH_DATA_PARALLEL = Feature(
    name="per-batch-size K table dropped (warning) when data_parallel_size > 1",
    first_version="0.26.0",
    evidence=(
        f"{_wheel('0.26.0')}: vllm/config/vllm.py:838 def _maybe_disable_dynamic_sd_for_data_parallel",
        f"{_wheel('0.25.0')}: vllm/config/vllm.py has no _maybe_disable_dynamic_sd_for_data_parallel",
    ),
    note="0.24.0 and 0.25.0 keep the table with DP > 1 (vLLM itself later says DP ranks can "
    "then diverge and deadlock): never render a table with DP > 1.",
)

PER_BATCH_SIZE_TABLE_V1_METHOD_LIMIT = Feature(
    name="per-batch-size K table dropped (warning) on Model Runner V1 for methods other than "
    "ngram, eagle, eagle3, mtp, draft_model, dflash",
    first_version="0.33.0",
    evidence=(
        f"{_wheel('0.33.0')}: vllm/config/vllm.py:1088-1108 _maybe_disable_dynamic_sd_for_v1: "
        'method in ("ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash")',
        f"{_wheel('0.32.0')}: vllm/config/vllm.py has no _maybe_disable_dynamic_sd_for_v1",
    ),
    note="suffix and custom_class always run on Model Runner V1 in 0.33.0 (V2 lists them as "
    "unsupported), so a table is ignored for them; V2 honours it for every method it runs.",
)

PER_BATCH_SIZE_TABLE_V1_METHODS: frozenset[str] = frozenset(
    {"ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash"}
)
"""Methods whose per-batch-size K table Model Runner V1 keeps (PER_BATCH_SIZE_TABLE_V1_METHOD_LIMIT).
Before 0.33.0 V1 honoured it for suffix too: 0.24.0 vllm/v1/worker/gpu_model_runner.py:4940-4944
and 0.32.0 :4824-4828 pass num_spec_tokens_to_schedule to the SuffixDecodingProposer."""

V1_ONLY_METHODS: frozenset[str] = frozenset({"suffix", "custom_class"})
"""Methods the V2 model runner does not run in 0.33.0: they always run on Model Runner V1."""


def per_batch_size_table_dropped(method: str, version: str, data_parallel_size: int = 1) -> str | None:
    """Why vLLM ``version`` would drop a per-batch-size K table (with only a warning in its
    log), or None when it keeps it. ``method`` as rendered."""
    if data_parallel_size > 1:
        if supports(PER_BATCH_SIZE_TABLE_OFF_WITH_DATA_PARALLEL, version):
            return f"vLLM {version} drops it with data parallelism ({data_parallel_size} ranks)"
        return (f"vLLM {version} keeps it with data parallelism, but ranks can then pick different K "
                "and deadlock (vLLM drops it from 0.26.0)")
    if (
        supports(PER_BATCH_SIZE_TABLE_V1_METHOD_LIMIT, version)
        and method in V1_ONLY_METHODS
        and method not in PER_BATCH_SIZE_TABLE_V1_METHODS
    ):
        return f"vLLM {version} runs {method} on Model Runner V1, which drops it for that method"
    return None


HETEROGENEOUS_VOCAB = Feature(
    name="speculative_config.use_heterogeneous_vocab",
    first_version="0.25.0",
    evidence=(
        f"{_wheel('0.25.0')}: vllm/config/speculative.py:145 use_heterogeneous_vocab: bool = False",
        f"{_wheel('0.25.0')}: vllm/config/speculative.py:1173-1182 only method='draft_model', "
        "only greedy draft sampling",
        f"{_wheel('0.24.0')}: vllm/config/speculative.py has no use_heterogeneous_vocab",
    ),
    note="0.33.0 also rejects it with use_local_argmax_reduction (speculative.py:2007) and the "
    "V2 model runner lists it as unsupported (vllm/config/vllm.py:3079-3081), so it runs on V1.",
)

VOCAB_SIZE_CHECK = Feature(
    name="ValueError when draft_model vocab size differs from the target's",
    first_version="0.15.0",
    evidence=(
        f"{_wheel('0.15.0')}: vllm/config/speculative.py:692 "
        'f"Target and draft model should have the same vocabulary size. "',
        f"{_wheel('0.33.0')}: vllm/config/speculative.py:2040-2056 "
        "verify_equal_vocab_size_if_draft_model, also called from "
        "vllm/v1/spec_decode/draft_model.py:57-61",
        f"{_wheel('0.9.2')}: vllm/spec_decode/spec_decode_worker.py only asserts "
        "(bare AssertionError, no text) in the V0 worker",
    ),
    note="Skipped when use_heterogeneous_vocab is true (0.25.0+). Only method='draft_model' "
    "is checked.",
)

CUSTOM_HISTOGRAM_BUCKETS = Feature(
    name="--custom-histogram-buckets '<JSON>'",
    first_version="0.32.0",
    evidence=(
        f"{_wheel('0.32.0')}: vllm/config/observability.py:70 "
        "custom_histogram_buckets: dict[str, list[float]] | None = None",
        f"{_wheel('0.32.0')}: vllm/engine/arg_utils.py:1668 \"--custom-histogram-buckets\"",
        f"{_wheel('0.31.0')}: neither vllm/config/observability.py nor arg_utils.py has it",
    ),
    note="JSON object: family -> non-empty list of finite, > 0, strictly increasing floats "
    "(booleans rejected); unknown family is a ValueError; a listed family replaces its "
    "defaults, others keep theirs. Families: HISTOGRAM_BUCKET_FAMILIES.",
)

DRAFT_TP_MUST_EQUAL_TARGET_FOR_DRAFT_MODEL = Feature(
    name="method=draft_model on Model Runner V1 needs draft_tensor_parallel_size == tensor_parallel_size",
    first_version="0.15.0",
    evidence=(
        f"{_wheel('0.15.0')}: vllm/v1/spec_decode/draft_model.py:82 "
        "\"must be the same. Got {draft_tp} and {tgt_tp}. \"",
        f"{_wheel('0.33.0')}: vllm/v1/spec_decode/draft_model.py:63-78 _raise_if_draft_tp_mismatch",
    ),
    note="The config itself accepts 1 or the target's TP (DRAFT_TP_RULES); the V1 draft-model "
    "proposer then demands equality. 0.33.0's V2 draft-model speculator "
    "(vllm/v1/worker/gpu/spec_decode/standalone_ar) has no such check. Render the target's TP "
    "(or leave it unset: the default is the target's TP).",
)

HISTOGRAM_BUCKET_FAMILIES = (
    "request_latency",
    "time_to_first_token",
    "inter_token_latency",
    "iteration_tokens",
    "request_params_n",
    "request_num_preemptions",
    "request_tokens",
    "kv_cache_residency",
)
"""``BucketFamilyKey`` in vllm/v1/metrics/buckets.py:15-24, identical in 0.32.0 and 0.33.0."""

FEATURES: tuple[Feature, ...] = (
    SPECULATIVE_CONFIG_FLAG,
    NO_ENABLE_CHUNKED_PREFILL_FLAG,
    SPECULATIVE_CONFIG_SHORT_ALIAS,
    SPEC_SHORTHAND_FLAGS,
    PER_BATCH_SIZE_K_TABLE,
    PER_BATCH_SIZE_TABLE_OFF_WITH_DATA_PARALLEL,
    PER_BATCH_SIZE_TABLE_V1_METHOD_LIMIT,
    HETEROGENEOUS_VOCAB,
    VOCAB_SIZE_CHECK,
    CUSTOM_HISTOGRAM_BUCKETS,
    DRAFT_TP_MUST_EQUAL_TARGET_FOR_DRAFT_MODEL,
)

# --------------------------------------------------------------------------------------
# Speculative methods
# --------------------------------------------------------------------------------------

Range = tuple[str, str | None]

METHODS_BY_VERSION: dict[str, tuple[Range, ...]] = {
    # Ranges are inclusive (first, last); last None = still accepted in 0.33.0.
    # "Supported" means a server with this method starts and speculates (not merely that
    # the string parses).
    "ngram": (("0.8.2", None),),
    "eagle": (("0.8.2", None),),
    # eagle3: absent 0.8.4; 0.8.5 config.py:2377 `if self.method in ('eagle', 'eagle3')`.
    "eagle3": (("0.8.5", None),),
    # draft_model: 0.8.2-0.9.2 only through the V0 engine (the V1 oracle falls back to V0,
    # 0.9.2 arg_utils.py:1441; it raises instead when VLLM_USE_V1=1 is set).
    # 0.10.0-0.14.1 raise NotImplementedError (DRAFT_MODEL_NOT_SUPPORTED_MESSAGE).
    # 0.15.0 adds vllm/v1/spec_decode/draft_model.py.
    "draft_model": (("0.8.2", "0.9.2"), ("0.15.0", None)),
    # Generic "mtp": absent 0.10.2 (config/__init__.py:1882 Literal has only deepseek_mtp);
    # 0.11.0 speculative.py:32-35 adds "mtp" and maps every *_mtp name to it.
    "mtp": (("0.11.0", None),),
    # deepseek_mtp: absent 0.8.5; 0.9.0 config.py:2263-2264. From 0.11.0 a deprecated
    # alias rewritten to "mtp" with a warning (still in MTPModelTypes in 0.33.0).
    "deepseek_mtp": (("0.9.0", None),),
    # suffix: absent 0.11.0; 0.11.1 speculative.py:48 (needs the arctic-inference package).
    "suffix": (("0.11.1", None),),
    "extract_hidden_states": (("0.17.0", None),),  # absent 0.16.0; 0.17.0 speculative.py:49
    "ngram_gpu": (("0.18.0", None),),  # absent 0.17.1; 0.18.0 speculative.py:50
    "dflash": (("0.20.0", None),),  # absent 0.19.1; 0.20.0 speculative.py:53
    "custom_class": (("0.22.0", None),),  # absent 0.21.0; 0.22.0 speculative.py:65
    "dspark": (("0.25.0", None),),  # absent 0.24.0; 0.25.0 speculative.py:60
    # medusa / mlp_speculator: in SpeculativeMethod up to 0.32.0 (speculative.py:75-76),
    # gone from the Literal in 0.33.0 (speculative.py:74-82): pydantic literal_error.
    "medusa": (("0.8.2", "0.32.0"),),
    "mlp_speculator": (("0.8.2", "0.32.0"),),
}

METHOD_EVIDENCE: dict[str, str] = {
    "eagle3": f"{_wheel('0.8.5')}: vllm/config.py:2377 and vllm/engine/arg_utils.py:1432; "
    f"absent in {_wheel('0.8.4')}",
    "draft_model": f"{_wheel('0.10.0')}: vllm/engine/arg_utils.py:1396-1401 and vllm/config.py:2852 "
    f"raise NotImplementedError; {_wheel('0.14.1')}: vllm/config/speculative.py:389-395 still "
    f"raises; {_wheel('0.15.0')}: vllm/v1/spec_decode/draft_model.py exists, no raise",
    "mtp": f"{_wheel('0.11.0')}: vllm/config/speculative.py:32-35 SpeculativeMethod includes "
    f"\"mtp\"; {_wheel('0.10.2')}: vllm/config/__init__.py:1882-1883 only \"deepseek_mtp\"",
    "deepseek_mtp": f"{_wheel('0.9.0')}: vllm/config.py:2263-2264",
    "suffix": f"{_wheel('0.11.1')}: vllm/config/speculative.py:48; absent in {_wheel('0.11.0')}",
    "extract_hidden_states": f"{_wheel('0.17.0')}: vllm/config/speculative.py:49; absent in "
    f"{_wheel('0.16.0')}",
    "ngram_gpu": f"{_wheel('0.18.0')}: vllm/config/speculative.py:50; absent in {_wheel('0.17.1')}",
    "dflash": f"{_wheel('0.20.0')}: vllm/config/speculative.py:53; absent in {_wheel('0.19.1')}",
    "custom_class": f"{_wheel('0.22.0')}: vllm/config/speculative.py:65; absent in {_wheel('0.21.0')}",
    "dspark": f"{_wheel('0.25.0')}: vllm/config/speculative.py:60; absent in {_wheel('0.24.0')}",
    "medusa": f"{_wheel('0.32.0')}: vllm/config/speculative.py:75; absent in {_wheel('0.33.0')}",
    "mlp_speculator": f"{_wheel('0.32.0')}: vllm/config/speculative.py:76; absent in "
    f"{_wheel('0.33.0')}",
}


def known_version(version: str) -> bool:
    """True for a release this table was read from or a patch release of one of their minors
    (0.33.1: same minor as 0.33.0), and for releases before 0.8.2, which get the legacy flags;
    False for typos, non-releases and releases past the table or between read minors."""
    try:
        wanted = Version(version.lstrip("v"))
    except InvalidVersion:
        return False
    if wanted < Version(OLDEST_CHECKED):
        return not (wanted.is_prerelease or wanted.is_devrelease)
    return any(Version(known).release[:2] == wanted.release[:2] for known in KNOWN_VERSIONS)


def method_supported(method: str, version: str) -> bool:
    """True when ``method`` works as speculative_config.method on vLLM ``version``."""
    v = Version(version)
    for first, last in METHODS_BY_VERSION.get(method, ()):
        if Version(first) <= v and (last is None or v <= Version(last)):
            return True
    return False


def methods_supported(version: str) -> frozenset[str]:
    """Every method name ``version`` accepts and runs."""
    return frozenset(m for m in METHODS_BY_VERSION if method_supported(m, version))


def mtp_method_name(version: str) -> str | None:
    """The method string to render for MTP heads: "mtp" (0.11.0+), "deepseek_mtp" before."""
    if method_supported("mtp", version):
        return "mtp"
    if method_supported("deepseek_mtp", version):
        return "deepseek_mtp"
    return None


# --------------------------------------------------------------------------------------
# Field rules (0.33.0 unless stated; unchanged back to the version given)
# --------------------------------------------------------------------------------------

PROMPT_LOOKUP_DEFAULT_MAX = 5
PROMPT_LOOKUP_DEFAULT_MIN = 5
PROMPT_LOOKUP_RULES = (
    "ngram / ngram_gpu: both unset -> min = max = 5 (same code in 0.8.2 config.py:2023-2024 "
    "and 0.33.0 speculative.py:1302-1305); only one set -> the other copies it; "
    "min > max is a ValueError (PROMPT_LOOKUP_ORDER_MESSAGE); each must be >= 1 "
    "(pydantic Field(ge=1): not in 0.11.0, present in 0.15.0). The field docstring says "
    "min 'Defaults to 1': the code copies max instead. Other methods force both to 0."
)

DRAFT_TP_RULES = (
    "draft_tensor_parallel_size unset -> the target's tensor_parallel_size (mlp_speculator "
    "drafts default to 1 up to 0.32.0); set -> must be 1 or the target's TP "
    "(DRAFT_TP_INVALID_MESSAGE, 0.8.2 config.py:2210-2214 to 0.33.0 speculative.py:1849-1869), "
    ">= 1 (pydantic, 0.15.0+); method=draft_model on Model Runner V1 additionally needs it "
    "equal to the target's TP (DRAFT_TP_MUST_EQUAL_TARGET_FOR_DRAFT_MODEL)."
)

NUM_SPECULATIVE_TOKENS_RULES = (
    "num_speculative_tokens > 0 (pydantic gt=0) and required unless the draft's HF config "
    "has n_predict; it stays required with a per-batch-size table: it is the table's cap."
)

PER_BATCH_SIZE_RULES = (
    "num_speculative_tokens_per_batch_size = non-empty list of [start, end, K] "
    "(vllm/v1/spec_decode/dynamic/utils.py, 0.24.0 to 0.33.0 unchanged): start, end > 0; "
    "start <= end; K >= 0 (K = 0 turns drafting off for those batch sizes); entries are "
    "sorted by start, then must not overlap (inclusive ends); the first must start at 1. "
    "Gaps and the tail above the last range carry the previous K forward. The effective K is "
    "min(K, num_speculative_tokens). Checked when the EngineCore builds its scheduler "
    "(scheduler.py:324-328), not when the config is parsed, so a bad table fails engine "
    "start-up, not argument parsing."
)


def per_batch_size_table_problems(
    table: list[list[int]] | list[tuple[int, int, int]],
    num_speculative_tokens: int | None,
) -> list[str]:
    """Reasons vLLM would refuse ``table`` (empty list: accepted). Encodes PER_BATCH_SIZE_RULES.

    Also reports a missing / non-positive ``num_speculative_tokens``, which vLLM needs as
    the table's cap. Values above the cap are accepted by vLLM (clamped), not reported.
    """
    problems: list[str] = []
    if num_speculative_tokens is None or num_speculative_tokens <= 0:
        problems.append("num_speculative_tokens must be set and > 0 (it caps the table)")
    if not isinstance(table, list) or not table:
        problems.append("table must be a non-empty list of [start, end, K]")
        return problems
    entries: list[tuple[int, int, int]] = []
    for entry in table:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            problems.append(f"entry {entry!r} is not [start, end, K]")
            continue
        start, end, k = (int(x) for x in entry)
        if start <= 0 or end <= 0:
            problems.append(f"range ({start}, {end}) must be positive")
        elif start > end:
            problems.append(f"range ({start}, {end}) has start > end")
        if k < 0:
            problems.append(f"K={k} in ({start}, {end}) must be >= 0")
        entries.append((start, end, k))
    if problems or not entries:
        return problems
    entries.sort(key=lambda e: e[0])
    previous_end = 0
    for start, end, _ in entries:
        if start <= previous_end:
            problems.append(f"range starting at {start} overlaps the one ending at {previous_end}")
        previous_end = end
    if entries[0][0] != 1:
        problems.append("the first range must start at 1")
    return problems


def effective_k(
    table: list[list[int]] | list[tuple[int, int, int]],
    num_speculative_tokens: int,
    batch_size: int,
) -> int:
    """The K vLLM uses at ``batch_size`` for a valid table (gaps and tail carry forward)."""
    current: int | None = None
    for start, end, k in sorted((tuple(int(x) for x in e) for e in table), key=lambda e: e[0]):
        if batch_size < start:
            break
        current = k
        if batch_size <= end:
            break
    if current is None:
        raise ValueError("table does not cover batch size 1")
    return min(current, num_speculative_tokens)


# --------------------------------------------------------------------------------------
# Error texts, facts only (specdecode.control.failures classifies start-up logs with them). f-string
# shapes are quoted as in vLLM; the *_PATTERN regexes match the rendered text. ValueErrors
# raised inside SpeculativeConfig validation reach the log wrapped by pydantic: "1 validation
# error for SpeculativeConfig" then "  Value error, <message> [type=value_error, ...]": match
# substrings, not lines.
# --------------------------------------------------------------------------------------

VOCAB_MISMATCH_FILE = "vllm/config/speculative.py"  # 0.33.0 line 2049-2056; since 0.15.0
VOCAB_MISMATCH_MESSAGE = (
    'f"Target and draft model should have the same vocabulary size. "'
    ' f"Target model vocab_size={target_vocab_size}. "'
    ' f"Draft model vocab_size={draft_vocab_size}. "'
    ' f"Using models with different tokenizers can cause out-of-bounds "'
    ' f"errors during speculative decoding."'
)
VOCAB_MISMATCH_PREFIX = "Target and draft model should have the same vocabulary size."
VOCAB_MISMATCH_PATTERN = re.compile(
    r"Target and draft model should have the same vocabulary size\. "
    r"Target model vocab_size=(?P<target>\d+)\. Draft model vocab_size=(?P<draft>\d+)\."
)

DRAFT_MODEL_NOT_SUPPORTED_PREFIX = "Speculative decoding with draft model is not supported yet."
DRAFT_MODEL_NOT_SUPPORTED_MESSAGE = (
    # NotImplementedError, 0.10.0-0.14.1; the last word is "deepseek_mtp." up to 0.10.2.
    "Speculative decoding with draft model is not supported yet. Please consider using other "
    "speculative decoding methods such as ngram, medusa, eagle, or mtp."
)

UNSUPPORTED_METHOD_MESSAGE = "f\"Unsupported speculative method: '{self.method}'\""
UNSUPPORTED_METHOD_PATTERN = re.compile(r"Unsupported speculative method: '(?P<method>[^']*)'")
# NotImplementedError from SpeculativeConfig.__post_init__ (0.15.0+ speculative.py; 0.33.0
# line 1499-1501) when a model-based method is not detectable. A method string outside the
# Literal never gets there: pydantic rejects it first (PYDANTIC_LITERAL_ERROR).

NUM_SPEC_TOKENS_REQUIRED_MESSAGE = (
    "num_speculative_tokens must be provided with speculative model unless the draft model "
    "config contains an n_predict parameter."
)
NUM_SPEC_TOKENS_WITHOUT_MODEL_MESSAGE = (
    "num_speculative_tokens was provided but without speculative model."
)
DRAFT_TP_INVALID_MESSAGE = (
    'f"{speculative_draft_tensor_parallel_size=} cannot be "'
    ' f"other value than 1 or target model tensor_parallel_size"'
)
DRAFT_TP_INVALID_PATTERN = re.compile(
    r"speculative_draft_tensor_parallel_size=(?P<draft_tp>\d+) cannot be other value than 1 "
    r"or target model tensor_parallel_size"
)
DRAFT_TP_MISMATCH_MESSAGE = (
    "f\"Currently, 'draft_tensor_parallel_size' and 'tensor_parallel_size' \""
    ' f"must be the same. Got {draft_tp} and {tgt_tp}. "'
    " \"Please pass 'draft_tensor_parallel_size' in the speculative_config.\""
)
DRAFT_TP_MISMATCH_PATTERN = re.compile(
    r"'draft_tensor_parallel_size' and 'tensor_parallel_size' must be the same\. "
    r"Got (?P<draft_tp>\d+) and (?P<target_tp>\d+)\."
)
TENSOR_PARALLEL_SIZE_KEY_MESSAGE = (
    "'tensor_parallel_size' is not a valid argument in the speculative_config. "
    "Please pass 'draft_tensor_parallel_size' instead."
)
PROMPT_LOOKUP_ORDER_MESSAGE = (
    'f"prompt_lookup_min={self.prompt_lookup_min} must "'
    ' f"be <= prompt_lookup_max={self.prompt_lookup_max}"'
)
SHORTHAND_CONFLICT_MESSAGE = "f\"{flag} and --speculative-config['{key}'] are mutually exclusive\""
HETEROGENEOUS_VOCAB_METHOD_MESSAGE = "use_heterogeneous_vocab only works with method='draft_model'"
HETEROGENEOUS_VOCAB_SAMPLING_MESSAGE = (
    "use_heterogeneous_vocab currently only supports greedy draft sampling. "
    "Set draft_sample_method='greedy' (the default) or omit it."
)
HETEROGENEOUS_VOCAB_ARGMAX_MESSAGE = (  # 0.33.0 speculative.py:2007-2012
    "use_heterogeneous_vocab is not compatible with use_local_argmax_reduction because "
    "token-level intersection requires the full draft logits."
)
PER_BATCH_SIZE_ERROR_MESSAGES = (
    # ValueErrors from vllm/v1/spec_decode/dynamic/utils.py (0.24.0-0.33.0), raised in the
    # EngineCore process when the scheduler is built.
    "num_speculative_tokens_per_batch_size must be a non-empty list of "
    "(range_start, range_end, num_speculative_tokens) entries.",
    "num_speculative_tokens_per_batch_size must not be empty.",
    "Each num_speculative_tokens_per_batch_size entry must be a 3-item sequence: "
    "(range_start, range_end, num_speculative_tokens).",
    'f"Batch-size range ({range_start}, {range_end}) must be positive."',
    '"Batch-size range start must be <= end for " '
    'f"({range_start}, {range_end}, {num_speculative_tokens})."',
    "num_speculative_tokens_per_batch_size values must be >= 0.",
    "Batch-size ranges must be non-overlapping and sorted.",
    "The first batch-size range must start at 1 so every runtime batch size has a defined "
    "schedule.",
)
SPECULATIVE_CONFIG_JSON_ERROR = (
    # --speculative-config is parsed with json.loads wrapped by parse_type
    # (vllm/engine/arg_utils.py:161-170, 0.33.0); argparse prefixes
    # "argument --speculative-config/-sc: ".
    'f"Value {val} cannot be converted to {return_type}."'
)

# pydantic (not vLLM) texts, for SpeculativeConfig is a pydantic dataclass with
# extra="forbid" (vllm/config/utils.py:51-80, 0.33.0). Shapes checked with a stand-in
# dataclass under pydantic 2.14; vLLM's image may pin another 2.x, same error types.
PYDANTIC_VALIDATION_HEADER = "validation error for SpeculativeConfig"
PYDANTIC_LITERAL_ERROR = "[type=literal_error"  # unknown method: "Input should be 'ngram', ..."
PYDANTIC_UNKNOWN_KEY_ERROR = "[type=unexpected_keyword_argument"  # "Unexpected keyword argument"
PYDANTIC_GREATER_THAN_ERROR = "[type=greater_than"  # num_speculative_tokens <= 0
PYDANTIC_VALUE_ERROR_PREFIX = "Value error, "

VOCAB_MAPPING_NO_UNK_MESSAGE = (  # 0.33.0 vllm/v1/spec_decode/vocab_mapping.py:62-65
    'f"VocabMapping: {role} has neither unk_token_id nor eos_token_id; "'
    ' "cannot safely map out-of-intersection tokens"'
)
VOCAB_MAPPING_NO_UNK_PATTERN = re.compile(
    r"VocabMapping: (?P<role>target|draft) tokenizer has neither unk_token_id nor eos_token_id"
)

# Start-up texts outside the speculative config (memory, model lookup), read in the 0.33.0
# wheel only: the classifier matches them by the stable words, not whole sentences.
KV_CACHE_NO_MEMORY_PREFIX = (  # vllm/v1/core/kv_cache_planning.py:56-63, ValueError
    "No available memory for the cache blocks."
)
KV_CACHE_TOO_SMALL_MESSAGE = (  # vllm/v1/core/kv_cache_planning.py:76-86, ValueError
    'f"To serve at least one request with the model\'s max seq len "'
    ' f"({max_model_len}), ({format_gib(needed_memory)} GiB KV "'
    ' f"cache is needed, which is larger than the available KV cache "'
    ' f"memory ({format_gib(available_memory)} GiB). {estimated_msg}"'
    ' f"Try increasing `gpu_memory_utilization` ... or decreasing `max_model_len` ..."'
)
KV_CACHE_TOO_SMALL_PATTERN = re.compile(
    # "models's" in older releases: the possessive is optional.
    r"max seq len \((?P<max_model_len>\d+)\), \((?P<needed_gib>[\d.]+) GiB KV cache is "
    r"needed, which is larger than the available KV cache memory \((?P<available_gib>[\d.]+) "
    r"GiB\)\.(?: Based on the available memory, the estimated maximum model length is "
    r"(?P<estimated_max_len>\d+)\.)?"
)
FREE_MEMORY_BELOW_UTILIZATION_PATTERN = re.compile(
    # vllm/v1/worker/utils.py:741-750 and 761-770, ValueError raised before any weight
    # loads: "Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than desired
    # GPU memory utilization (0.92, 72.86 GiB). Decrease GPU memory utilization or ..."
    r"Free memory on device (?P<device>\S+) \((?P<free_gib>[\d.]+)/(?P<total_gib>[\d.]+) GiB\) "
    r"on startup is less than [^(]*\((?P<utilization>[\d.]+), (?P<requested_gib>[\d.]+) GiB\)"
)
MEMORY_PROFILING_ERROR_PREFIX = (  # vllm/v1/worker/gpu_worker.py:732-740, AssertionError
    "Error in memory profiling."
)
INVALID_MODEL_PATTERN = re.compile(
    # vllm/transformers_utils/config.py:910-922, ValueError: neither a hub repository nor a
    # directory with config.json / params.json.
    r"Invalid repository ID or local directory specified: '(?P<model>[^']*)'"
)
# Model Runner V2 (0.33.0) picks a proposer per method and raises for the rest:
# vllm/v1/worker/gpu/spec_decode/__init__.py:94 NotImplementedError. vLLM chooses V1 by itself
# for suffix and custom_class (vllm/config/vllm.py:3066-3067 list them as unsupported by V2,
# :758-765 fall back to V1), so the error shows when VLLM_USE_V2_MODEL_RUNNER=1 forces V2
# (vllm/config/vllm.py:748-750 honours the variable before that check).
V2_RUNNER_UNSUPPORTED_METHOD_MESSAGE = 'f"{speculative_config.method} is not supported yet."'
V2_RUNNER_UNSUPPORTED_METHOD_PATTERN = re.compile(
    r"(?:^|NotImplementedError: )(?P<method>[a-z][\w]*) is not supported yet\.$"
)
V2_RUNNER_METHODS: frozenset[str] = frozenset(  # init_speculator's branches, same file :14-92
    {"extract_hidden_states", "dflash", "dspark", "mtp", "eagle", "eagle3", "draft_model", "ngram", "ngram_gpu"}
)
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"

# A model that cannot be fetched: no network to the Hub, or offline mode without the model
# in the cache. vLLM 0.33.0 logs the Hub lookup's failure (vllm/transformers_utils/
# repo_utils.py:124 `"%s: %s", "Error retrieving file list", e`, from :171) and then rewraps it
# as INVALID_MODEL_PATTERN's ValueError (config.py:910-922, `raise ... from e`); with
# HF_HUB_OFFLINE=1 vllm/engine/arg_utils.py:933-945 resolves the model through
# huggingface_hub's snapshot_download, which raises LocalEntryNotFoundError. Texts of
# huggingface_hub 2.4.0 (vLLM 0.33.0 requires huggingface_hub>=1.31.0): _snapshot_download.py
# :382-404, file_download.py:1945-1966, utils/_http.py:294-296 (OfflineModeIsEnabled).
HUB_OFFLINE_PATTERN = re.compile(
    r"outgoing traffic has been disabled|offline mode is enabled"
)
HUB_UNREACHABLE_PATTERN = re.compile(
    r"Please check your (?:internet )?connection"
    r"|Error retrieving file list: .*(?:Errno|[Cc]onnect|[Tt]ime ?out|timed out|resol|[Uu]nreachable"
    r"|refused|SSL|[Pp]roxy)"
)
NON_DEFAULT_ARGS_PREFIX = (  # vllm/entrypoints/common/startup.py:96, logged at start-up
    "non-default args: "
)

ENGINE_CORE_FAILED_WRAPPERS = (
    # Wrappers that point at the root cause above them: never the cause themselves.
    "Engine core initialization failed.",  # vllm/v1/engine/utils.py:1473-1476, RuntimeError
    "Frontend process failed during engine core initialization.",  # utils.py:1467-1472
    "EngineCore failed to start.",  # vllm/v1/engine/core.py:1584, logger.exception
    "WorkerProc failed to start.",  # vllm/v1/executor/multiproc_executor.py:1057
)
