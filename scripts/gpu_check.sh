#!/usr/bin/env bash
# What to run when a machine with CUDA GPUs is at hand: the GPU-marked tests (CUDA, NCCL, fp16), then a short
# slice of the exactness harness on NCCL ranks is part of them. Prints the GPUs first so the log names them.
#   bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
# On a GPU machine the CPU wheel would hide the GPUs: let the caller choose a CUDA torch (TORCH_SPEC), else PyPI's.
export TORCH_SPEC="${TORCH_SPEC:-torch>=2.4,<3}" FLODL_HF_VENV="${FLODL_HF_VENV:-.venv-gpu}"
exec bash scripts/test.sh -m gpu -v -rs
