"""Tests for specdecode.render.features: the version table read from vLLM's released wheels."""

import dataclasses
import re

import pytest
from packaging.version import Version

from specdecode.render import features as vs


def test_feature_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        vs.PER_BATCH_SIZE_K_TABLE.first_version = "0.1.0"  # type: ignore[misc]


def test_feature_rejects_inverted_range():
    with pytest.raises(ValueError):
        vs.Feature("x", first_version="0.5.0", last_version="0.4.0")


@pytest.mark.parametrize(
    "feature, absent, present",
    [
        (vs.PER_BATCH_SIZE_K_TABLE, "0.23.0", "0.24.0"),
        (vs.HETEROGENEOUS_VOCAB, "0.24.0", "0.25.0"),
        (vs.CUSTOM_HISTOGRAM_BUCKETS, "0.31.0", "0.32.0"),
        (vs.SPEC_SHORTHAND_FLAGS, "0.21.0", "0.22.0"),
        (vs.SPECULATIVE_CONFIG_SHORT_ALIAS, "0.18.1", "0.19.0"),
        (vs.PER_BATCH_SIZE_TABLE_OFF_WITH_DATA_PARALLEL, "0.25.0", "0.26.0"),
        (vs.PER_BATCH_SIZE_TABLE_V1_METHOD_LIMIT, "0.32.0", "0.33.0"),
        (vs.VOCAB_SIZE_CHECK, "0.14.1", "0.15.0"),
        (vs.NO_ENABLE_CHUNKED_PREFILL_FLAG, "0.8.4", "0.8.5"),
    ],
)
def test_first_versions(feature, absent, present):
    assert not vs.supports(feature, absent)
    assert vs.supports(feature, present)
    assert vs.supports(feature, vs.NEWEST_CHECKED)
    assert feature.first_version == present


def test_speculative_config_flag_from_oldest_checked():
    # Not bisected below 0.8.2 (the floor of everything read); REFERENCE says added there.
    assert vs.SPECULATIVE_CONFIG_FLAG.first_version == vs.OLDEST_CHECKED == "0.8.2"
    assert vs.supports(vs.SPECULATIVE_CONFIG_FLAG, "0.33.0")


def test_supports_handles_prereleases_and_patch_versions():
    assert not vs.supports(vs.PER_BATCH_SIZE_K_TABLE, "0.24.0rc1")
    assert vs.supports(vs.PER_BATCH_SIZE_K_TABLE, "0.24.1")
    assert vs.supports(vs.SPEC_SHORTHAND_FLAGS, "0.22.1")
    assert not vs.supports(vs.SPEC_SHORTHAND_FLAGS, "0.20.2")


def test_last_version_is_inclusive():
    f = vs.Feature("x", first_version="0.10.0", last_version="0.12.0")
    assert vs.supports(f, "0.12.0")
    assert not vs.supports(f, "0.13.0")


def test_every_feature_has_evidence_naming_a_wheel():
    for f in vs.FEATURES:
        assert f.evidence, f.name
        assert any(re.search(r"vllm-\d[\w.-]*\.whl: vllm/", e) for e in f.evidence), f.name
        Version(f.first_version)
        if f.last_version:
            Version(f.last_version)


@pytest.mark.parametrize(
    "method, version, expected",
    [
        ("draft_model", "0.9.2", True),  # V0 fallback
        ("draft_model", "0.10.0", False),  # NotImplementedError
        ("draft_model", "0.14.1", False),
        ("draft_model", "0.15.0", True),
        ("draft_model", "0.33.0", True),
        ("eagle", "0.8.2", True),
        ("eagle3", "0.8.4", False),
        ("eagle3", "0.8.5", True),
        ("mtp", "0.10.2", False),
        ("mtp", "0.11.0", True),
        ("deepseek_mtp", "0.8.5", False),
        ("deepseek_mtp", "0.9.0", True),
        ("ngram", "0.8.2", True),
        ("ngram", "0.33.0", True),
        ("suffix", "0.11.0", False),
        ("suffix", "0.11.1", True),
        ("medusa", "0.32.0", True),
        ("medusa", "0.33.0", False),
        ("mlp_speculator", "0.33.0", False),
        ("ngram_gpu", "0.17.1", False),
        ("ngram_gpu", "0.18.0", True),
        ("dflash", "0.19.1", False),
        ("dflash", "0.20.0", True),
        ("custom_class", "0.21.0", False),
        ("custom_class", "0.22.0", True),
        ("dspark", "0.24.0", False),
        ("dspark", "0.25.0", True),
        ("extract_hidden_states", "0.16.0", False),
        ("extract_hidden_states", "0.17.0", True),
        ("no_such_method", "0.33.0", False),
    ],
)
def test_method_supported(method, version, expected):
    assert vs.method_supported(method, version) is expected


def test_methods_in_0_33_match_reference_list():
    # REFERENCE.md's 0.33.0 list, plus the deepseek_mtp alias that is still accepted.
    assert vs.methods_supported("0.33.0") == {
        "draft_model", "eagle", "eagle3", "ngram", "ngram_gpu", "suffix", "mtp", "dflash",
        "dspark", "custom_class", "extract_hidden_states", "deepseek_mtp",
    }


