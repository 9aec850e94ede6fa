#!/usr/bin/env bash
# Here (with registry access), from the repository root: build the two archives that carry
# vLLM 0.26.0 and its missing dependencies to the GPU machine, in .gpu/a and .gpu/b (add
# `/.gpu/` to .git/info/exclude). About 10 minutes on 2 cores, most of it xz.
set -euo pipefail
W=${W:-/tmp/gpuw}
ROOT=$(pwd)
P="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
mkdir -p "$W/vllm" "$W/deps" "$W/fix" "$ROOT/.gpu/a" "$ROOT/.gpu/b"
python3 -m pip download --no-deps $P -d "$W/vllm" vllm==0.26.0
# missing from the GPU image, imported by the serving path (README.md says how they were found)
python3 -m pip download $P -d "$W/deps" cachetools cbor2 blake3 depyf==0.20.0 \
  'fastapi<0.137.0,>=0.133.0' 'starlette>=1.0.1' 'pydantic>=2.12.0' 'openai>=2.0.0' \
  'openai-harmony>=0.0.3' partial-json-parser pybase64 msgspec 'pyzmq>=25.0.0' uvicorn watchfiles \
  'model-hosting-container-standards<1.0.0,>=0.1.14' setproctitle \
  'prometheus-fastapi-instrumentator>=8.0.0' python-json-logger nvtx==0.2.15 ijson
python3 -m pip download --no-deps $P -d "$W/deps" python-multipart
# small extras carried in case a lazy import is reached (structured output, quantization registry)
python3 -m pip download $P -d "$W/fix" jsonschema
python3 -m pip download --no-deps $P -d "$W/fix" compressed-tensors==0.17.0 lm-format-enforcer==0.11.3 \
  outlines_core==0.2.14 lark==1.2.2 interegular
# structured-output backends: vllm.v1.structured_output imports backend_guidance / backend_xgrammar,
# whose dataclass annotations (llguidance.LLMatcher, xgr.GrammarMatcher) load the lazy modules at
# import time, so the serving path dies without them (seen on the GPU, 7 December): .gpu/c/fix-c.tar.xz
mkdir -p "$W/fixc" "$ROOT/.gpu/c"
python3 -m pip download --no-deps $P --abi abi3 --platform manylinux_2_27_x86_64 --platform manylinux_2_31_x86_64 \
  -d "$W/fixc" 'llguidance>=1.7.0,<1.8.0' xgrammar==0.2.9 'apache-tvm-ffi>=0.1.11'
rm -rf "$W/site" "$W/fixsite" && mkdir -p "$W/site" "$W/fixsite/site"
unzip -q -o "$W"/vllm/vllm-0.26.0-*.whl -d "$W/site"
for w in "$W"/deps/*.whl; do
  case $(basename "$w") in  # the image has these
    annotated_doc*|click-*|h11-*|prometheus_client*|httpx-0*|httpcore-1*|setuptools-*|idna-*|certifi-*) continue;;
  esac
  unzip -q -o "$w" -d "$W/site"
done
for w in "$W"/fix/*.whl; do
  case $(basename "$w") in attrs-*|typing_extensions*) continue;; esac
  unzip -q -o "$w" -d "$W/fixsite/site"
done
cd "$W/site"
rm -rf bin vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs vllm/_moe_C_stable_libtorch.abi3.so \
  vllm/third_party/deep_gemm/include vllm/third_party/fmha_sm100/cutlass vllm/third_party/fmha_sm100/csrc \
  vllm/third_party/deep_gemm/_C.cpython-31[01345]-x86_64-linux-gnu.so
find . -name __pycache__ -prune -exec rm -rf {} +
cd "$W"
tar -cf - --exclude=site/vllm/_C_stable_libtorch.abi3.so site | xz -T0 -7 > "$ROOT/.gpu/a/site-a.tar.xz"
tar -cf - site/vllm/_C_stable_libtorch.abi3.so | xz -T0 -6 > "$ROOT/.gpu/b/site-b.tar.xz"
tar -C "$W/fixsite" -cf - site | xz -T0 -6 > "$ROOT/.gpu/b/fix-extra.tar.xz"
rm -rf "$W/fixcsite" && mkdir -p "$W/fixcsite/site"
for w in "$W"/fixc/*.whl; do unzip -q -o "$w" -d "$W/fixcsite/site"; done
tar -C "$W/fixcsite" -cf - site | xz -T0 -6 > "$ROOT/.gpu/c/fix-c.tar.xz"
ls -la "$ROOT"/.gpu/a "$ROOT"/.gpu/b "$ROOT"/.gpu/c
