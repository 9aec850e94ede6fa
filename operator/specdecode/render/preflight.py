"""Draft compatibility preflight: will this draft work with this target, before any rollout?

Pure core (``check_draft_compatibility``: Hugging Face config dicts in, a DraftCompatible
condition out) and a thin reader (``load_model_config`` / ``load_tokenizer_info``: local
files only, from an absolute model path or the Hugging Face cache layout on the model-cache
volume). Nothing here downloads: when the configs are not on a reachable volume the
preflight is skipped and the condition is Unknown.

What vLLM 0.33.0 does, read in the wheel (``vllm_support`` cites the lines):

- method ``draft_model`` without ``use_heterogeneous_vocab``: SpeculativeConfig compares
  ``vocab_size`` of the two text configs and raises if they differ
  (``verify_equal_vocab_size_if_draft_model``). That is the only check: the draft then runs
  with the *target's* tokenizer (speculative.py builds the draft ModelConfig with
  ``tokenizer=target_model_config.tokenizer``). So two models with equal ``vocab_size`` but
  different tokenizers (Llama 2 and Mistral 7B both have 32000) start fine and draft token
  ids that mean other tokens: acceptance near zero. The preflight calls that incompatible.
- with ``use_heterogeneous_vocab`` (0.25.0+, draft_model only, greedy draft sampling): no
  size check; at start-up vLLM builds a token-level intersection of the two vocabularies by
  token text (vllm/v1/spec_decode/vocab_mapping.py, normalising BPE "Ġ" and SentencePiece
  "▁" space markers, so mixed families are handled) and constrains the draft to shared
  tokens: lossless, whatever the families. Different families are therefore compatible,
  with a note that acceptance is bounded by the shared tokens (vLLM logs the intersection).
- EAGLE heads: vLLM checks nothing generic. The head consumes the target's hidden states
  (llama_eagle.py: ``fc`` takes ``hidden_size * 2``: the head's embedding and the target's
  hidden state, so the head's ``hidden_size`` must be the target's; llama_eagle3.py: ``fc``
  takes ``target_hidden_size`` (default: the head's ``hidden_size``) times the auxiliary
  layers) and embeds and predicts *target* token ids, so its ``vocab_size`` must be the
  target's (EAGLE-3's smaller ``draft_vocab_size`` maps into it). A mismatch fails at load
  or proposes wrong tokens; those two relations are checked, nothing else.
- MTP, ngram and suffix have no separate draft: nothing to check.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from .. import api
from .. import constants as C
from . import vllm_args as vllm
from . import features as vs

ConditionStatus = Literal["True", "False", "Unknown"]

# DraftCompatible condition reasons.
REASON_NO_DRAFT_MODEL = "NoDraftModel"
REASON_VOCAB_SIZES_MATCH = "VocabSizesMatch"
REASON_HETEROGENEOUS_VOCAB = "HeterogeneousVocab"
REASON_VOCAB_MISMATCH = "VocabMismatch"
REASON_TOKENIZER_MISMATCH = "TokenizerMismatch"
REASON_EAGLE_HEAD_MISMATCH = "EagleHeadMismatch"
REASON_NOT_CHECKED = "NotChecked"
REASON_CONFIGS_NOT_REACHABLE = "ConfigsNotReachable"

_DRAFT_MODEL = api.SpeculationMethod.DRAFT_MODEL.value
_EAGLE = api.SpeculationMethod.EAGLE.value
_EAGLE3 = api.SpeculationMethod.EAGLE3.value

# Keys under which multimodal configs keep their language model (transformers'
# get_text_config, which vLLM's get_hf_text_config calls).
_TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config")

# Tokenizer classes shared by models with different vocabularies (Llama 2, Mistral and
# DeepSeek-R1 distills all name LlamaTokenizer*): they prove nothing about the vocabulary.
_GENERIC_TOKENIZER_CLASSES = frozenset(
    {"PreTrainedTokenizer", "PreTrainedTokenizerFast", "TokenizersBackend", "LlamaTokenizer", "GPT2Tokenizer"}
)

# model_type -> tokenizer family, for well-known families only (an unknown model_type proves
# nothing). Within a family the base vocabulary is shared; sizes may still differ (Llama 2
# vs 3), which the vocab_size comparison catches.
_TOKENIZER_FAMILIES: Mapping[str, str] = {
    **{t: "qwen" for t in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "qwen2_vl", "qwen2_5_vl")},
    "llama": "llama",
    **{t: "mistral" for t in ("mistral", "mixtral")},
    **{t: "gemma" for t in ("gemma", "gemma2", "gemma3", "gemma3_text")},
    **{t: "deepseek" for t in ("deepseek_v2", "deepseek_v3")},
}


@dataclass(frozen=True)
class TokenizerInfo:
    """What identifies a tokenizer: its class (tokenizer_config.json) and a fingerprint of
    its base vocabulary (tokenizer.json), each None when unknown."""

    tokenizer_class: Optional[str] = None
    vocab_fingerprint: Optional[str] = None


@dataclass(frozen=True)
class DraftCompatibility:
    """The DraftCompatible condition: status, CamelCase reason, message, and the fix when
    the status is False."""

    status: ConditionStatus
    reason: str
    message: str
    fix: str = ""

    @property
    def compatible(self) -> Optional[bool]:
        return {"True": True, "False": False}.get(self.status)


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a Hugging Face config (itself for text-only models)."""
    for key in _TEXT_CONFIG_KEYS:
        nested = config.get(key)
        if isinstance(nested, Mapping) and "vocab_size" in nested:
            return nested
    return config


