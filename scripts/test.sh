#!/usr/bin/env bash
# The test suite: everything except GPU-only tests (the `gpu` marker), on CPU with real gloo ranks.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit` for the unit tier (tests/distributed,
# tests/e2e: the other two tiers).
# `bash scripts/test.sh --latest [pytest args]`: the same suite against the newest releases pyproject.toml admits
# (its own environment, .venv-latest) instead of the tested versions in constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --latest ]; then
  shift
  export FLODL_HF_LATEST=1
fi
bash scripts/bootstrap.sh test
if [ "${FLODL_HF_LATEST:-0}" = 1 ]; then venv="${FLODL_HF_VENV:-.venv-latest}"; else venv="${FLODL_HF_VENV:-.venv}"; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# GPU-only tests run only when a marker expression names them (`-m gpu`); any other `-m EXPR` becomes
# `-m "(EXPR) and not gpu"`, and no `-m` at all adds `-m "not gpu"`.
args=()
marked=0
while [ $# -gt 0 ]; do
  if [ "$1" = -m ] && [ $# -ge 2 ]; then
    marked=1
    case "$2" in *gpu*) args+=(-m "$2") ;; *) args+=(-m "($2) and not gpu") ;; esac
    shift 2
  else
    args+=("$1")
    shift
  fi
done
[ $marked = 1 ] || args+=(-m "not gpu")
# matplotlib builds its font cache on first use by running fc-list, a process start that the unit tier refuses
# (tests/conftest.py): on a machine that has never run it, build the cache here, outside any test
MPLBACKEND=Agg "$venv/bin/python" -c "import matplotlib.font_manager" >/dev/null 2>&1 || true
set +e
"$venv/bin/python" -m pytest "${args[@]}"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "flodl-hf: pytest collected no tests" >&2
  exit 1
fi
exit $rc
