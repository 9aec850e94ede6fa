"""Draft compatibility preflight on small config.json files in the Hugging Face cache layout.

The vocab sizes are the published ones: Qwen2.5-7B 152064, Qwen2.5-0.5B 151936 (the same
tokenizer, padded differently), Llama-3.1-8B and Llama-3.2-1B 128256. Nothing is downloaded:
a fixture makes any network connection fail the test.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from specdecode import api
from specdecode.render import preflight as P
from specdecode.render.preflight import TokenizerInfo, check_draft_compatibility

from .conftest import service_doc

QWEN_7B = {"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "architectures": ["Qwen2ForCausalLM"]}
QWEN_05B = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "architectures": ["Qwen2ForCausalLM"]}
LLAMA_8B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "architectures": ["LlamaForCausalLM"]}
LLAMA_1B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "architectures": ["LlamaForCausalLM"]}
LLAMA2_7B = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096}
MISTRAL_7B = {"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096}

QWEN_TOKENIZER = {"model": {"type": "BPE", "vocab": {"hello": 0, "Ġworld": 1, "!": 2}}}
OTHER_TOKENIZER = {"model": {"type": "BPE", "vocab": {"hello": 0, "Ġworld": 2, "!": 1}}}

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the preflight must not open network connections")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def cache_model(
    root: Path,
    repo: str,
    config: dict,
    *,
    tokenizer: dict | None = None,
    tokenizer_class: str | None = None,
    ref: str = "main",
    commit: str = COMMIT,
) -> Path:
    """Write a model the way huggingface_hub caches it under HF_HOME."""
    repo_dir = root / "hub" / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / ref).write_text(commit)
    (snapshot / "config.json").write_text(json.dumps(config))
    if tokenizer is not None:
        (snapshot / "tokenizer.json").write_text(json.dumps(tokenizer))
    if tokenizer_class is not None:
        (snapshot / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": tokenizer_class}))
    return snapshot


def spec_of(speculation: dict, model: str = "Qwen/Qwen2.5-7B-Instruct", **more) -> api.SpecDecodeServiceSpec:
    return api.parse_service(service_doc({"model": {"name": model}, "speculation": speculation, **more})).spec


def draft_spec(draft: str, target: str = "Qwen/Qwen2.5-7B-Instruct", **speculation) -> api.SpecDecodeServiceSpec:
    return spec_of({"method": "draft_model", "draftModel": draft, **speculation}, model=target)


# ---------------------------------------------------------------------------------------------
# The pure core
# ---------------------------------------------------------------------------------------------


def test_equal_vocab_sizes_are_compatible():
    result = check_draft_compatibility("draft_model", LLAMA_8B, LLAMA_1B)
    assert (result.status, result.reason, result.compatible) == ("True", "VocabSizesMatch", True)
    assert result.message == "vocab_size 128256 on both" and result.fix == ""


def test_different_vocab_sizes_need_heterogeneous_vocab():
    result = check_draft_compatibility("draft_model", QWEN_7B, QWEN_05B)
    assert (result.status, result.reason) == ("False", "VocabMismatch")
    assert result.message == "vLLM refuses a draft_model whose vocab_size (151936) differs from the target's (152064)"
    assert result.fix == (
        "set speculation.useHeterogeneousVocab: true (draft_model with greedy draft sampling) or pick "
        "a draft whose vocab_size is 152064"
    )


def test_heterogeneous_vocab_makes_them_compatible_with_a_note():
    result = check_draft_compatibility("draft_model", QWEN_7B, QWEN_05B, use_heterogeneous_vocab=True)
    assert (result.status, result.reason) == ("True", "HeterogeneousVocab")
    assert result.message.startswith("vocab_size 152064 (target) vs 151936 (draft); useHeterogeneousVocab")
    same = TokenizerInfo(vocab_fingerprint=P.vocab_fingerprint(QWEN_TOKENIZER))
    result = check_draft_compatibility(
        "draft_model", QWEN_7B, QWEN_05B, use_heterogeneous_vocab=True, target_tokenizer=same, draft_tokenizer=same
    )
    assert "same base vocabulary, so the token mapping loses nothing" in result.message


def test_heterogeneous_vocab_across_families_is_compatible_but_warned():
    # vLLM 0.33 maps tokens by their text (vocab_mapping.py), so families may differ.
    result = check_draft_compatibility("draft_model", QWEN_7B, LLAMA_1B, use_heterogeneous_vocab=True)
    assert result.status == "True" and result.reason == "HeterogeneousVocab"
    assert "different model families (qwen2 vs llama)" in result.message and "acceptance may be low" in result.message


def test_heterogeneous_vocab_on_a_release_without_it():
    result = check_draft_compatibility("draft_model", QWEN_7B, QWEN_05B, use_heterogeneous_vocab=True, vllm_version="0.24.0")
    assert (result.status, result.reason) == ("False", "VocabMismatch")
    assert "useHeterogeneousVocab needs vLLM 0.25.0 or newer, engine.version is 0.24.0" in result.message
    assert result.fix.startswith("raise engine.version to 0.25.0 or newer and set speculation.useHeterogeneousVocab")
    nightly = check_draft_compatibility("draft_model", QWEN_7B, QWEN_05B, use_heterogeneous_vocab=True, vllm_version="nightly")
    assert nightly.status == "True"


def test_equal_sizes_but_different_tokenizers_are_incompatible():
    # vLLM runs the draft with the target's tokenizer and checks only the sizes.
    result = check_draft_compatibility("draft_model", LLAMA2_7B, MISTRAL_7B)
    assert (result.status, result.reason) == ("False", "TokenizerMismatch")
    assert "vocab_size 32000 on both, but they belong to different model families (llama vs mistral)" in result.message
    assert result.fix.startswith("set speculation.useHeterogeneousVocab: true")
    fingerprints = check_draft_compatibility(
        "draft_model",
        LLAMA_8B,
        LLAMA_1B,
        target_tokenizer=TokenizerInfo(vocab_fingerprint=P.vocab_fingerprint(QWEN_TOKENIZER)),
        draft_tokenizer=TokenizerInfo(vocab_fingerprint=P.vocab_fingerprint(OTHER_TOKENIZER)),
    )
    assert fingerprints.reason == "TokenizerMismatch" and "tokenizer.json vocabularies differ" in fingerprints.message
    classes = check_draft_compatibility(
        "draft_model",
        {"vocab_size": 256000},
        {"vocab_size": 256000},
        target_tokenizer=TokenizerInfo("GemmaTokenizerFast"),
        draft_tokenizer=TokenizerInfo("Qwen2Tokenizer"),
    )
    assert classes.reason == "TokenizerMismatch" and "(GemmaTokenizerFast vs Qwen2Tokenizer)" in classes.message


def test_shared_tokenizer_classes_prove_nothing():
    result = check_draft_compatibility(
        "draft_model",
        {"vocab_size": 32000},
        {"vocab_size": 32000},
        target_tokenizer=TokenizerInfo("LlamaTokenizerFast"),
        draft_tokenizer=TokenizerInfo("PreTrainedTokenizerFast"),
    )
    assert result.status == "True"
    fast_and_slow = check_draft_compatibility(
        "draft_model",
        QWEN_05B,
        QWEN_05B,
        target_tokenizer=TokenizerInfo("Qwen2TokenizerFast"),
        draft_tokenizer=TokenizerInfo("Qwen2Tokenizer"),
    )
    assert fast_and_slow.status == "True"


def test_fingerprints_outrank_families():
    same = TokenizerInfo(vocab_fingerprint=P.vocab_fingerprint(QWEN_TOKENIZER))
    result = check_draft_compatibility("draft_model", LLAMA2_7B, MISTRAL_7B, target_tokenizer=same, draft_tokenizer=same)
    assert result.status == "True" and "share the same base vocabulary" in result.message


def test_vocab_fingerprint_covers_bpe_and_unigram():
    assert P.vocab_fingerprint(QWEN_TOKENIZER) != P.vocab_fingerprint(OTHER_TOKENIZER)
    # Key order and added tokens (chat markers) do not matter; ids do.
    reordered = {"model": {"vocab": {"!": 2, "Ġworld": 1, "hello": 0}}, "added_tokens": [{"id": 3, "content": "<|im_end|>"}]}
    assert P.vocab_fingerprint(reordered) == P.vocab_fingerprint(QWEN_TOKENIZER)
    unigram = {"model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["▁the", -1.5]]}}
    assert P.vocab_fingerprint(unigram) is not None
    assert P.vocab_fingerprint({"model": {"type": "BPE"}}) is None and P.vocab_fingerprint({}) is None


def test_multimodal_configs_compare_their_text_config():
    target = {"model_type": "qwen2_5_vl", "text_config": {"model_type": "qwen2", "vocab_size": 152064}}
    result = check_draft_compatibility("draft_model", target, QWEN_05B)
    assert result.reason == "VocabMismatch" and "target's (152064)" in result.message


def test_missing_vocab_size_is_unknown():
    result = check_draft_compatibility("draft_model", QWEN_7B, {"model_type": "qwen2"})
    assert (result.status, result.reason, result.compatible) == ("Unknown", "NotChecked", None)


def test_eagle_heads_must_match_the_targets_hidden_and_vocab_sizes():
    head = {"architectures": ["LlamaForCausalLMEagle"], "hidden_size": 4096, "vocab_size": 128256}
    assert check_draft_compatibility("eagle", LLAMA_8B, head).status == "True"
    wrong = check_draft_compatibility("eagle", LLAMA_1B, head)
    assert (wrong.status, wrong.reason) == ("False", "EagleHeadMismatch")
    assert "the head's hidden_size is 4096, the target's hidden_size 2048" in wrong.message
    assert wrong.fix == "pick the eagle head published for this target model"
    other_vocab = check_draft_compatibility("eagle", {**QWEN_7B, "hidden_size": 4096}, head)
    assert "the head's vocab_size is 128256, the target's 152064" in other_vocab.message


def test_eagle3_heads_compare_target_hidden_size_and_read_the_speculators_format():
    head = {"hidden_size": 6144, "target_hidden_size": 4096, "vocab_size": 128256, "draft_vocab_size": 32000}
    assert check_draft_compatibility("eagle3", LLAMA_8B, head).status == "True"
    assert check_draft_compatibility("eagle3", LLAMA_1B, head).reason == "EagleHeadMismatch"
    speculators = {
        "speculators_model_type": "eagle3",
        "draft_vocab_size": 32000,
        "transformer_layer_config": {"model_type": "llama", "hidden_size": 4096, "vocab_size": 128256},
    }
    assert check_draft_compatibility("eagle3", LLAMA_8B, speculators).status == "True"
    assert check_draft_compatibility("eagle3", LLAMA_8B, {"architectures": ["X"]}).status == "Unknown"


def test_methods_without_a_draft_have_nothing_to_check():
    for method in ("ngram", "mtp", "suffix"):
        result = check_draft_compatibility(method, QWEN_7B, {})
        assert (result.status, result.reason) == ("True", "NoDraftModel")


# ---------------------------------------------------------------------------------------------
# Reading the model-cache volume
# ---------------------------------------------------------------------------------------------


def test_preflight_reads_the_hf_cache_layout(tmp_path):
    cache_model(tmp_path, "Qwen/Qwen2.5-7B-Instruct", QWEN_7B, tokenizer=QWEN_TOKENIZER, tokenizer_class="Qwen2Tokenizer")
    cache_model(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct", QWEN_05B, tokenizer=QWEN_TOKENIZER, tokenizer_class="Qwen2Tokenizer")
    result = P.preflight(draft_spec("Qwen/Qwen2.5-0.5B-Instruct"), tmp_path)
    assert (result.status, result.reason) == ("False", "VocabMismatch")
    assert result.fix.endswith("pick a draft whose vocab_size is 152064")
    result = P.preflight(draft_spec("Qwen/Qwen2.5-0.5B-Instruct", useHeterogeneousVocab=True), tmp_path)
    assert result.status == "True" and "loses nothing" in result.message


def test_preflight_llama_pair(tmp_path):
    cache_model(tmp_path, "meta-llama/Llama-3.1-8B-Instruct", LLAMA_8B)
    cache_model(tmp_path, "meta-llama/Llama-3.2-1B-Instruct", LLAMA_1B)
    spec = draft_spec("meta-llama/Llama-3.2-1B-Instruct", target="meta-llama/Llama-3.1-8B-Instruct")
    assert P.preflight(spec, tmp_path).reason == "VocabSizesMatch"


def test_preflight_is_skipped_when_configs_are_not_reachable(tmp_path):
    cache_model(tmp_path, "Qwen/Qwen2.5-7B-Instruct", QWEN_7B)
    result = P.preflight(draft_spec("Qwen/Qwen2.5-0.5B-Instruct"), tmp_path)
    assert (result.status, result.reason, result.compatible) == ("Unknown", "ConfigsNotReachable", None)
    assert result.message.startswith("preflight skipped: configs not reachable (no config.json for Qwen/Qwen2.5-0.5B-Instruct")


def test_preflight_defaults_to_the_model_cache_mount_path(tmp_path):
    cache_model(tmp_path, "meta-llama/Llama-3.1-8B-Instruct", LLAMA_8B)
    cache_model(tmp_path, "meta-llama/Llama-3.2-1B-Instruct", LLAMA_1B)
    spec = api.parse_service(
        service_doc(
            {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                "speculation": {"method": "draft_model", "draftModel": "meta-llama/Llama-3.2-1B-Instruct"},
                "modelCache": {"mountPath": str(tmp_path)},
            }
        )
    ).spec
    assert P.preflight(spec).status == "True"


def test_ngram_needs_no_configs(tmp_path):
    assert P.preflight(spec_of({"method": "ngram"}), tmp_path).reason == "NoDraftModel"


def test_absolute_paths_and_paths_on_the_pods_mount(tmp_path):
    (tmp_path / "models" / "target").mkdir(parents=True)
    (tmp_path / "models" / "target" / "config.json").write_text(json.dumps(LLAMA_8B))
    assert P.load_model_config(str(tmp_path / "models" / "target"), tmp_path / "elsewhere") == LLAMA_8B
    # The pods see the volume at /root/.cache/huggingface; this process at tmp_path.
    assert P.load_model_config("/root/.cache/huggingface/models/target", tmp_path, mount_path="/root/.cache/huggingface") == LLAMA_8B
    assert P.load_model_config("/root/.cache/huggingface/models/missing", tmp_path, mount_path="/root/.cache/huggingface") is None


def test_revisions_resolve_through_refs_and_commits(tmp_path):
    cache_model(tmp_path, "org/model", QWEN_7B, ref="main", commit="a" * 40)
    cache_model(tmp_path, "org/model", QWEN_05B, ref="v2", commit="b" * 40)
    assert P.load_model_config("org/model", tmp_path)["vocab_size"] == 152064
    assert P.load_model_config("org/model", tmp_path, revision="v2")["vocab_size"] == 151936
    assert P.load_model_config("org/model", tmp_path, revision="b" * 40)["vocab_size"] == 151936
    # A pinned revision that is not cached: another snapshot would mislead.
    assert P.load_model_config("org/model", tmp_path, revision="v3") is None


def test_a_cache_without_refs_uses_its_snapshot(tmp_path):
    snapshot = cache_model(tmp_path, "org/model", LLAMA_1B)
    (snapshot.parent.parent / "refs" / "main").unlink()
    assert P.load_model_config("org/model", tmp_path) == LLAMA_1B


def test_malformed_or_missing_files_read_as_absent(tmp_path):
    snapshot = cache_model(tmp_path, "org/broken", LLAMA_1B)
    (snapshot / "config.json").write_text("{not json")
    assert P.load_model_config("org/broken", tmp_path) is None
    (snapshot / "config.json").write_text("[1, 2]")
    assert P.load_model_config("org/broken", tmp_path) is None
    assert P.load_model_config("org/absent", tmp_path) is None
    assert P.load_tokenizer_info("org/absent", tmp_path) == TokenizerInfo()


def test_tokenizer_info_from_the_snapshot(tmp_path):
    cache_model(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct", QWEN_05B, tokenizer=QWEN_TOKENIZER, tokenizer_class="Qwen2Tokenizer")
    info = P.load_tokenizer_info("Qwen/Qwen2.5-0.5B-Instruct", tmp_path)
    assert info == TokenizerInfo("Qwen2Tokenizer", P.vocab_fingerprint(QWEN_TOKENIZER))