def test_method_ranges_are_ordered_and_evidenced():
    for method, ranges in vs.METHODS_BY_VERSION.items():
        previous_last = None
        for first, last in ranges:
            assert Version(first) >= Version(vs.OLDEST_CHECKED)
            if previous_last is not None:
                assert Version(first) > Version(previous_last)
            if last is not None:
                assert Version(last) >= Version(first)
            previous_last = last
        if method not in ("ngram", "eagle"):
            assert ".whl" in vs.METHOD_EVIDENCE[method], method


def test_mtp_method_name():
    assert vs.mtp_method_name("0.8.5") is None
    assert vs.mtp_method_name("0.10.2") == "deepseek_mtp"
    assert vs.mtp_method_name("0.11.0") == "mtp"


def test_prompt_lookup_defaults():
    assert vs.PROMPT_LOOKUP_DEFAULT_MAX == 5
    assert vs.PROMPT_LOOKUP_DEFAULT_MIN == 5


@pytest.mark.parametrize(
    "table, k, ok",
    [
        ([[1, 8, 5], [9, 64, 2], [65, 1024, 0]], 5, True),
        ([[9, 64, 2], [1, 8, 5]], 5, True),  # vLLM sorts by start
        ([[1, 8, 7]], 5, True),  # above the cap: clamped, not refused
        ([[1, 8, 5], [20, 30, 1]], 5, True),  # gaps carry the previous K forward
        ([[2, 8, 5]], 5, False),  # must start at 1
        ([[1, 8, 5], [8, 16, 2]], 5, False),  # inclusive ends overlap
        ([[1, 8, -1]], 5, False),
        ([[1, 0, 3]], 5, False),
        ([[5, 2, 3]], 5, False),
        ([], 5, False),
        ([[1, 8]], 5, False),
        ([[1, 8, 5]], None, False),  # num_speculative_tokens still required
    ],
)
def test_per_batch_size_table_problems(table, k, ok):
    assert (vs.per_batch_size_table_problems(table, k) == []) is ok


def test_effective_k_caps_and_carries_forward():
    table = [[1, 4, 7], [5, 8, 2], [20, 30, 0]]
    assert vs.effective_k(table, 5, 1) == 5  # capped at num_speculative_tokens
    assert vs.effective_k(table, 5, 8) == 2
    assert vs.effective_k(table, 5, 12) == 2  # gap: previous K
    assert vs.effective_k(table, 5, 25) == 0
    assert vs.effective_k(table, 5, 1000) == 0  # tail: last K


def test_vocab_mismatch_pattern_matches_rendered_message():
    rendered = (
        "Target and draft model should have the same vocabulary size. "
        "Target model vocab_size=152064. Draft model vocab_size=151936. "
        "Using models with different tokenizers can cause out-of-bounds "
        "errors during speculative decoding."
    )
    m = vs.VOCAB_MISMATCH_PATTERN.search("Value error, " + rendered)
    assert m and m["target"] == "152064" and m["draft"] == "151936"
    assert rendered.startswith(vs.VOCAB_MISMATCH_PREFIX)
    for fragment in ("{target_vocab_size}", "{draft_vocab_size}", "out-of-bounds"):
        assert fragment in vs.VOCAB_MISMATCH_MESSAGE
    assert vs.VOCAB_MISMATCH_FILE == "vllm/config/speculative.py"


def test_draft_tp_patterns():
    m = vs.DRAFT_TP_INVALID_PATTERN.search(
        "speculative_draft_tensor_parallel_size=2 cannot be other value than 1 or "
        "target model tensor_parallel_size"
    )
    assert m and m["draft_tp"] == "2"
    m = vs.DRAFT_TP_MISMATCH_PATTERN.search(
        "Currently, 'draft_tensor_parallel_size' and 'tensor_parallel_size' must be the "
        "same. Got 1 and 4. Please pass 'draft_tensor_parallel_size' in the speculative_config."
    )
    assert m and (m["draft_tp"], m["target_tp"]) == ("1", "4")


def test_module_has_no_io_imports():
    import inspect

    source = inspect.getsource(vs)
    for name in ("import os", "import subprocess", "open(", "requests", "urllib"):
        assert name not in source


@pytest.mark.parametrize("method, version, dp, dropped", [
    ("suffix", "0.33.0", 1, True),
    ("suffix", "0.32.0", 1, False),
    ("ngram", "0.33.0", 1, False),
    ("eagle3", "0.33.0", 1, False),
    ("ngram", "0.33.0", 2, True),
    ("ngram", "0.26.0", 2, True),
    ("ngram", "0.24.0", 2, True),   # kept, but DP ranks may deadlock
])
def test_per_batch_size_table_dropped(method, version, dp, dropped):
    assert (vs.per_batch_size_table_dropped(method, version, dp) is not None) is dropped
