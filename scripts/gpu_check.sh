#!/usr/bin/env bash
# What to run when a machine with CUDA GPUs is at hand, in one go (a few minutes on one GPU):
#   1. the GPU-marked tests (CUDA, bf16/fp16, and with 2+ GPUs NCCL windows, a vanished NCCL peer and a slice of
#      the exactness harness on NCCL ranks);
#   2. the main job on the embedded default on cuda:0, in fp32 and bf16 (time and held-out accuracy);
#   3. the single-device overhead benchmark on cuda:0 (setup-mode loop against plain PyTorch).
# Prints the GPUs first so the log names them.
#   bash scripts/gpu_check.sh
# Environment:
#   TORCH_SPEC        the torch requirement for the venv (default: PyPI's, which is a CUDA build)
#   FLODL_HF_PYTHON   use this interpreter as is instead of a venv (a machine with CUDA torch, transformers and
#                     pytest already installed and no package index), e.g. FLODL_HF_PYTHON=python3
#   GPU_CHECK_OUT     where the job outputs and the log go (default: a new temporary directory)
set -uo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
if [ -n "${FLODL_HF_PYTHON:-}" ]; then
  python="$FLODL_HF_PYTHON"
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
else
  export TORCH_SPEC="${TORCH_SPEC:-torch>=2.4,<3}" FLODL_HF_VENV="${FLODL_HF_VENV:-.venv-gpu}"
  bash scripts/bootstrap.sh test || exit 1
  python="$FLODL_HF_VENV/bin/python"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out="${GPU_CHECK_OUT:-$(mktemp -d)}"
mkdir -p "$out"
"$python" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'devices', torch.cuda.device_count(), '| transformers', transformers.__version__)"
failed=0

echo "== 1. GPU-marked tests"
"$python" -m pytest -m gpu -v -rs -p no:cacheprovider || failed=1

echo "== 2. the main job on the embedded default, cuda:0"
for precision in fp32 bf16; do
  start=$EPOCHREALTIME
  if "$python" -m flodl_hf train --devices cuda:0 --precision "$precision" --no-progress \
      --output-dir "$out/default-$precision" >"$out/default-$precision.log" 2>&1; then
    end=$EPOCHREALTIME
    "$python" - "$out/default-$precision/metrics.json" "$precision" "$start" "$end" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
flat = {k: v for k, v in m.items() if not isinstance(v, (dict, list))}
keys = [k for k in flat if any(w in k for w in ("accuracy", "f1", "time", "size", "steps", "devices"))]
print(f"default job {sys.argv[2]}: wall {float(sys.argv[4]) - float(sys.argv[3]):.1f} s |", ", ".join(f"{k}={flat[k]}" for k in keys))
PY
  else
    failed=1
    echo "default job $precision FAILED:"; tail -30 "$out/default-$precision.log"
  fi
done

echo "== 3. single-device overhead, cuda:0"
"$python" benchmarks/single_device_overhead.py --device cuda:0 --rounds 6 --steps 40 --batch-size 32 || failed=1
echo "gpu_check: $([ $failed = 0 ] && echo PASSED || echo FAILED)"
exit $failed
