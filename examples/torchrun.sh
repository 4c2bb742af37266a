#!/usr/bin/env bash
# Two ranks on this machine under torchrun (GPUs if present: NCCL; otherwise CPU ranks over gloo).
# The training script is the unchanged README quickstart loop.
set -euo pipefail
cd "$(dirname "$0")/.."
exec torchrun --nproc-per-node "${NPROC:-2}" examples/quickstart.py "$@"
