#!/usr/bin/env bash
# make gpu-check: install the GPU path into its own environment, then run benchmarks/gpu_check.py, which compares
# recurlen's training step with mamba-ssm's own MambaLMHeadModel at the 130m and 780m shapes (tokens/s, peak memory,
# MFU), then runs the kernel-vs-torch agreement, make test-gpu, a 130m-shape post-training per intervention, a
# 128k-token evaluation and (with 2 GPUs) FSDP, as far as its 10-minute budget goes, and writes one JSON summary as
# it goes. Fails fast without a GPU; on a CPU, benchmarks/gpu_check.py --cpu-rehearsal rehearses the comparison.
#   GPU_VENV     the environment (default .venv-gpu; the CPU .venv is left alone)
#   GPU_TORCH    the torch requirement (default torch==2.13.0: PyPI's Linux wheel is the CUDA build)
#   MAMBA_SSM    the mamba-ssm version, built without its CUDA extensions (Mamba-2 needs only its Triton kernels)
#   CONV=1       also install causal-conv1d (compiles its CUDA extension unless a wheel matches; minutes)
#   ARGS         passed to benchmarks/gpu_check.py (e.g. ARGS=--quick)
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_VENV=${GPU_VENV:-.venv-gpu}
GPU_TORCH=${GPU_TORCH:-torch==2.13.0}
MAMBA_SSM=${MAMBA_SSM:-mamba-ssm==2.3.2.post1}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU found (nvidia-smi is missing or lists no device); this check needs a CUDA" \
       "machine. On a CPU: make test-kernels runs the kernel backend's tests under Triton's interpreter." >&2
  exit 2
fi
nvidia-smi -L

start=$(date +%s)
make --no-print-directory install VENV="$GPU_VENV" TORCH_CPU="$GPU_TORCH" EXTRAS=dev
PY="$GPU_VENV/bin/python"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)'; then
  echo "gpu-check: $GPU_VENV has torch $("$PY" -c 'import torch; print(torch.__version__)') without a usable CUDA;" \
       "set GPU_TORCH to a CUDA build of torch (and remove $GPU_VENV to reinstall)" >&2
  exit 2
fi
# triton comes with CUDA torch; mamba-ssm without its CUDA extensions installs in seconds (its MambaLMHeadModel
# imports without Mamba-1's CUDA extension: benchmarks/gpu_peer.py).
"$PY" -m pip install -q einops packaging
if ! "$PY" -c 'import mamba_ssm.ops.triton.ssd_combined' >/dev/null 2>&1; then
  MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE "$PY" -m pip install -q --no-build-isolation --no-deps "$MAMBA_SSM"
fi
if [ "${CONV:-0}" = "1" ]; then
  "$PY" -m pip install -q --no-build-isolation causal-conv1d || echo "gpu-check: causal-conv1d did not install;" \
       "the kernel backend uses the PyTorch conv" >&2
fi
echo "gpu-check: installed in $(( $(date +%s) - start )) s"
exec "$PY" benchmarks/gpu_check.py ${ARGS:-}