def _int_field(config: Mapping[str, Any], key: str) -> Optional[int]:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def vocab_fingerprint(tokenizer_json: Mapping[str, Any]) -> Optional[str]:
    """A digest of a tokenizer.json's base vocabulary (token -> id), or None when it has
    none. Added tokens are left out: drafts of one family differ there (chat markers) while
    their ordinary token ids agree, which is what drafting needs."""
    model = tokenizer_json.get("model")
    if not isinstance(model, Mapping):
        return None
    vocab = model.get("vocab")
    if isinstance(vocab, Mapping):  # BPE, WordPiece, WordLevel: token -> id
        pairs = sorted((str(token), int(i)) for token, i in vocab.items())
    elif isinstance(vocab, list):  # Unigram: [token, score] at position id
        pairs = sorted((str(entry[0]), i) for i, entry in enumerate(vocab) if isinstance(entry, list) and entry)
    else:
        return None
    if not pairs:
        return None
    digest = hashlib.sha256(json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode())
    return digest.hexdigest()[:16]


def _class_name(name: Optional[str]) -> Optional[str]:
    if not name:
        return None
    return name[: -len("Fast")] if name.endswith("Fast") else name


def _same_tokenizer(
    target_config: Mapping[str, Any],
    draft_config: Mapping[str, Any],
    target_tokenizer: Optional[TokenizerInfo],
    draft_tokenizer: Optional[TokenizerInfo],
) -> tuple[Optional[bool], str]:
    """Whether the two use the same tokenizer (None: cannot tell), and the evidence."""
    t = target_tokenizer or TokenizerInfo()
    d = draft_tokenizer or TokenizerInfo()
    if t.vocab_fingerprint and d.vocab_fingerprint:
        if t.vocab_fingerprint == d.vocab_fingerprint:
            return True, "their tokenizers share the same base vocabulary"
        return False, "their tokenizer.json vocabularies differ"
    t_class, d_class = _class_name(t.tokenizer_class), _class_name(d.tokenizer_class)
    if (
        t_class
        and d_class
        and t_class != d_class
        and t_class not in _GENERIC_TOKENIZER_CLASSES
        and d_class not in _GENERIC_TOKENIZER_CLASSES
    ):
        return False, f"their tokenizer classes differ ({t.tokenizer_class} vs {d.tokenizer_class})"
    t_type, d_type = text_config(target_config).get("model_type"), text_config(draft_config).get("model_type")
    t_family, d_family = _TOKENIZER_FAMILIES.get(str(t_type)), _TOKENIZER_FAMILIES.get(str(d_type))
    if t_family and d_family and t_family != d_family:
        return False, f"they belong to different model families ({t_type} vs {d_type})"
    return None, ""


