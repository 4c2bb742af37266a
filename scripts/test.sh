#!/usr/bin/env bash
# The test suite: everything except GPU-only tests (the `gpu` marker), on CPU with real gloo ranks.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow and not gpu"` for the quick subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
venv="${FLODL_HF_VENV:-.venv}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-m "not gpu")
set +e
"$venv/bin/python" -m pytest "${args[@]}"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "flodl-hf: pytest collected no tests" >&2
  exit 1
fi
exit $rc
