#!/usr/bin/env bash
# On the GPU machine, from the repository root: stash the carried parts of the vLLM site
# (.gpu/*/site-*.tar.xz), unpack them into /root/site once all are there, and set the
# environment for vLLM. Source it:  . operator/specdecode/tools/gpu/device.sh [check]
# With `check`, import vLLM's serving path and print what is missing (no GPU work).
STASH=/root/stash
SITE=/root/site
mkdir -p "$STASH"
for f in .gpu/*/site-*.tar.xz .gpu/*/fix-*.tar.xz; do
  [ -f "$f" ] && { cmp -s "$f" "$STASH/$(basename "$f")" || cp "$f" "$STASH/"; }
done
echo "stash: $(ls "$STASH" 2>/dev/null | tr '\n' ' ')"
for part in "$STASH"/*.tar.xz; do
  [ -f "$part" ] || continue
  mark="$SITE/.unpacked-$(basename "$part")"
  if [ ! -f "$mark" ]; then
    t=$SECONDS
    if (set -o pipefail; xz -T0 -dc "$part" | tar -x -C /root); then
      mkdir -p "$SITE" && touch "$mark"
      echo "unpacked $(basename "$part") in $((SECONDS - t)) s"
    else
      echo "FAILED to unpack $(basename "$part")"
    fi
  fi
done
ls "$SITE"/.unpacked-* 2>/dev/null | sed 's|.*/.unpacked-|have: |'

export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_LOGGING_LEVEL=INFO
# flashinfer is not carried: without this the V2 model runner's sampler imports it and the engine dies
export VLLM_USE_FLASHINFER_SAMPLER=0

if [ "${1:-}" = "check" ]; then
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|triton|transformers|tokenizers|numba|numpy|protobuf|anyio|huggingface.hub|typing.extensions|aiohttp|prometheus.client|setuptools|uvloop|safetensors|psutil) '
  python3 - <<'EOF'
import importlib, time, traceback
t = time.time()
mods = ["vllm", "vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main",
        "vllm.entrypoints.cli.serve", "vllm.v1.engine.core", "vllm.v1.engine.async_llm",
        "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner",
        "vllm.model_executor.models.llama", "vllm.v1.spec_decode.draft_model",
        "vllm.v1.spec_decode.ngram_proposer", "vllm.v1.attention.backends.flash_attn",
        "vllm.model_executor.model_loader.dummy_loader", "vllm.v1.executor.multiproc_executor",
        "vllm.vllm_flash_attn"]
for m in mods:
    try:
        importlib.import_module(m)
        print("ok", m)
    except Exception as e:
        print("FAIL", m, repr(e)[:300])
        traceback.print_exc(limit=3)
import vllm
print("vllm", vllm.__version__, "import time %.1f s" % (time.time() - t))
EOF
fi