def _heterogeneous_vocab_supported(vllm_version: str) -> bool:
    release = vllm.release(vllm_version)
    # A non-release build (nightly, a commit) is newer than every release: it has the flag.
    return release is None or vs.supports(vs.HETEROGENEOUS_VOCAB, str(release))


def _enable_heterogeneous(vllm_version: str) -> str:
    if _heterogeneous_vocab_supported(vllm_version):
        return "set speculation.useHeterogeneousVocab: true (draft_model with greedy draft sampling)"
    return (
        f"raise engine.version to {vs.HETEROGENEOUS_VOCAB.first_version} or newer and set "
        "speculation.useHeterogeneousVocab: true"
    )


def _check_draft_model(
    target_config: Mapping[str, Any],
    draft_config: Mapping[str, Any],
    use_heterogeneous_vocab: bool,
    vllm_version: str,
    target_tokenizer: Optional[TokenizerInfo],
    draft_tokenizer: Optional[TokenizerInfo],
) -> DraftCompatibility:
    target_vocab = _int_field(text_config(target_config), "vocab_size")
    draft_vocab = _int_field(text_config(draft_config), "vocab_size")
    if target_vocab is None or draft_vocab is None:
        missing = "target" if target_vocab is None else "draft"
        return DraftCompatibility("Unknown", REASON_NOT_CHECKED, f"the {missing}'s config.json has no vocab_size")
    same, evidence = _same_tokenizer(target_config, draft_config, target_tokenizer, draft_tokenizer)
    heterogeneous_ok = use_heterogeneous_vocab and _heterogeneous_vocab_supported(vllm_version)

    if heterogeneous_ok:
        sizes = (
            f"vocab_size {target_vocab} on both" if target_vocab == draft_vocab
            else f"vocab_size {target_vocab} (target) vs {draft_vocab} (draft)"
        )
        if same is True:
            note = f"{evidence}, so the token mapping loses nothing"
        elif same is False:
            note = (
                f"{evidence}: vLLM maps tokens by their text and drafts only tokens both "
                "vocabularies share (it logs the intersection at start-up), so acceptance may be low"
            )
        else:
            note = "vLLM maps tokens by their text and drafts only tokens both vocabularies share"
        return DraftCompatibility("True", REASON_HETEROGENEOUS_VOCAB, f"{sizes}; useHeterogeneousVocab: {note}")

    if target_vocab != draft_vocab:
        message = (
            f"vLLM refuses a draft_model whose vocab_size ({draft_vocab}) differs from the "
            f"target's ({target_vocab})"
        )
        if use_heterogeneous_vocab:
            message += (
                f"; useHeterogeneousVocab needs vLLM {vs.HETEROGENEOUS_VOCAB.first_version} or "
                f"newer, engine.version is {vllm_version}"
            )
        return DraftCompatibility(
            "False",
            REASON_VOCAB_MISMATCH,
            message,
            fix=f"{_enable_heterogeneous(vllm_version)} or pick a draft whose vocab_size is {target_vocab}",
        )

    if same is False:
        return DraftCompatibility(
            "False",
            REASON_TOKENIZER_MISMATCH,
            f"vocab_size {target_vocab} on both, but {evidence}: vLLM runs the draft with the "
            "target's tokenizer, so the draft's token ids would mean other tokens and almost none "
            "would be accepted",
            fix=f"{_enable_heterogeneous(vllm_version)} or pick a draft of the target's model family",
        )
    tokenizers = f"; {evidence}" if same else ""
    return DraftCompatibility("True", REASON_VOCAB_SIZES_MATCH, f"vocab_size {target_vocab} on both{tokenizers}")


