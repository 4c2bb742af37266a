#!/usr/bin/env bash
# What to run when a machine with CUDA GPUs is at hand, in one go (a few minutes on one GPU):
#   1. the GPU-marked tests (CUDA, bf16/fp16, and with 2+ GPUs NCCL windows, a vanished NCCL peer and a slice of
#      the exactness harness on NCCL ranks);
#   2. the main job on the embedded default on cuda:0, in fp32, bf16 and fp16 (time and held-out accuracy);
#   3. the single-device overhead benchmark on cuda:0 (setup-mode loop against plain PyTorch);
#   4. bf16 throughput against transformers' Trainer on the same job (benchmarks/vs_hf_trainer.py);
#   5. the memory probe on the packaged MiniLM (benchmarks/memory_probe_check.py).
# Prints the GPUs first so the log names them, and writes everything to $GPU_CHECK_OUT/results.txt.
#   bash scripts/gpu_check.sh
# Environment:
#   TORCH_SPEC        the torch requirement for the venv (default: PyPI's, which is a CUDA build)
#   FLODL_HF_PYTHON   use this interpreter as is instead of a venv (a machine with CUDA torch, transformers and
#                     pytest already installed and no package index), e.g. FLODL_HF_PYTHON=python3
#   GPU_CHECK_OUT     where the job outputs and the log go (default: a new temporary directory)
#   GPU_CHECK_DEVICE  the device (default cuda:0); cpu runs the same steps on the CPU (GPU-only ones say skipped)
#   GPU_CHECK_SMALL=1 tiny sizes: what the test suite runs on the CPU (tests/e2e/project/test_gpu_check.py)
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
exec > >(tee "$out/results.txt") 2>&1
dev="${GPU_CHECK_DEVICE:-cuda:0}"
small="${GPU_CHECK_SMALL:-0}"
if [ "$small" = 1 ]; then
  rows=(--train-rows 64 --eval-rows 32 --max-length 32); overhead=(--rounds 2 --steps 6); versus=(--rounds 1 --train-rows 64 --eval-rows 32 --max-length 32)
  probe=(--high 8 --max-length 32)
else
  rows=(); overhead=(--rounds 6 --steps 40 --batch-size 32); versus=(--rounds 1 --train-rows 2000 --eval-rows 500)
  probe=(--high 4096 --max-length 256)
fi
"$python" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'devices', torch.cuda.device_count(), '| transformers', transformers.__version__)"
failed=0

echo "== 1. GPU-marked tests"
if [ "$dev" = cpu ]; then
  echo "skipped: GPU_CHECK_DEVICE=cpu"
else
  "$python" -m pytest -m gpu -v -rs -p no:cacheprovider || failed=1
fi

echo "== 2. the main job on the embedded default, $dev"
precisions=(fp32 bf16 fp16)
[ "$dev" = cpu ] && precisions=(fp32 bf16)  # fp16 loss scaling is a CUDA path
for precision in "${precisions[@]}"; do
  start=$EPOCHREALTIME
  if "$python" -m flodl_hf train --devices "$dev" --precision "$precision" --no-progress "${rows[@]}" \
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

echo "== 3. single-device overhead, $dev"
"$python" benchmarks/single_device_overhead.py --device "$dev" "${overhead[@]}" || failed=1

echo "== 4. flodl-hf train against transformers' Trainer, $dev"
vprec=bf16
[ "$dev" = cpu ] && vprec=fp32
"$python" benchmarks/vs_hf_trainer.py --device "$dev" --precision "$vprec" "${versus[@]}" || failed=1

echo "== 5. memory probe, $dev"
"$python" benchmarks/memory_probe_check.py --device "$dev" "${probe[@]}" || failed=1

echo "gpu_check: $([ $failed = 0 ] && echo PASSED || echo FAILED) (results: $out/results.txt)"
exit $failed