def _eagle_layer_config(head_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The head's transformer layer settings: top level in EAGLE checkpoints, under
    ``transformer_layer_config`` in the speculators format."""
    nested = head_config.get("transformer_layer_config")
    return nested if isinstance(nested, Mapping) else head_config


def _check_eagle_head(
    method: str, target_config: Mapping[str, Any], head_config: Mapping[str, Any]
) -> DraftCompatibility:
    target = text_config(target_config)
    layer = _eagle_layer_config(head_config)
    target_hidden, target_vocab = _int_field(target, "hidden_size"), _int_field(target, "vocab_size")
    head_vocab = _int_field(layer, "vocab_size")
    if method == _EAGLE3:
        consumed = _int_field(head_config, "target_hidden_size") or _int_field(layer, "target_hidden_size")
        consumed = consumed or _int_field(layer, "hidden_size")
        consumed_field = "target_hidden_size"
    else:
        consumed = _int_field(layer, "hidden_size")
        consumed_field = "hidden_size"
    problems, checked = [], []
    if target_hidden is not None and consumed is not None:
        checked.append("hidden size")
        if consumed != target_hidden:
            problems.append(
                f"the head's {consumed_field} is {consumed}, the target's hidden_size {target_hidden} "
                "(the head consumes the target's hidden states)"
            )
    if target_vocab is not None and head_vocab is not None:
        checked.append("vocab_size")
        if head_vocab != target_vocab:
            problems.append(
                f"the head's vocab_size is {head_vocab}, the target's {target_vocab} (the head "
                "embeds and predicts the target's token ids)"
            )
    if problems:
        return DraftCompatibility(
            "False",
            REASON_EAGLE_HEAD_MISMATCH,
            f"the {method} head was not trained for this target: " + "; ".join(problems),
            fix=f"pick the {method} head published for this target model",
        )
    if not checked:
        return DraftCompatibility(
            "Unknown", REASON_NOT_CHECKED, f"the {method} head's config has no hidden_size or vocab_size to compare"
        )
    matched = " and ".join(checked)
    return DraftCompatibility("True", REASON_VOCAB_SIZES_MATCH, f"the {method} head matches the target's {matched}")


def check_draft_compatibility(
    method: str,
    target_config: Mapping[str, Any],
    draft_config: Mapping[str, Any],
    *,
    use_heterogeneous_vocab: bool = False,
    vllm_version: str = C.DEFAULT_VLLM_VERSION,
    target_tokenizer: Optional[TokenizerInfo] = None,
    draft_tokenizer: Optional[TokenizerInfo] = None,
) -> DraftCompatibility:
    """Whether vLLM ``vllm_version`` can speculate with this draft for this target, from
    their Hugging Face ``config.json`` dicts (and tokenizer facts, where known). See the
    module docstring for what vLLM checks and what this adds."""
    if method == _DRAFT_MODEL:
        return _check_draft_model(
            target_config, draft_config, use_heterogeneous_vocab, vllm_version, target_tokenizer, draft_tokenizer
        )
    if method in (_EAGLE, _EAGLE3):
        return _check_eagle_head(method, target_config, draft_config)
    return DraftCompatibility("True", REASON_NO_DRAFT_MODEL, f"method {method} uses no separate draft model")


# ---------------------------------------------------------------------------------------------
# Reading configs from the model-cache volume (local files only)
# ---------------------------------------------------------------------------------------------


def _hub_cache_dir(model: str, cache_root: Path) -> Path:
    """huggingface_hub's cache folder of a repository: <HF_HOME>/hub/models--org--name."""
    return cache_root / "hub" / ("models--" + model.replace("/", "--"))


def _snapshot(repo_dir: Path, revision: Optional[str]) -> Optional[Path]:
    """The snapshot directory ``revision`` (branch, tag or commit; default main) resolves to
    in the cache. Without a matching ref, the only snapshot, or the most recently written one
    when several exist (a cache filled without refs, for example by copying)."""
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return None
    wanted = revision or "main"
    ref = repo_dir / "refs" / wanted
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
        if (snapshots / commit).is_dir():
            return snapshots / commit
    if (snapshots / wanted).is_dir():  # revision given as a commit hash
        return snapshots / wanted
    if revision is not None:
        return None  # a pinned revision that is not cached: another snapshot would mislead
    candidates = [p for p in snapshots.iterdir() if p.is_dir()]
    if not candidates:
        return None
    return max(candidates, key=lambda p: (p.stat().st_mtime, p.name))


def model_directory(
    model: str, cache_root: Path, *, revision: Optional[str] = None, mount_path: Optional[str] = None
) -> Optional[Path]:
    """Where ``model``'s files are on this machine, or None.

    An absolute path is used as is, or re-rooted under ``cache_root`` when it lies under
    ``mount_path`` (where the vLLM pods mount the same volume); anything else is a hub id,
    looked up in the Hugging Face cache layout under ``cache_root`` (the pods' HF_HOME).
    """
    if model.startswith("/"):
        candidates = [Path(model)]
        if mount_path:
            root = mount_path.rstrip("/")
            if model == root or model.startswith(root + "/"):
                candidates.insert(0, cache_root / model[len(root) :].lstrip("/"))
        return next((c for c in candidates if c.is_dir()), None)
    return _snapshot(_hub_cache_dir(model, cache_root), revision)


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_model_config(
    model: str, cache_root: Path, *, revision: Optional[str] = None, mount_path: Optional[str] = None
) -> Optional[dict[str, Any]]:
    """``model``'s config.json from a local path or the HF cache under ``cache_root``; None
    when it is not there or not readable JSON. Never downloads."""
    directory = model_directory(model, cache_root, revision=revision, mount_path=mount_path)
    return _read_json(directory / "config.json") if directory else None


def load_tokenizer_info(
    model: str, cache_root: Path, *, revision: Optional[str] = None, mount_path: Optional[str] = None
) -> TokenizerInfo:
    """The tokenizer facts found next to ``model``'s config: class from
    tokenizer_config.json, fingerprint from tokenizer.json; each None when absent."""
    directory = model_directory(model, cache_root, revision=revision, mount_path=mount_path)
    if directory is None:
        return TokenizerInfo()
    tokenizer_config = _read_json(directory / "tokenizer_config.json") or {}
    tokenizer_class = tokenizer_config.get("tokenizer_class")
    tokenizer_json = _read_json(directory / "tokenizer.json")
    return TokenizerInfo(
        tokenizer_class=tokenizer_class if isinstance(tokenizer_class, str) else None,
        vocab_fingerprint=vocab_fingerprint(tokenizer_json) if tokenizer_json else None,
    )


def preflight(spec: api.SpecDecodeServiceSpec, cache_root: Optional[Path] = None) -> DraftCompatibility:
    """DraftCompatible for ``spec``, from the configs on the model-cache volume.

    ``cache_root`` is where this process sees the volume (default: spec.modelCache.mountPath,
    as the vLLM pods see it). Unknown with reason ConfigsNotReachable when either config is
    not there: nothing is fetched from the hub.
    """
    s = spec.speculation
    if not s.needs_draft_model or s.draft_model is None:
        return check_draft_compatibility(s.method.value, {}, {})
    mount_path = spec.model_cache.mount_path
    root = cache_root if cache_root is not None else Path(mount_path)
    where = dict(mount_path=mount_path)
    target_config = load_model_config(spec.model.name, root, revision=spec.model.revision, **where)
    draft_config = load_model_config(s.draft_model, root, revision=s.draft_revision, **where)
    if target_config is None or draft_config is None:
        found = ((spec.model.name, target_config), (s.draft_model, draft_config))
        missing = [name for name, config in found if config is None]
        return DraftCompatibility(
            "Unknown",
            REASON_CONFIGS_NOT_REACHABLE,
            f"preflight skipped: configs not reachable (no config.json for {', '.join(missing)} "
            f"under {root} or at the given path)",
        )
    target_tokenizer = draft_tokenizer = None
    if s.method.value == _DRAFT_MODEL:
        target_tokenizer = load_tokenizer_info(spec.model.name, root, revision=spec.model.revision, **where)
        draft_tokenizer = load_tokenizer_info(s.draft_model, root, revision=s.draft_revision, **where)
    return check_draft_compatibility(
        s.method.value,
        target_config,
        draft_config,
        use_heterogeneous_vocab=s.use_heterogeneous_vocab,
        vllm_version=spec.engine.version,
        target_tokenizer=target_tokenizer,
        draft_tokenizer=draft_tokenizer,
    )
